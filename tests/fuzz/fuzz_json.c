/* fuzz_json.c - libFuzzer target: the bounded JSON reader and writer
 * (server/json.c) that read etcd's answers.
 *
 * Input: one byte of set-up (the token limit: 1 << (b % 12)), then the
 * text. Invariants:
 *   - embps_json_frame never claims more bytes than it was given, and an
 *     object the parser accepts whole is framed at exactly its length (or
 *     later whitespace does not matter);
 *   - a parsed document's tokens are in bounds: every span inside the
 *     text, every `next` after its token and within the document, every
 *     container's children counted right;
 *   - every getter on every token stays within its output buffer (each
 *     an exact-size allocation, so ASan sees an overrun), and what a
 *     string or base64 getter returns, written again by the writer and
 *     parsed back, reads the same;
 *   - parsing is all or nothing: a refused text leaves no tokens. */
#include "fuzz.h"
#include "json.h"

static void check_tokens(const embps_json_t *d, size_t len) {
  for (uint32_t i = 0; i < d->n_tok; i++) {
    const embps_json_tok_t *t = &d->tok[i];
    FUZZ_CHECK(t->start <= len && t->len <= len - t->start);
    FUZZ_CHECK(t->next > i && t->next <= d->n_tok);
    if (t->type == EMBPS_JSON_ARRAY || t->type == EMBPS_JSON_OBJECT) {
      uint32_t n = 0;
      for (uint32_t c = i + 1; c < t->next; c = d->tok[c].next)
        n++;
      FUZZ_CHECK(n == (t->type == EMBPS_JSON_OBJECT ? 2 * t->n : t->n));
    }
  }
}

/* A string's bytes through the writer and back. */
static void round_trip(const char *s, size_t n, int as_base64) {
  embps_jw_t w;
  embps_jw_init(&w, 16 + 6 * n + 4);
  if (as_base64)
    embps_jw_base64(&w, s, n);
  else
    embps_jw_str(&w, s, n);
  char *out;
  size_t len;
  FUZZ_CHECK(embps_jw_finish(&w, &out, &len) == 0);
  embps_json_t d;
  char err[128];
  FUZZ_CHECK(embps_json_parse(&d, out, len, 4, err, sizeof err) == 0);
  char *back = malloc(n + 1);
  size_t m = 0;
  FUZZ_CHECK(back);
  if (as_base64)
    FUZZ_CHECK(embps_json_base64(&d, 0, (uint8_t *)back, n, &m) == 0);
  else
    FUZZ_CHECK(embps_json_string(&d, 0, back, n + 1, &m) == 0);
  FUZZ_CHECK(m == n && !memcmp(back, s, n));
  free(back);
  embps_json_free(&d);
  free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  const size_t max_tokens = (size_t)1 << (data[0] % 12);
  const char *text = (const char *)data + 1;
  const size_t len = size - 1;

  long fr = embps_json_frame(text, len);
  FUZZ_CHECK(fr >= -1 && fr <= (long)len);

  embps_json_t d;
  char err[160];
  if (embps_json_parse(&d, text, len, max_tokens, err, sizeof err)) {
    FUZZ_CHECK(d.tok == NULL && d.n_tok == 0 && strstr(err, "JSON"));
    return 0;
  }
  FUZZ_CHECK(d.n_tok >= 1 && d.n_tok <= max_tokens);
  check_tokens(&d, len);
  if (d.tok[0].type == EMBPS_JSON_OBJECT && fr > 0) {
    /* the frame is the object with the whitespace before it */
    FUZZ_CHECK((size_t)fr == d.tok[0].start + d.tok[0].len);
  }
  for (uint32_t i = 0; i < d.n_tok; i++) {
    const size_t cap = d.tok[i].len + 1;
    char *s = malloc(cap);
    uint8_t *b = malloc(cap);
    FUZZ_CHECK(s && b);
    size_t n;
    if (embps_json_string(&d, (int)i, s, cap, &n) == 0) {
      FUZZ_CHECK(n < cap && s[n] == 0 && strlen(s) == n);
      round_trip(s, n, 0);
    }
    if (embps_json_base64(&d, (int)i, b, cap, &n) == 0) {
      FUZZ_CHECK(n <= cap);
      round_trip((const char *)b, n, 1);
    }
    int64_t v;
    int flag;
    (void)embps_json_int64(&d, (int)i, &v);
    (void)embps_json_bool(&d, (int)i, &flag);
    if (embps_json_get(&d, (int)i, "key") >= 0)
      FUZZ_CHECK(d.tok[i].type == EMBPS_JSON_OBJECT);
    for (int c = embps_json_first(&d, (int)i); c >= 0;
         c = embps_json_next(&d, (int)i, c))
      FUZZ_CHECK((uint32_t)c > i && (uint32_t)c < d.tok[i].next);
    free(s);
    free(b);
  }
  embps_json_free(&d);
  return 0;
}
