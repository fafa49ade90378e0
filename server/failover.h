/* failover.h - the server's side of the coordinator (issue 22,
 * --coordinator): what coord.h decides in etcd, done to this server.
 *
 * Start. Before its restore, a server asks etcd who is primary of its
 * member (up to two leases of retries); it starts as a follower of that
 * server (its data dir's log cut where it leaves that primary's history,
 * follow.h), or, when no one is, as a follower of no one that serves
 * reads and waits for the election. Every server of a coordinated member
 * starts as a follower; the election makes one the primary.
 *
 * Roles. Once it listens, its coordinator (coord.h) campaigns and
 * follows: a server that wins its member's key is promoted (follow.h:
 * a new epoch, at least the one etcd granted, from its next LSN); one
 * told to follow another points its follower thread there (no restart:
 * its log is a prefix of the new primary's); one that held the key and
 * lost it rejoins: it executes itself again, the same argv with its
 * bound port pinned, so the start above cuts what its log holds that the
 * new primary never had (immediately, with no final checkpoint, which
 * could hold those records). A follower whose log turns out to have left
 * its new primary's history (EMBPS_EDIVERGED) or that needs a snapshot
 * rejoins the same way.
 *
 * Writes (dispatch.c, conn.c): a mutation is accepted only by the
 * primary while its fence holds (embps_coord_may_write), and its reply
 * is checked again just before it is sent: one whose fence ended in
 * between (a freeze, a stall) is answered EMBPS_ENOTPRIMARY "applied here
 * but not acknowledged", the state of a primary that crashed before its
 * acknowledgement, which the client's exactly-once retry resolves.
 *
 * Eligibility: a server may take the key when no epoch was ever granted,
 * or when its history reaches the last epoch granted (it followed that
 * primary, or was it). A server whose history is older (it never caught
 * up with the last primary, or lost its data) never campaigns: electing
 * it would silently lose the member's rows. Nor does a follower whose
 * primary no longer held its next record, from that answer until the
 * copy of the primary's state it then takes is installed and caught up
 * (follow.h): its history reaches the last epoch, its tables do not.
 * With --data-dir that holds across a restart (copy.h, the mark). */
#ifndef EMBPS_FAILOVER_H
#define EMBPS_FAILOVER_H
#include <stddef.h>
#include <stdint.h>

#include "coord.h"
#include "history.h"
#include "request.h"
#include "server.h"

typedef struct embps_failover embps_failover_t;

/* With --coordinator, before the restore: sets up srv->failover and
 * srv->cfg.follow (the primary found, or empty). 0, or -1 (logged).
 * Without --coordinator: 0, nothing done. */
int embps_failover_prepare(embps_server_t *srv);
/* Whether srv starts as a follower (--follow, or --coordinator). */
int embps_failover_starts_following(const embps_server_t *srv);
/* embps_durable_hooks_t.join for a coordinated server: its primary's
 * answer when one is known, else the log as it is. */
int embps_failover_join(void *ctx, const embps_history_t *h, uint64_t last,
                        uint64_t *keep, char *err, size_t err_len);
/* Once listening on port: starts the coordinator. 0 or -1 (logged). */
int embps_failover_start(embps_server_t *srv, int port);
/* Stops the coordinator; a primary gives its lease back first (its
 * followers elect at once). Before the follower and apply threads stop.
 * NULL-safe. */
void embps_failover_stop(embps_server_t *srv);
/* Whether a mutation may be accepted now (1 without --coordinator). */
int embps_failover_may_write(embps_server_t *srv);
/* Sets req's reply to EMBPS_ENOTPRIMARY for a write this server may not
 * take, naming the primary when one is known. */
void embps_failover_refuse(embps_server_t *srv, embps_request_t *req);
/* Just before a reply is sent (I/O thread): a mutation's success reply
 * becomes EMBPS_ENOTPRIMARY when the fence ended meanwhile. */
void embps_failover_check_reply(embps_server_t *srv, embps_request_t *req);
/* A hello reply's role and primary (cap bytes): the primary only while
 * it may acknowledge writes, else a follower naming the primary it knows
 * ("" none, or only itself), so that clients go there. */
void embps_failover_hello(embps_server_t *srv, uint32_t *role,
                          char *primary, size_t cap);
/* The stats reply's replication fields, the coordinator's primary and
 * figures included. */
void embps_failover_stats(embps_server_t *srv, embps_server_stats_t *s);
/* The coordinator's figures: 1 with *s set, 0 without a coordinator. */
int embps_failover_status(embps_server_t *srv, embps_coord_status_t *s);
/* s->members (malloc'd: the caller frees them), for a stats reply: the
 * primary of every member slot of the cluster as the coordinator last read
 * them (coord.h, "The cluster's primaries"); none without --coordinator
 * or when out of memory (the other figures still go out). Never waits on
 * etcd. */
void embps_failover_members(embps_server_t *srv, embps_server_stats_t *s);
#endif
