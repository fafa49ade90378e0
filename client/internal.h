/* internal.h - what the library's files share beyond embps.h (not
 * exported): client.c's last error and the servers' frame limit, for
 * export.c; a request of any kind with its reply's bulk read in place,
 * for snapshot.c. */
#ifndef EMBPS_CLIENT_INTERNAL_H
#define EMBPS_CLIENT_INTERNAL_H
#include <stdint.h>

#include "embps/embps.h"
#include "wire.h"

/* Sets c's last error to msg; returns code. */
int embps_client_set_error_(embps_client_t *c, int code, const char *msg);
/* The smallest --max-frame-bytes a server of c announced (0: none). */
uint64_t embps_client_max_frame_(const embps_client_t *c);

/* Sends m (no bulk) to server s now, as a ticket of its own; the bulk of
 * its reply, when it fits dst_cap bytes, is read straight into dst, which
 * must stay valid until embps_client_reply_ (dst NULL: no bulk expected).
 * Not sent again after a broken connection. 0 with *out, or an error
 * (c's last error set). */
int embps_client_request_(embps_client_t *c, uint32_t server,
                          const embps_msg_t *m, uint8_t *dst, size_t dst_cap,
                          embps_ticket_t **out);
/* Waits for t (embps_client_request_'s) and frees it: 0 with *reply (the
 * decoded reply: embps_msg_free it) and *bulk_len (its bulk bytes, in
 * dst), or the server's error or a transport error (c's last error set).
 * A reply whose bulk did not fit dst is EMBPS_EPROTO. Every ticket must be
 * waited for before its dst is reused. */
int embps_client_reply_(embps_client_t *c, embps_ticket_t *t,
                        embps_msg_t *reply, size_t *bulk_len);
#endif
