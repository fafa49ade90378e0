/* json.c - the bounded JSON reader and writer of json.h.
 *
 * The parser is recursive descent over the text with an explicit depth
 * limit; it appends one token per value (keys included) to an array it
 * grows by doubling up to max_tokens, and patches a container's `next`
 * and length once its closing bracket is seen. Errors name the byte
 * offset. Nothing is unescaped at parse time: strings are checked
 * (escapes well formed, no raw control bytes) and kept as spans. */
#include "json.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- reader ---- */

typedef struct {
  const char *s;
  size_t len, pos;
  embps_json_tok_t *tok;
  uint32_t n, cap, max;
  char *err;
  size_t err_len;
} parser_t;

static int fail(parser_t *p, const char *what) {
  snprintf(p->err, p->err_len, "JSON at byte %zu: %s", p->pos, what);
  return -1;
}

static void skip_ws(parser_t *p) {
  while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
                             p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
    p->pos++;
}

/* A new token of type at the current position: its index, or -1. */
static int new_tok(parser_t *p, embps_json_type_t type) {
  if (p->n == p->max)
    return fail(p, "more values than the limit");
  if (p->n == p->cap) {
    uint32_t cap = p->cap ? p->cap * 2 : 16;
    if (cap > p->max)
      cap = p->max;
    embps_json_tok_t *t = realloc(p->tok, (size_t)cap * sizeof *t);
    if (!t)
      return fail(p, "out of memory");
    p->tok = t;
    p->cap = cap;
  }
  embps_json_tok_t *t = &p->tok[p->n];
  memset(t, 0, sizeof *t);
  t->type = (uint8_t)type;
  t->start = (uint32_t)p->pos;
  return (int)p->n++;
}

static int hex4(const char *s, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = s[i];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f')
      v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      v |= (unsigned)(c - 'A' + 10);
    else
      return -1;
  }
  *out = v;
  return 0;
}

static int parse_string(parser_t *p) {
  p->pos++; /* the opening quote */
  int t = new_tok(p, EMBPS_JSON_STRING);
  if (t < 0)
    return -1;
  while (p->pos < p->len) {
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c == '"') {
      p->tok[t].len = (uint32_t)(p->pos - p->tok[t].start);
      p->pos++;
      p->tok[t].next = p->n;
      return 0;
    }
    if (c < 0x20)
      return fail(p, "control byte in a string");
    if (c == '\\') {
      if (p->pos + 1 >= p->len)
        break;
      char e = p->s[p->pos + 1];
      if (e == 'u') {
        unsigned v;
        if (p->pos + 6 > p->len || hex4(p->s + p->pos + 2, &v))
          return fail(p, "bad \\u escape");
        p->pos += 6;
        continue;
      }
      if (!strchr("\"\\/bfnrt", e) || !e)
        return fail(p, "bad escape");
      p->pos += 2;
      continue;
    }
    p->pos++;
  }
  return fail(p, "unterminated string");
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int parse_number(parser_t *p) {
  int t = new_tok(p, EMBPS_JSON_NUMBER);
  if (t < 0)
    return -1;
  size_t i = p->pos;
  if (i < p->len && p->s[i] == '-')
    i++;
  if (i >= p->len || !is_digit(p->s[i]))
    return fail(p, "bad number");
  if (p->s[i] == '0')
    i++;
  else
    while (i < p->len && is_digit(p->s[i]))
      i++;
  if (i < p->len && p->s[i] == '.') {
    i++;
    if (i >= p->len || !is_digit(p->s[i]))
      return fail(p, "bad number");
    while (i < p->len && is_digit(p->s[i]))
      i++;
  }
  if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
    i++;
    if (i < p->len && (p->s[i] == '+' || p->s[i] == '-'))
      i++;
    if (i >= p->len || !is_digit(p->s[i]))
      return fail(p, "bad number");
    while (i < p->len && is_digit(p->s[i]))
      i++;
  }
  p->tok[t].len = (uint32_t)(i - p->pos);
  p->pos = i;
  p->tok[t].next = p->n;
  return 0;
}

static int parse_literal(parser_t *p, const char *word, embps_json_type_t type) {
  size_t n = strlen(word);
  if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n))
    return fail(p, "unexpected character");
  int t = new_tok(p, type);
  if (t < 0)
    return -1;
  p->tok[t].len = (uint32_t)n;
  p->pos += n;
  p->tok[t].next = p->n;
  return 0;
}

static int parse_value(parser_t *p, int depth);

/* An object or array at p->pos (its opening bracket). */
static int parse_container(parser_t *p, int depth, int object) {
  if (depth >= EMBPS_JSON_DEPTH_MAX)
    return fail(p, "nested too deep");
  int t = new_tok(p, object ? EMBPS_JSON_OBJECT : EMBPS_JSON_ARRAY);
  if (t < 0)
    return -1;
  const char close = object ? '}' : ']';
  p->pos++;
  skip_ws(p);
  uint32_t n = 0;
  if (p->pos < p->len && p->s[p->pos] == close) {
    p->pos++;
  } else {
    for (;;) {
      skip_ws(p);
      if (object) {
        if (p->pos >= p->len || p->s[p->pos] != '"')
          return fail(p, "expected a member name");
        if (parse_string(p))
          return -1;
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != ':')
          return fail(p, "expected ':'");
        p->pos++;
        skip_ws(p);
      }
      if (parse_value(p, depth + 1))
        return -1;
      n++;
      skip_ws(p);
      if (p->pos >= p->len)
        return fail(p, "unterminated container");
      if (p->s[p->pos] == ',') {
        p->pos++;
        continue;
      }
      if (p->s[p->pos] == close) {
        p->pos++;
        break;
      }
      return fail(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
  }
  p->tok[t].len = (uint32_t)(p->pos - p->tok[t].start);
  p->tok[t].n = n;
  p->tok[t].next = p->n;
  return 0;
}

static int parse_value(parser_t *p, int depth) {
  skip_ws(p);
  if (p->pos >= p->len)
    return fail(p, "expected a value");
  switch (p->s[p->pos]) {
  case '{':
    return parse_container(p, depth, 1);
  case '[':
    return parse_container(p, depth, 0);
  case '"':
    return parse_string(p);
  case 't':
    return parse_literal(p, "true", EMBPS_JSON_BOOL);
  case 'f':
    return parse_literal(p, "false", EMBPS_JSON_BOOL);
  case 'n':
    return parse_literal(p, "null", EMBPS_JSON_NULL);
  default:
    return parse_number(p);
  }
}

int embps_json_parse(embps_json_t *doc, const char *text, size_t len,
                     size_t max_tokens, char *err, size_t err_len) {
  memset(doc, 0, sizeof *doc);
  parser_t p = {.s = text, .len = len, .err = err, .err_len = err_len};
  if (len >= (1u << 31) || max_tokens >= (1u << 31) || !max_tokens) {
    snprintf(err, err_len, "JSON of %zu bytes (or %zu tokens) out of bounds",
             len, max_tokens);
    return -1;
  }
  p.max = (uint32_t)max_tokens;
  if (parse_value(&p, 0) == 0) {
    skip_ws(&p);
    if (p.pos == p.len) {
      doc->text = text;
      doc->tok = p.tok;
      doc->n_tok = p.n;
      return 0;
    }
    fail(&p, "text after the value");
  }
  free(p.tok);
  return -1;
}

void embps_json_free(embps_json_t *doc) {
  free(doc->tok);
  memset(doc, 0, sizeof *doc);
}

static int valid(const embps_json_t *d, int i, embps_json_type_t type) {
  return i >= 0 && (uint32_t)i < d->n_tok && d->tok[i].type == type;
}

int embps_json_eq(const embps_json_t *d, int i, const char *s) {
  if (!valid(d, i, EMBPS_JSON_STRING))
    return 0;
  size_t n = strlen(s);
  return d->tok[i].len == n && !memcmp(d->text + d->tok[i].start, s, n);
}

int embps_json_get(const embps_json_t *d, int obj, const char *key) {
  if (!valid(d, obj, EMBPS_JSON_OBJECT))
    return -1;
  int k = obj + 1;
  for (uint32_t m = 0; m < d->tok[obj].n; m++) {
    int v = (int)d->tok[k].next; /* a key has no subtree: v = k + 1 */
    if (embps_json_eq(d, k, key))
      return v;
    k = (int)d->tok[v].next;
  }
  return -1;
}

int embps_json_first(const embps_json_t *d, int arr) {
  if (!valid(d, arr, EMBPS_JSON_ARRAY) || !d->tok[arr].n)
    return -1;
  return arr + 1;
}

int embps_json_next(const embps_json_t *d, int arr, int i) {
  if (!valid(d, arr, EMBPS_JSON_ARRAY) || i <= arr)
    return -1;
  uint32_t nx = d->tok[i].next;
  return nx < d->tok[arr].next ? (int)nx : -1;
}

/* Digits of s[0, n) (an optional '-', then 1..19 digits) as int64. */
static int parse_int64(const char *s, size_t n, int64_t *out) {
  int neg = n && s[0] == '-';
  size_t i = (size_t)neg;
  if (i >= n || n - i > 19)
    return -1;
  uint64_t v = 0;
  for (; i < n; i++) {
    if (!is_digit(s[i]))
      return -1;
    v = v * 10 + (uint64_t)(s[i] - '0'); /* 19 digits fit in uint64 */
  }
  if (neg ? v > (uint64_t)INT64_MAX + 1 : v > (uint64_t)INT64_MAX)
    return -1;
  *out = neg ? (int64_t)(0 - v) : (int64_t)v;
  return 0;
}

int embps_json_int64(const embps_json_t *d, int i, int64_t *out) {
  if (!valid(d, i, EMBPS_JSON_NUMBER) && !valid(d, i, EMBPS_JSON_STRING))
    return -1;
  return parse_int64(d->text + d->tok[i].start, d->tok[i].len, out);
}

int embps_json_bool(const embps_json_t *d, int i, int *out) {
  if (!valid(d, i, EMBPS_JSON_BOOL))
    return -1;
  *out = d->text[d->tok[i].start] == 't';
  return 0;
}

/* Appends code point cp as UTF-8 to out at *n (cap bytes). */
static int put_utf8(char *out, size_t cap, size_t *n, unsigned cp) {
  char b[4];
  size_t k;
  if (cp < 0x80) {
    b[0] = (char)cp;
    k = 1;
  } else if (cp < 0x800) {
    b[0] = (char)(0xc0 | (cp >> 6));
    b[1] = (char)(0x80 | (cp & 0x3f));
    k = 2;
  } else if (cp < 0x10000) {
    b[0] = (char)(0xe0 | (cp >> 12));
    b[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    b[2] = (char)(0x80 | (cp & 0x3f));
    k = 3;
  } else {
    b[0] = (char)(0xf0 | (cp >> 18));
    b[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    b[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    b[3] = (char)(0x80 | (cp & 0x3f));
    k = 4;
  }
  if (cap - *n < k + 1)
    return -1;
  memcpy(out + *n, b, k);
  *n += k;
  return 0;
}

int embps_json_string(const embps_json_t *d, int i, char *out, size_t cap,
                      size_t *len) {
  if (!valid(d, i, EMBPS_JSON_STRING) || !cap)
    return -1;
  const char *s = d->text + d->tok[i].start;
  const size_t n_in = d->tok[i].len;
  size_t n = 0;
  for (size_t k = 0; k < n_in;) { /* escapes were checked by the parser */
    char c = s[k];
    if (c != '\\') {
      if (cap - n < 2)
        return -1;
      out[n++] = c;
      k++;
      continue;
    }
    char e = s[k + 1];
    k += 2;
    unsigned cp;
    switch (e) {
    case 'b': cp = '\b'; break;
    case 'f': cp = '\f'; break;
    case 'n': cp = '\n'; break;
    case 'r': cp = '\r'; break;
    case 't': cp = '\t'; break;
    case 'u':
      if (hex4(s + k, &cp)) /* checked by the parser: never here */
        return -1;
      k += 4;
      if (cp >= 0xd800 && cp < 0xdc00) { /* a high surrogate: a pair? */
        unsigned lo;
        if (k + 6 > n_in || s[k] != '\\' || s[k + 1] != 'u' ||
            hex4(s + k + 2, &lo) || lo < 0xdc00 || lo >= 0xe000)
          return -1;
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        k += 6;
      } else if (cp >= 0xdc00 && cp < 0xe000) {
        return -1; /* a lone low surrogate */
      }
      if (!cp)
        return -1; /* a NUL would cut the C string */
      break;
    default: cp = (unsigned char)e; break; /* " \ / */
    }
    if (put_utf8(out, cap, &n, cp))
      return -1;
  }
  out[n] = 0;
  if (len)
    *len = n;
  return 0;
}

static int b64_value(char c) {
  if (c >= 'A' && c <= 'Z')
    return c - 'A';
  if (c >= 'a' && c <= 'z')
    return c - 'a' + 26;
  if (c >= '0' && c <= '9')
    return c - '0' + 52;
  if (c == '+')
    return 62;
  if (c == '/')
    return 63;
  return -1;
}

int embps_json_base64(const embps_json_t *d, int i, uint8_t *out, size_t cap,
                      size_t *len) {
  if (!valid(d, i, EMBPS_JSON_STRING))
    return -1;
  const char *s = d->text + d->tok[i].start;
  const size_t n_in = d->tok[i].len;
  if (n_in % 4)
    return -1;
  size_t n = 0;
  for (size_t k = 0; k < n_in; k += 4) {
    int v[4], pad = 0;
    for (int j = 0; j < 4; j++) {
      if (s[k + j] == '=' && k + 4 == n_in && j >= 2) {
        v[j] = 0;
        pad++;
        continue;
      }
      if (pad || (v[j] = b64_value(s[k + j])) < 0)
        return -1; /* a character after '=', or not base64 */
    }
    uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 |
                 (uint32_t)v[2] << 6 | (uint32_t)v[3];
    size_t k_out = 3 - (size_t)pad;
    /* bits that padding drops must be zero (canonical) */
    if ((pad == 1 && (w & 0xff)) || (pad == 2 && (w & 0xffff)))
      return -1;
    if (cap - n < k_out)
      return -1;
    const uint8_t b[3] = {(uint8_t)(w >> 16), (uint8_t)(w >> 8), (uint8_t)w};
    memcpy(out + n, b, k_out);
    n += k_out;
  }
  *len = n;
  return 0;
}

long embps_json_frame(const char *buf, size_t len) {
  size_t i = 0;
  while (i < len && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n' ||
                     buf[i] == '\r'))
    i++;
  if (i == len)
    return 0;
  if (buf[i] != '{')
    return -1;
  int depth = 0, in_str = 0;
  for (; i < len; i++) {
    char c = buf[i];
    if (in_str) {
      if (c == '\\')
        i++; /* the escaped byte (past the end: incomplete) */
      else if (c == '"')
        in_str = 0;
      continue;
    }
    if (c == '"') {
      in_str = 1;
    } else if (c == '{' || c == '[') {
      if (++depth > EMBPS_JSON_DEPTH_MAX)
        return -1;
    } else if (c == '}' || c == ']') {
      if (--depth == 0)
        return (long)(i + 1);
    }
  }
  return 0;
}

/* ---- writer ---- */

void embps_jw_init(embps_jw_t *w, size_t max) {
  memset(w, 0, sizeof *w);
  w->max = max;
  w->first[0] = 1;
}

void embps_jw_close(embps_jw_t *w) {
  free(w->buf);
  w->buf = NULL;
  w->len = w->cap = 0;
}

static void put(embps_jw_t *w, const char *s, size_t n) {
  if (w->overflow || (!n && w->buf))
    return;
  if (n > w->max - w->len || w->max - w->len - n < 1) { /* + the NUL */
    w->overflow = 1;
    return;
  }
  if (w->len + n + 1 > w->cap) {
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + n + 1)
      cap *= 2;
    if (cap > w->max)
      cap = w->max;
    char *b = realloc(w->buf, cap);
    if (!b) {
      w->overflow = 1;
      return;
    }
    w->buf = b;
    w->cap = cap;
  }
  if (n)
    memcpy(w->buf + w->len, s, n);
  w->len += n;
  w->buf[w->len] = 0;
}

/* Before a value (or a key): the comma it needs. */
static void sep(embps_jw_t *w) {
  if (w->after_key) {
    w->after_key = 0;
    return;
  }
  if (!w->first[w->depth])
    put(w, ",", 1);
  w->first[w->depth] = 0;
}

static void jw_open(embps_jw_t *w, char c) {
  sep(w);
  put(w, &c, 1);
  if (w->depth + 1 >= EMBPS_JSON_DEPTH_MAX) {
    w->overflow = 1;
    return;
  }
  w->first[++w->depth] = 1;
}

static void jw_close(embps_jw_t *w, char c) {
  if (w->depth == 0 || w->after_key) {
    w->overflow = 1;
    return;
  }
  w->depth--;
  put(w, &c, 1);
}

void embps_jw_obj(embps_jw_t *w) { jw_open(w, '{'); }
void embps_jw_obj_end(embps_jw_t *w) { jw_close(w, '}'); }
void embps_jw_arr(embps_jw_t *w) { jw_open(w, '['); }
void embps_jw_arr_end(embps_jw_t *w) { jw_close(w, ']'); }

static void put_escaped(embps_jw_t *w, const char *s, size_t len) {
  put(w, "\"", 1);
  size_t run = 0; /* bytes copied as they are, pending */
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c != '"' && c != '\\') {
      run++;
      continue;
    }
    put(w, s + i - run, run);
    run = 0;
    char esc[8];
    if (c == '"' || c == '\\')
      snprintf(esc, sizeof esc, "\\%c", c);
    else
      snprintf(esc, sizeof esc, "\\u%04x", c);
    put(w, esc, strlen(esc));
  }
  put(w, s + len - run, run);
  put(w, "\"", 1);
}

void embps_jw_key(embps_jw_t *w, const char *key) {
  if (w->after_key) {
    w->overflow = 1;
    return;
  }
  sep(w);
  put_escaped(w, key, strlen(key));
  put(w, ":", 1);
  w->after_key = 1;
}

void embps_jw_str(embps_jw_t *w, const char *s, size_t len) {
  sep(w);
  put_escaped(w, s, len);
}

void embps_jw_int64(embps_jw_t *w, int64_t v) {
  char b[32];
  int n = snprintf(b, sizeof b, "\"%" PRId64 "\"", v);
  sep(w);
  put(w, b, (size_t)n);
}

void embps_jw_bool(embps_jw_t *w, int v) {
  sep(w);
  put(w, v ? "true" : "false", v ? 4 : 5);
}

void embps_jw_base64(embps_jw_t *w, const void *p, size_t len) {
  static const char A[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const uint8_t *b = p;
  sep(w);
  put(w, "\"", 1);
  for (size_t i = 0; i < len; i += 3) {
    uint32_t v = (uint32_t)b[i] << 16;
    if (i + 1 < len)
      v |= (uint32_t)b[i + 1] << 8;
    if (i + 2 < len)
      v |= b[i + 2];
    char q[4] = {A[v >> 18], A[(v >> 12) & 63],
                 i + 1 < len ? A[(v >> 6) & 63] : '=',
                 i + 2 < len ? A[v & 63] : '='};
    put(w, q, 4);
  }
  put(w, "\"", 1);
}

int embps_jw_finish(embps_jw_t *w, char **out, size_t *len) {
  if (w->overflow || w->depth || w->after_key || !w->buf) {
    embps_jw_close(w);
    return -1;
  }
  *out = w->buf;
  *len = w->len;
  w->buf = NULL;
  embps_jw_close(w);
  return 0;
}
