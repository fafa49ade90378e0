/* coord.h - who is primary of a member slot, decided in etcd (issue 22):
 * a leased key per slot, a campaign transaction, fencing by the lease's
 * own clock, the candidate with the most records preferred. The
 * coordinator is a thread that talks to etcd (etcd.h) and tells its
 * owner (the server, or a test) through callbacks what to be; it knows
 * nothing else of the server, so it is tested alone.
 *
 * Keys, under P = /embps/NAME/member/I:
 *   P/primary       {"addr","epoch","lsn"}: the holder, attached to its
 *                   lease. Whoever created it is primary of that epoch.
 *   P/epoch         the last epoch granted (not leased: it outlives every
 *                   holder, so epochs only grow).
 *   P/servers/ADDR  {"addr","lsn","epoch","candidate","vacancy",
 *                   "eligible"}: each server of the slot, attached to its
 *                   lease (present while it lives); candidate says it
 *                   runs in the election after epoch `vacancy` ended (0:
 *                   the first election), with that LSN and epoch.
 *   P/sync          {"epoch","degraded","lsn","addr"}: whether the primary
 *                   `addr` of that epoch acknowledges writes without its
 *                   synchronous followers (--sync-degrade-ms), degraded
 *                   from after LSN lsn (strict: its followers held every
 *                   record up to lsn). Not leased: it outlives the primary
 *                   (see "Degraded epochs").
 *
 * Leases. Every server holds one lease of --lease-ms (etcd counts whole
 * seconds: the TTL asked is the lease rounded up, and etcd may raise it
 * to its minimum, about 2 s with its default timings), renewed every
 * lease/3 (every lease/10 after a failed renewal). Each etcd call is
 * bounded by lease/3.
 *
 * Fencing. etcd restarts a lease's TTL when it receives a keepalive,
 * which is after we sent it. So if the holder measures from the moment it
 * sent its last successful keepalive (t_s, CLOCK_BOOTTIME: monotonic and,
 * unlike CLOCK_MONOTONIC, counting the time a suspended machine slept),
 * its lease cannot have ended at etcd before t_s + lease. The holder acknowledges
 * writes only while now < t_s + lease - margin (embps_coord_may_write;
 * margin = max(lease/10, 100 ms)): the margin covers the rate difference
 * of two machines' clocks (parts per million) and the time between the
 * check and the acknowledgement leaving the process; a new primary
 * needs etcd to have ended the lease (after t_s + lease), then a round
 * of the election (below), then its own promotion, so the margin is not
 * all that separates them. A frozen holder (SIGSTOP, a stalled VM) finds
 * its deadline passed when it wakes, before it can acknowledge anything,
 * whatever its threads were doing. Once its deadline passed the holder
 * refuses writes until it has renewed (its lease still alive: it goes
 * on) or read the key (someone else's: it becomes a follower, through
 * the demote callback; no one's: it campaigns again). etcd restarted
 * after being down restores leases with a fresh TTL, so a holder whose
 * lease outlived the outage resumes without an election.
 *
 * Election. When P/primary is absent, each server asks its owner
 * whether it may take the key (the eligible callback: a follower in sync
 * with the primary of the epoch that ended, or that primary itself, or
 * anyone while no epoch was ever granted) and posts its candidacy (its
 * applied LSN and epoch) in its P/servers key. It then waits for one
 * round (min(lease/4, 1 s)) or until every live server has posted for
 * this vacancy, whichever comes first, and campaigns only if no eligible
 * candidate has a higher LSN (ties: the lower address). The campaign is
 * one transaction: P/primary does not exist, P/epoch is unchanged since
 * it was read, and no P/servers key changed since the candidacies were
 * read (a MOD compare over the prefix); then P/primary is created with
 * its lease and P/epoch = max(P/epoch, every candidate's epoch) + 1.
 * Race analysis:
 *   - two candidates both believing they are best: impossible from the
 *     same read (one order), and from different reads the transaction
 *     decides: one creates the key, the other's compare fails;
 *   - a better candidate posting late: its post changes a P/servers key,
 *     so a worse candidate's transaction made after the post fails and
 *     it reads again; one made before the post wins, which takes the
 *     better candidate being slower than a whole round to notice the
 *     vacancy (it was registered and live, so the round waited for it
 *     until its end). That server is then behind the winner's log and
 *     rejoins it (its extra records, never acknowledged unless it was
 *     the only synchronous follower, are cut);
 *   - a candidate that dies after posting: its key goes with its lease
 *     and the others, waiting for the key to be taken, start a new
 *     round after 2 rounds + a lease without a primary.
 * With --sync-followers N >= 1, every acknowledged record is on at
 * least N followers; all follow one log, so the one with the highest LSN
 * holds every record any of them holds: choosing it loses nothing
 * acknowledged.
 *
 * Degraded epochs (Patroni's non-strict synchronous_mode). A primary
 * whose followers are out of sync for --sync-degrade-ms may acknowledge
 * without them (feed.h "Degrading"), but only once it has written P/sync
 * = {its epoch E, degraded} (embps_coord_want_sync; the coordinator's
 * thread writes it in one transaction conditioned on P/primary's create
 * revision being the one of the key it created, i.e. it still holds the
 * key, and tells the owner through sync_recorded). While P/sync says epoch
 * E is degraded, the election after E admits no follower: only the server
 * at P/sync's addr, E's primary itself (embps_coord_sync_eligible), so
 * when it comes back it is elected and nothing it acknowledged is lost;
 * until then the member has no primary (a person may still make one by
 * hand, knowing it may lack acknowledged writes). When its followers are
 * in sync again the primary first makes acknowledgements wait for them,
 * then, once they hold every record up to the last one acknowledged
 * without them, asks for P/sync = {E, strict}: from then on failover is
 * possible again. A new epoch starts strict (P/sync of an older epoch
 * binds no election but the one after that epoch). A P/sync that does not
 * parse is taken as degraded for every epoch (only this code writes it).
 * Race analysis (why a follower is never elected while a write it lacks
 * was acknowledged):
 *   - a write is acknowledged without followers only after the degraded
 *     transaction succeeded; it succeeded while P/primary was the
 *     primary's key, so no follower had been elected after E (that needs
 *     P/primary absent at its campaign, and then ours would be another
 *     key or none);
 *   - a follower's campaign compares P/sync's mod revision with its read
 *     (MOD < read + 1), as it does P/servers: if the degradation was
 *     written before that read, the follower saw it and did not run; if
 *     after, the campaign fails; so one of the two transactions sees the
 *     other, in etcd's one order;
 *   - strict is asked only after acknowledgements wait again and the
 *     followers hold every record up to the last one acknowledged
 *     without them (strict_from), and the owner stops trusting an
 *     earlier answer (request numbers) before it asks: no write is
 *     acknowledged without followers once strict may have been written;
 *   - a primary that loses its key while degraded cannot write strict
 *     (the condition fails): its epoch stays degraded, and only it may be
 *     elected after it;
 *   - a candidate that posted eligible before the degradation was written
 *     posts again (not eligible) when it reads it, and never campaigns on
 *     the old read (the compare above).
 *
 * Addresses are unique: a server finding P/primary under its own address
 * but another lease knows it as its own previous run (it serves on that
 * address now, so that process is gone) and ends that lease at once
 * instead of waiting for it.
 *
 * The cluster's primaries. Clients ask any server which server is
 * primary of each member (stats), so the thread also keeps a copy of every
 * slot's P/primary under /embps/NAME/member/: its own slot's as soon as a
 * read of it shows a change, the others' on every step at most a renewal
 * period (lease/3) apart. The read is paged at one revision (a consistent
 * picture) and bounded: slots 0 to EMBPS_COORD_MAP_MAX - 1 (the members a
 * client can list), at most EMBPS_COORD_MAP_PAGES pages of keys. The copy
 * is swapped in under the status lock, never held during a call to etcd,
 * so readers (I/O threads) never wait on etcd; a failed read keeps the
 * last copy.
 *
 * Threads: the coordinator's own thread runs every callback; the other
 * functions may be called from any thread. */
#ifndef EMBPS_COORD_H
#define EMBPS_COORD_H
#include <stddef.h>
#include <stdint.h>

#define EMBPS_COORD_ADDR_MAX 128
#define EMBPS_COORD_NAME_MAX 64
/* Member slots per cluster name. */
#define EMBPS_COORD_MEMBERS_MAX 4096

typedef enum {
  EMBPS_COORD_STARTING,  /* no answer from etcd yet */
  EMBPS_COORD_FOLLOWER,  /* someone else holds the key */
  EMBPS_COORD_CANDIDATE, /* no one does: an election */
  EMBPS_COORD_PRIMARY,   /* we do (writes while the fence holds) */
} embps_coord_role_t;

/* What the owner says of itself when the key is free. */
typedef struct {
  uint64_t lsn;   /* its last record (applied, or made as a primary) */
  uint32_t epoch; /* the epoch of that record (0: none) */
  int eligible;   /* may take the key: see "Election" above */
} embps_coord_self_t;

typedef struct {
  const char *url;     /* etcd://HOST:PORT[,HOST:PORT...] */
  const char *cluster; /* NAME */
  uint32_t member;     /* I */
  const char *addr;    /* HOST:PORT others reach this server at */
  uint32_t lease_ms;   /* >= 1000 */
  void *ctx;           /* handed to every callback */
  /* The owner's state for an election after epoch last_epoch ended (0:
   * none was ever granted). */
  void (*self)(void *ctx, uint32_t last_epoch, embps_coord_self_t *out);
  /* This server won epoch `epoch`: become primary of it. 0, or -1 (the
   * coordinator then gives the key back: its lease is revoked). Writes
   * are accepted only once this returned 0 and the fence holds. */
  int (*promote)(void *ctx, uint32_t epoch);
  /* Someone else is primary (addr, epoch): follow it. Called whenever
   * the holder or its epoch changes. was_primary: this server held the
   * key before (it must rejoin: its log may hold records the new primary
   * never had). */
  void (*follow)(void *ctx, const char *addr, uint32_t epoch,
                 int was_primary);
  /* The degradation asked with number gen (embps_coord_want_sync) is
   * written in P/sync. May be NULL. */
  void (*sync_recorded)(void *ctx, uint64_t gen);
  /* A line for the owner's log (level 0 info, 1 warning). May be NULL. */
  void (*log)(void *ctx, int level, const char *msg);
} embps_coord_config_t;

typedef struct embps_coord embps_coord_t;

typedef struct {
  embps_coord_role_t role;
  uint32_t epoch;                   /* of the primary we know (or are) */
  char primary[EMBPS_COORD_ADDR_MAX]; /* its address ("" none known) */
  uint64_t renewals, renewal_failures; /* lease keepalives */
  uint64_t elections_won, demotions;
  uint64_t fence_ns; /* may write before this (0: not; embps_coord_clock_ns) */
  char error[256];                  /* the last etcd error ("" none) */
} embps_coord_status_t;

/* Checks cfg (copied) and sets up the client; nothing is sent until
 * embps_coord_start. 0, or -1 with err. */
int embps_coord_create(const embps_coord_config_t *cfg, embps_coord_t **out,
                       char *err, size_t err_len);
/* Starts the thread. 0 or -errno. */
int embps_coord_start(embps_coord_t *c);
/* Stops the thread; with resign, a primary first stops writing and
 * revokes its lease (its key goes at once: followers elect without
 * waiting for the lease to end). NULL-safe. */
void embps_coord_destroy(embps_coord_t *c, int resign);
/* Whether this server may acknowledge a write now: primary, promoted,
 * and before its fence. Cheap: one atomic load and the clock. */
int embps_coord_may_write(const embps_coord_t *c);
/* The fence: may write while embps_coord_clock_ns() < this (0: may
 * not). */
uint64_t embps_coord_fence_ns(const embps_coord_t *c);
/* The fence's clock: CLOCK_BOOTTIME, in ns. */
uint64_t embps_coord_clock_ns(void);
void embps_coord_status(embps_coord_t *c, embps_coord_status_t *s);
/* Asks the coordinator to write P/sync for this primary's epoch: degraded
 * (acknowledgements go on without followers after LSN lsn) or strict
 * (they hold every record up to lsn); the last call wins. A degradation
 * written is told through sync_recorded(gen). Any thread; never waits. */
void embps_coord_want_sync(embps_coord_t *c, int degraded, uint64_t lsn,
                           uint64_t gen);

/* P/sync as read. */
typedef struct {
  int present, degraded;
  int any_epoch; /* it did not parse: taken as degraded for every epoch */
  uint32_t epoch;
  uint64_t lsn;
  int64_t mod;
  char addr[EMBPS_COORD_ADDR_MAX];
} embps_coord_sync_t;
/* Whether P/sync (s) lets the server at addr run in the election after
 * epoch last: yes unless it says epoch last was degraded, and then only
 * for that epoch's primary (its addr). */
int embps_coord_sync_eligible(const embps_coord_sync_t *s, uint32_t last,
                              const char *addr);
/* The owner's state changed (e.g. caught up): look again now. */
void embps_coord_kick(embps_coord_t *c);
const char *embps_coord_role_name(embps_coord_role_t r);
/* Reads who holds the slot's primary key now, with client e: 1 with its
 * address (cap bytes) and epoch, 0 when no one does, or a negative code
 * (embps_etcd_error says why; -EPROTO: a value that does not parse). */
struct embps_etcd;
int embps_coord_read_primary(struct embps_etcd *e, const char *cluster,
                             uint32_t member, char *addr, size_t cap,
                             uint32_t *epoch);
/* Member slots whose primaries the cluster copy holds: the client's
 * member limit. */
#define EMBPS_COORD_MAP_MAX 1024
/* Pages of EMBPS_ETCD_KVS_MAX keys one read of the cluster takes at most. */
#define EMBPS_COORD_MAP_PAGES 16

/* The primary of one member slot as etcd said ("" addr: none, an
 * election). */
typedef struct {
  uint32_t member, epoch;
  char addr[EMBPS_COORD_ADDR_MAX];
} embps_coord_primary_t;

/* A copy of the cluster's primaries (see "The cluster's primaries"): every
 * slot that has keys in etcd, in member order, *n of them (at most
 * EMBPS_COORD_MAP_MAX), in *out (malloc'd; NULL when *n is 0). 0, or
 * -ENOMEM. Never waits on etcd. */
int embps_coord_primaries(embps_coord_t *c, embps_coord_primary_t **out,
                          size_t *n);
/* The key prefix of a slot: /embps/NAME/member/I (cap bytes). */
void embps_coord_prefix(const char *cluster, uint32_t member, char *out,
                        size_t cap);
#endif
