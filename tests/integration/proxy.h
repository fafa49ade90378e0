/* proxy.h - a fault-injecting TCP proxy for the integration tests.
 *
 * It listens on 127.0.0.1 port 0 and forwards every connection it accepts
 * to an upstream embps-server, reading the frame headers in both
 * directions, so a test can break a connection at a chosen moment of the
 * protocol: after the server acted on a request but before the client saw
 * the reply, or halfway through sending a request. It also counts what
 * passed (requests by kind, push replies and how many were duplicates).
 *
 * Two threads per proxied connection (one per direction, blocking I/O) and
 * one accepting: nothing here runs on the test's thread, so a client on
 * that thread drives its own I/O as usual. Faults fire once each.
 */
#ifndef EMBPS_TEST_PROXY_H
#define EMBPS_TEST_PROXY_H
#include <stdint.h>

typedef struct it_proxy it_proxy_t;

typedef enum {
  /* Forward the request, then, when the server's reply to it comes back,
   * close both sides instead of forwarding it: the server acted, the
   * client never learns. */
  IT_PROXY_DROP_REPLY = 1,
  /* Forward the request's header and half its body, then close both
   * sides: the server never sees the whole request. */
  IT_PROXY_DROP_REQUEST = 2,
  /* As DROP_REQUEST, and the server is down from then on: the proxy's
   * upstream becomes "127.0.0.1:1" (nothing listens there), so a
   * reconnection fails, until it_proxy_set_upstream. */
  IT_PROXY_DROP_REQUEST_THEN_DOWN = 3,
} it_proxy_fault_t;

typedef struct {
  unsigned connections;    /* accepted */
  unsigned requests[256];  /* client frames forwarded, by kind */
  unsigned push_replies;   /* PUSH replies forwarded to a client */
  unsigned push_duplicates; /* of which PushReply.duplicate was set */
  unsigned faults_fired;
  unsigned held;           /* requests held by it_proxy_hold */
} it_proxy_counts_t;

/* Starts a proxy to `upstream` ("127.0.0.1:PORT"). Returns 0 or -1. */
int it_proxy_start(it_proxy_t **out, const char *upstream);
/* "127.0.0.1:PORT" the proxy listens on; valid until it_proxy_stop. */
const char *it_proxy_addr(const it_proxy_t *p);
/* Connections accepted from now on go to `upstream`. */
void it_proxy_set_upstream(it_proxy_t *p, const char *upstream);
/* Arms `fault` for the nth client request of `kind` (counting from 1,
 * over every connection, from this call). Replaces an armed fault. */
void it_proxy_arm(it_proxy_t *p, it_proxy_fault_t fault, uint16_t kind,
                  unsigned nth);
/* From now on, every client request of `kind` is held before it reaches
 * the server (its client waits for a reply that does not come), until
 * it_proxy_hold(p, 0) lets them go on, or its connection ends (the server
 * closed it, it_proxy_cut, it_proxy_stop). A held request also holds the
 * requests after it on its connection. counts.held counts them. */
void it_proxy_hold(it_proxy_t *p, uint16_t kind);
/* Closes every open proxied connection now (both sides). */
void it_proxy_cut(it_proxy_t *p);
void it_proxy_counts(it_proxy_t *p, it_proxy_counts_t *out);
/* Closes everything, joins the threads and frees p; NULL is accepted. */
void it_proxy_stop(it_proxy_t *p);
#endif
