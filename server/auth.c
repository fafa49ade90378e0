/* auth.c - see auth.h. A hello is rare (once per connection), so a mutex
 * guards the tokens; the comparison visits every byte of every token
 * whatever the hello carries (embps_token_equal). */
#include "auth.h"

#include <string.h>

void embps_auth_init(embps_auth_t *a, const embps_tokens_t *t) {
  pthread_mutex_init(&a->mu, NULL);
  memset(&a->tokens, 0, sizeof a->tokens);
  if (t)
    a->tokens = *t;
}

void embps_auth_close(embps_auth_t *a) { pthread_mutex_destroy(&a->mu); }

void embps_auth_set(embps_auth_t *a, const embps_tokens_t *t) {
  pthread_mutex_lock(&a->mu);
  a->tokens = *t;
  pthread_mutex_unlock(&a->mu);
}

int embps_auth_check(embps_auth_t *a, const char *token, size_t len) {
  pthread_mutex_lock(&a->mu);
  const embps_tokens_t *t = &a->tokens;
  int ok = t->n == 0;
  for (int i = 0; i < t->n; i++)
    ok |= embps_token_equal(t->token[i], t->len[i], token, len);
  pthread_mutex_unlock(&a->mu);
  return ok;
}

size_t embps_auth_current(embps_auth_t *a, char *buf, size_t cap) {
  pthread_mutex_lock(&a->mu);
  size_t n = a->tokens.n ? a->tokens.len[0] : 0;
  if (n >= cap)
    n = 0;
  memcpy(buf, a->tokens.token[0], n);
  buf[n] = 0;
  pthread_mutex_unlock(&a->mu);
  return n;
}
