/* repl_util.h - shared pieces of the replication tests (test_repl.c,
 * test_failover.c): one server's stats, waiting for a follower to reach
 * its primary, comparing two servers table by table (every row with its
 * optimizer state, and every counter a replica must share), and a pull
 * over a raw connection that returns the LSN the server says it read at
 * (the library does not hand it out). Each talks to one server whatever
 * its place in its cluster (a member of a cluster of several too).
 *
 * Comparisons report each difference on stderr ("<what>: table T row R
 * ...") and return how many there were. */
#ifndef EMBPS_REPL_UTIL_H
#define EMBPS_REPL_UTIL_H
#include <stddef.h>
#include <stdint.h>

#include "embps/embps.h"

/* Stats of the one server at addr (token-less, loopback). 0 or a code. */
int repl_stats(const char *addr, embps_server_stats_t *out);
/* Waits until the follower at f has applied every record the primary at p
 * has (their applied LSNs equal, the primary not moving). 0, or -1 after
 * timeout_ms (both LSNs printed). */
int repl_wait_caught_up(const char *p, const char *f, int timeout_ms);
/* Waits until the primary at p counts at least n followers in sync. */
int repl_wait_in_sync(const char *p, unsigned n, int timeout_ms);
/* Compares every table of the servers at a and b: the same tables, specs,
 * counters (all but pulls, pushes and the eviction stall: each process's
 * own activity since it started, which no checkpoint keeps; and
 * bytes_used unless same_memory: a table restored from a checkpoint holds
 * its rows in other allocations), and rows: ids, weights and optimizer
 * state, bit for bit. Returns the number of differences. */
int repl_compare(const char *a, const char *b, const char *what,
                 int same_memory);
/* Pulls n ids of table (dim) from the server at addr over its own
 * connection: rows into out, the LSN the reply says into *lsn. 0 or -1. */
int repl_pull_lsn(const char *addr, const char *table, const int64_t *ids,
                  uint32_t n, uint32_t dim, float *out, uint64_t *lsn);
#endif
