/* dropproxy.h - a fault-injecting TCP proxy for the retry tests: it relays
 * whole embps frames between clients and one upstream server (a thread,
 * one client connection at a time, a fresh upstream connection for each),
 * decodes push replies to count duplicates, and, when armed, forwards the
 * next push to the server, reads the server's reply to it (the push is
 * applied), runs a hook (e.g. kill -9 and restart the server), and then
 * closes the client's connection without forwarding that reply. */
#ifndef EMBPS_DROPPROXY_H
#define EMBPS_DROPPROXY_H
#include <stdint.h>

typedef struct dropproxy dropproxy_t;

typedef struct {
  uint64_t connections;   /* client connections accepted */
  uint64_t pushes;        /* push frames forwarded to the server */
  uint64_t push_replies;  /* push replies forwarded to clients */
  uint64_t duplicates;    /* of which flagged duplicate */
  uint64_t dropped;       /* replies withheld and connections cut */
} dropproxy_stats_t;

/* Listens on 127.0.0.1:0 and relays to upstream "127.0.0.1:PORT".
 * NULL on failure. */
dropproxy_t *dropproxy_start(const char *upstream);
int dropproxy_port(const dropproxy_t *p);
/* Arms the fault for the next push frame; hook (may be NULL) runs in the
 * proxy's thread after the server's reply was read, before the cut. */
void dropproxy_arm(dropproxy_t *p, void (*hook)(void *), void *ctx);
void dropproxy_stats(dropproxy_t *p, dropproxy_stats_t *out);
void dropproxy_stop(dropproxy_t *p);
#endif
