/* internal.h - what the library's files share beyond embps.h (not
 * exported): client.c's last error and the servers' frame limit, for
 * export.c. */
#ifndef EMBPS_CLIENT_INTERNAL_H
#define EMBPS_CLIENT_INTERNAL_H
#include <stddef.h>
#include <stdint.h>

#include "embps/embps.h"
#include "wire.h"

/* Sets c's last error to msg; returns code. */
int embps_client_set_error_(embps_client_t *c, int code, const char *msg);
/* The smallest --max-frame-bytes a server of c announced (0: none). */
uint64_t embps_client_max_frame_(const embps_client_t *c);

/* ---- a server talking to another (issue 21: a follower's primary) ----
 * A client of the one server at addr ("HOST:PORT"), whatever its place in
 * its cluster, saying hello with token; each call gets timeout_ms, none
 * is retried. 0, or an error with err. */
int embps_client_create_peer_(const char *addr, const char *token,
                              size_t token_len, int timeout_ms,
                              embps_client_t **out, char *err,
                              size_t err_len);
/* Sends request m (no bulk) to the peer; *t is the ticket to wait on
 * (several may be in flight). 0 or an error (c's last error). */
int embps_client_send_(embps_client_t *c, const embps_msg_t *m,
                       embps_ticket_t **t);
/* Waits for t and frees it: 0 with *reply (release with embps_msg_free)
 * and *bulk (malloc'd, NULL when none; the caller frees it), or an error
 * (an ERROR reply's code, its message c's last error, its LSN in
 * *err_lsn when err_lsn is not NULL). */
int embps_client_wait_(embps_client_t *c, embps_ticket_t *t,
                       embps_msg_t *reply, uint8_t **bulk, size_t *bulk_len,
                       uint64_t *err_lsn);
/* Frees t without waiting (a reply still owed drops its connection);
 * NULL-safe. c may be NULL once destroyed. */
void embps_client_cancel_(embps_client_t *c, embps_ticket_t *t);
#endif
