/* auth.h - the tokens a server accepts in a hello, replaced by a reload
 * (SIGHUP) while I/O threads check hellos against them. One token, or two
 * while a rotation is under way (token.h: the file's first line is the
 * current token, the one this server presents to its peers). */
#ifndef EMBPS_AUTH_H
#define EMBPS_AUTH_H
#include <pthread.h>
#include <stddef.h>

#include "token.h"

typedef struct {
  pthread_mutex_t mu;
  embps_tokens_t tokens; /* n 0: no token required */
} embps_auth_t;

/* t NULL or with n 0: every hello passes. */
void embps_auth_init(embps_auth_t *a, const embps_tokens_t *t);
void embps_auth_close(embps_auth_t *a);
/* Replaces the tokens (any thread). */
void embps_auth_set(embps_auth_t *a, const embps_tokens_t *t);
/* 1 when token (len bytes) is one of the tokens, or none is required. Its
 * time does not depend on where the token differs. Any thread. */
int embps_auth_check(embps_auth_t *a, const char *token, size_t len);
/* The current token NUL-terminated in buf (cap > EMBPS_TOKEN_MAX): its
 * length, 0 when there is none. */
size_t embps_auth_current(embps_auth_t *a, char *buf, size_t cap);
#endif
