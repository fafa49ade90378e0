/* token.h - the shared auth token: read from --auth-token-file once the
 * file is found private enough to hold it (token.c says what that means and
 * why).
 *
 * The file holds one token, or two during a rotation, one per line: the
 * first is the current one (the one this server presents to its peers and
 * clients read: common/util.h embps_token_first_line), the second is
 * accepted too (README "Security", rotation). */
#ifndef EMBPS_TOKEN_H
#define EMBPS_TOKEN_H
#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "wire.h"

/* The tokens of a token file: 1 or 2 of 1..EMBPS_TOKEN_MAX bytes. */
#define EMBPS_TOKENS_MAX 2
typedef struct {
  char token[EMBPS_TOKENS_MAX][EMBPS_TOKEN_MAX];
  size_t len[EMBPS_TOKENS_MAX];
  int n;
} embps_tokens_t;

/* Who reads the file: the server's effective uid and every group it holds
 * (effective gid first, then the supplementary groups). */
typedef struct {
  uid_t uid;
  gid_t groups[64];
  int n_groups;
} embps_token_reader_t;

/* Fills r with the calling process's effective uid and groups. 0 or -errno. */
int embps_token_reader_self(embps_token_reader_t *r);

/* Decides whether a file with status st may hold the token that reader r
 * reads from it: 0, or -1 with err saying who else could read or change it
 * and the chmod/chown that fixes it. path only names the file in err. */
int embps_token_check(const char *path, const struct stat *st,
                      const embps_token_reader_t *r, char *err,
                      size_t err_len);

/* Opens path (symlinks followed), checks the open file with
 * embps_token_check for this process, and copies its contents without
 * trailing CR/LF into token (cap bytes); *len gets their length, 1..cap.
 * 0, or -1 with err naming path, the problem and the fix; token is then
 * unchanged. */
int embps_token_read(const char *path, char *token, size_t cap, size_t *len,
                     char *err, size_t err_len);

/* embps_token_read, then its lines (LF or CRLF; line ends at the end
 * ignored) into out: one token, or two. A blank line, a third token or a
 * token over EMBPS_TOKEN_MAX bytes is refused: 0, or -1 with err; out is
 * then unchanged. */
int embps_tokens_read(const char *path, embps_tokens_t *out, char *err,
                      size_t err_len);

/* 1 if the len bytes at given are the token (token_len bytes), compared
 * in a time that depends on token_len only. */
int embps_token_equal(const char *token, size_t token_len, const void *given,
                      size_t len);
#endif
