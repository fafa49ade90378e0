/* json.h - a small, bounded JSON reader and writer for exactly what
 * etcd's v3 HTTP gateway speaks (etcd.c): objects, arrays, strings,
 * integers, booleans; proto3's JSON mapping writes int64 fields as
 * strings and bytes fields as base64 strings, and leaves out fields at
 * their zero value.
 *
 * Reader: embps_json_parse checks a whole document and lays it out as a
 * flat array of tokens in document order (as jsmn does): each token knows
 * its span in the text and the index of the token after its subtree, so
 * looking up a member or walking an array is a scan with no allocation.
 * Strings stay escaped in the text until a getter copies them out. Every
 * size is bounded before anything is allocated: the text by the caller,
 * the tokens by max_tokens, the nesting by EMBPS_JSON_DEPTH_MAX.
 *
 * Writer: appends to a buffer it grows up to a fixed cap; commas between
 * members and elements are its business. An overflow is remembered and
 * reported once, by embps_jw_finish.
 *
 * embps_json_frame finds the end of the next object in a stream (a
 * watch's response is one JSON object per message). */
#ifndef EMBPS_JSON_H
#define EMBPS_JSON_H
#include <stddef.h>
#include <stdint.h>

#define EMBPS_JSON_DEPTH_MAX 32

typedef enum {
  EMBPS_JSON_NULL,
  EMBPS_JSON_BOOL,
  EMBPS_JSON_NUMBER,
  EMBPS_JSON_STRING,
  EMBPS_JSON_ARRAY,
  EMBPS_JSON_OBJECT
} embps_json_type_t;

typedef struct {
  uint8_t type;   /* embps_json_type_t */
  uint32_t start; /* strings: first byte after the quote; others: first byte */
  uint32_t len;   /* strings: bytes between the quotes; containers: up to
                     and including the closing bracket */
  uint32_t next;  /* index of the token after this value and its subtree */
  uint32_t n;     /* containers: members (objects) or elements (arrays) */
} embps_json_tok_t;

/* A parsed document: tok[0] is the root value. An object's children are
 * its members, each a key (a string token) followed by its value. */
typedef struct {
  const char *text; /* not owned: must outlive the document */
  embps_json_tok_t *tok;
  uint32_t n_tok;
} embps_json_t;

/* Parses text[0, len) as one JSON value (whitespace around it allowed)
 * into at most max_tokens tokens (len and max_tokens below 2^31). 0, or
 * -1 with err naming the byte offset and what is wrong (doc then holds
 * nothing). doc->tok is malloc'd: embps_json_free. */
int embps_json_parse(embps_json_t *doc, const char *text, size_t len,
                     size_t max_tokens, char *err, size_t err_len);
void embps_json_free(embps_json_t *doc);

/* The value of member key of the object at token obj: its token index, or
 * -1 (obj is no object, or has no such member: proto3 leaves zero values
 * out). Keys are compared as written (no unescaping): etcd's are plain. */
int embps_json_get(const embps_json_t *d, int obj, const char *key);
/* The first element of the array at token arr (-1: none, or no array);
 * the one after element i: embps_json_next (-1 past the last). */
int embps_json_first(const embps_json_t *d, int arr);
int embps_json_next(const embps_json_t *d, int arr, int i);

/* Getters: 0, or -1 when the token (-1 allowed: absent) is not of the
 * kind asked for. */
/* An integer written as a number (no fraction or exponent) or a string
 * holding one (proto3's int64), within int64_t. */
int embps_json_int64(const embps_json_t *d, int i, int64_t *out);
int embps_json_bool(const embps_json_t *d, int i, int *out);
/* A string's unescaped bytes (\uXXXX as UTF-8, surrogate pairs joined)
 * into out (cap bytes, NUL-terminated); *len (may be NULL) gets their
 * length. -1 also when they do not fit or hold a NUL. */
int embps_json_string(const embps_json_t *d, int i, char *out, size_t cap,
                      size_t *len);
/* A string holding standard base64 (padded), decoded into out (cap
 * bytes); *len gets the length. -1 also when it does not fit or is not
 * base64. */
int embps_json_base64(const embps_json_t *d, int i, uint8_t *out, size_t cap,
                      size_t *len);
/* Whether string token i equals s exactly (as written). */
int embps_json_eq(const embps_json_t *d, int i, const char *s);

/* Streams: the length of the first whole object in buf[0, len) after any
 * whitespace (what to hand to embps_json_parse, whitespace included), 0
 * when it is not complete yet, -1 when buf does not start with an object
 * (after whitespace) or nests deeper than EMBPS_JSON_DEPTH_MAX. Only
 * brackets and strings are looked at: parse the object to check it. */
long embps_json_frame(const char *buf, size_t len);

/* ---- writer ---- */
typedef struct {
  char *buf;
  size_t len, cap, max;
  int overflow;
  int depth;
  uint8_t first[EMBPS_JSON_DEPTH_MAX]; /* at each level: nothing written yet */
  int after_key;
} embps_jw_t;

/* An empty writer that will hold at most max bytes. */
void embps_jw_init(embps_jw_t *w, size_t max);
/* Frees the buffer (embps_jw_finish hands it over instead). */
void embps_jw_close(embps_jw_t *w);
void embps_jw_obj(embps_jw_t *w);
void embps_jw_obj_end(embps_jw_t *w);
void embps_jw_arr(embps_jw_t *w);
void embps_jw_arr_end(embps_jw_t *w);
void embps_jw_key(embps_jw_t *w, const char *key);
void embps_jw_str(embps_jw_t *w, const char *s, size_t len);
/* proto3's int64: a string holding the decimal value. */
void embps_jw_int64(embps_jw_t *w, int64_t v);
void embps_jw_bool(embps_jw_t *w, int v);
/* proto3's bytes: a base64 string. */
void embps_jw_base64(embps_jw_t *w, const void *p, size_t len);
/* The document: *out (malloc'd, NUL-terminated, the caller frees) and
 * *len. 0, or -1 when it outgrew max, was left unbalanced or memory ran
 * out (nothing to free then). The writer is closed either way. */
int embps_jw_finish(embps_jw_t *w, char **out, size_t *len);

/* Base64 (standard alphabet, padded): the encoded length of n bytes. */
static inline size_t embps_base64_len(size_t n) { return (n + 2) / 3 * 4; }
#endif
