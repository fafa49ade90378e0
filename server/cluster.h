/* cluster.h - --cluster-servers: this server asks its peers, every few
 * seconds, which tables they hold, so /readyz can say "not ready" while
 * this server lacks a table the rest of the cluster has (a member that came
 * back without its data dir), and --complete-tables can create them here.
 *
 * One thread of its own, started once the server serves: it talks to each
 * peer through libembps (a member client per peer, LIST only), never
 * touching the I/O or apply threads. The HTTP thread reads what it found
 * under a mutex and compares it with this server's registry at the moment
 * of the request, so a table created here shows as present at once. */
#ifndef EMBPS_CLUSTER_H
#define EMBPS_CLUSTER_H
#include <stddef.h>

#include "server.h"

/* Seconds between two rounds of questions. */
#define EMBPS_CLUSTER_CHECK_S 3
/* Time one peer has to connect and answer, per round. */
#define EMBPS_CLUSTER_PEER_TIMEOUT_MS 2000

/* Checks cfg's --cluster-servers list against --cluster-size (which it
 * sets when 0: not given), --cluster-index and the --listen port. 0, or -1
 * with a message in err. Without the flag: sets cluster_size 1 when 0. */
int embps_cluster_config_check(embps_server_config_t *cfg, char *err,
                               size_t err_len);
/* Starts the thread when --cluster-servers was given; 0 or -1 (logged;
 * also when another server of the process runs it: one per process). */
int embps_cluster_start(embps_server_t *srv);
/* Stops and joins it; safe without a start. */
void embps_cluster_stop(void);
/* For /readyz: 1 when the cluster part of readiness holds (always without
 * --cluster-servers), else 0. *body (malloc'd, may be NULL on ENOMEM; the
 * caller frees it) says why: the missing tables, each with a peer holding
 * it, and the peers that could not be asked. */
int embps_cluster_ready(char **body, size_t *len);
/* For /metrics: 0 without --cluster-servers, else 1 with the tables some
 * reachable peer holds and this server lacks, the peers that could not be
 * asked in the last round and the peers. */
int embps_cluster_counts(size_t *missing, size_t *unreachable,
                         size_t *peers);
#endif
