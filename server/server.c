/* server.c - a server's lifecycle and its listener: create, port, run,
 * stop, destroy (the contract and the threading model are in server.h);
 * the connections are conn.c's.
 *
 * Lifecycle: a server is a net_t whose first member is the embps_server_t
 * callers hold; every handle and thread reaches it through their data
 * pointers, so a process may hold several. embps_server_create runs
 * net_start's steps in order and, on a failure, undoes those done with
 * the same two functions destroy uses (net_stop_threads, net_free). The
 * ready line is printed, and /readyz turned on, only after the last step
 * that can fail.
 *
 * Accepting: the main loop polls a non-blocking listening socket and deals
 * accepted fds round-robin to the I/O threads (Debian's libuv 1.44 has no
 * SO_REUSEPORT flag, and round-robin balances better than a shared socket).
 * At --max-connections, the I/O thread with the most connections without
 * a hello is asked to close its oldest one to make room; when there is
 * none, the new connection gets an error frame and is closed.
 *
 * Out of descriptors: when accept fails with EMFILE/ENFILE the listener is
 * not polled for ACCEPT_RETRY_MS (a level-triggered poll would spin), and
 * the warning is logged at most once per LOG_EVERY_MS.
 *
 * Shutdown (embps_server_stop, an async handle that keeps no loop alive;
 * the daemon's SIGTERM/SIGINT do the same): stop accepting, drain the I/O
 * threads (they stop reading, finish every request already read, flush
 * replies, close), take the final checkpoint, stop the apply thread.
 * SIGHUP reloads (reload.c). Before the main loop takes these signals (a
 * restore), the daemon's start-up guard does (signals.c). */
#define _GNU_SOURCE /* accept4 */
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "apply.h"
#include "cluster.h"
#include "conn.h"
#include "durable.h"
#include "evict.h"
#include "failover.h"
#include "feed.h"
#include "follow.h"
#include "notify.h"
#include "server.h"
#include "snapshot.h"

#define ACCEPT_RETRY_MS 100
#define LOG_EVERY_MS 1000
#define FD_RESERVE 64 /* descriptors beyond the connections: loops, files */

/* At most one log line per LOG_EVERY_MS for a repeated event. */
typedef struct {
  uint64_t next_ns, skipped;
} ratelimit_t;

/* A server: the handle callers hold is &net->srv. */
typedef struct net {
  embps_server_t srv;
  uv_loop_t loop;
  uv_poll_t listen_poll;
  uv_timer_t accept_retry;
  uv_signal_t sig_term, sig_int, sig_hup; /* cfg.handle_signals only */
  uv_async_t stop_async; /* embps_server_stop; open until destroy */
  int listen_fd, port, stopping;
  int loop_ready, metrics_started, cluster_started, threads_stopped;
  embps_io_t **io;
  uint32_t n_io; /* I/O threads started */
  uint32_t next_io;
  embps_io_shared_t shared; /* what the I/O threads share */
  ratelimit_t accept_log;
} net_t;

/* 1 when the event may be logged now; *skipped is how many times it was
 * not since the last line. */
static int ratelimit_pass(ratelimit_t *r, uint64_t *skipped) {
  uint64_t now = embps_now_ns();
  if (now < r->next_ns) {
    r->skipped++;
    return 0;
  }
  r->next_ns = now + (uint64_t)LOG_EVERY_MS * 1000000u;
  *skipped = r->skipped;
  r->skipped = 0;
  return 1;
}

/* ------------------------------------------------------------ main loop */

static void deal_fd(net_t *net, int fd) {
  embps_io_add(net->io[net->next_io++ % net->n_io], fd);
}

/* Over --max-connections: say so in one error frame, then close. */
static void refuse_fd(net_t *net, int fd) {
  uint8_t *frame;
  size_t len;
  char msg[96];
  snprintf(msg, sizeof msg, "server has reached --max-connections %u",
           net->srv.cfg.max_connections);
  if (embps_frame_error(0, EMBPS_ELIMIT, msg, &frame, &len) == 0) {
    ssize_t w = send(fd, frame, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    free(frame);
  }
  close(fd);
}

/* At --max-connections: asks the I/O thread with the most connections
 * without a hello (not already asked for) to close its oldest one.
 * Returns 0 if there is none. */
static int evict_for_room(net_t *net) {
  embps_io_t *best = NULL;
  unsigned best_n = 0;
  for (uint32_t i = 0; i < net->n_io; i++) {
    unsigned n = embps_io_strangers(net->io[i]);
    if (n > best_n) {
      best = net->io[i];
      best_n = n;
    }
  }
  if (!best)
    return 0;
  embps_io_evict(best);
  return 1;
}

static void on_listen(uv_poll_t *p, int status, int events);

static void on_accept_retry(uv_timer_t *t) {
  net_t *net = t->data;
  if (net->stopping)
    return;
  int rc = uv_poll_start(&net->listen_poll, UV_READABLE, on_listen);
  if (rc) {
    LOG_ERROR("cannot poll the listening socket: %s", uv_strerror(rc));
    rc = uv_timer_start(&net->accept_retry, on_accept_retry, ACCEPT_RETRY_MS,
                        0);
    if (rc)
      LOG_ERROR("cannot retry accepting: %s", uv_strerror(rc));
  }
}

static void on_listen(uv_poll_t *p, int status, int events) {
  net_t *net = p->data;
  uint64_t skipped;
  (void)events;
  if (status < 0) {
    LOG_WARN("polling the listening socket: %s", uv_strerror(status));
    return;
  }
  for (;;) {
    int fd = accept4(net->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EINTR || err == ECONNABORTED)
        continue;
      if (err == EAGAIN || err == EWOULDBLOCK)
        return;
      /* out of descriptors or memory: the pending connection stays in the
       * backlog and the poll would fire again at once; pause instead */
      if (ratelimit_pass(&net->accept_log, &skipped))
        LOG_WARN("accept: %s (%llu more since the last warning); pausing "
                 "new connections for %d ms", strerror(err),
                 (unsigned long long)skipped, ACCEPT_RETRY_MS);
      int rc = uv_poll_stop(&net->listen_poll);
      if (rc)
        LOG_ERROR("cannot pause the listening socket: %s", uv_strerror(rc));
      rc = uv_timer_start(&net->accept_retry, on_accept_retry,
                              ACCEPT_RETRY_MS, 0);
      if (rc)
        LOG_ERROR("cannot retry accepting: %s", uv_strerror(rc));
      return;
    }
    if (atomic_fetch_add(&net->shared.open_conns, 1) >=
            net->srv.cfg.max_connections &&
        !evict_for_room(net)) {
      atomic_fetch_sub(&net->shared.open_conns, 1);
      uint64_t n;
      if (embps_metrics_refused(&n)) /* one line a second at most */
        LOG_WARN("refusing connections: --max-connections %u reached (%llu "
                 "refused since the last such line)",
                 net->srv.cfg.max_connections, (unsigned long long)n);
      refuse_fd(net, fd);
      continue;
    }
    deal_fd(net, fd);
  }
}

/* ------------------------------------------------------------ stopping */

/* /readyz belongs to the server that serves it (metrics.h). */
static void set_ready(net_t *net, int ready) {
  if (net->metrics_started)
    embps_metrics_set_ready(ready);
}

/* Tells every I/O loop to finish what it holds and end (drain_check). */
static void io_drain_all(net_t *net) {
  for (uint32_t i = 0; i < net->n_io; i++)
    embps_io_drain(net->io[i]);
}

/* On the main loop: stop accepting and reading. The I/O loops end once
 * every request already read is answered, the main loop once its handles
 * are closed (stop_async does not keep it alive). */
static void begin_stop(net_t *net) {
  if (net->stopping)
    return;
  net->stopping = 1;
  set_ready(net, 0);
  embps_notify_stopping();
  uv_close((uv_handle_t *)&net->listen_poll, NULL);
  uv_close((uv_handle_t *)&net->accept_retry, NULL);
  /* the signal handles stay (unreferenced: they keep no loop alive), so a
   * second SIGTERM or a SIGHUP while stopping neither kills nor reloads */
  embps_apply_drain(net->srv.apply);
  embps_feed_drain(net->srv.feed);
  embps_snapshots_drain(net->srv.snap);
  io_drain_all(net);
}

static void on_signal(uv_signal_t *s, int signum) {
  net_t *net = s->data;
  if (net->stopping) {
    LOG_INFO("signal %d: already stopping", signum);
    return;
  }
  LOG_INFO("signal %d: finishing in-flight requests, then exiting", signum);
  begin_stop(net);
}

/* SIGHUP: reload what can be (embps_server_reload); never stops. */
static void on_reload(uv_signal_t *s, int signum) {
  (void)signum;
  net_t *net = s->data;
  if (net->stopping)
    LOG_INFO("SIGHUP: stopping, nothing reloaded");
  else
    embps_server_reload(&net->srv, "SIGHUP");
}

static void on_stop(uv_async_t *a) {
  net_t *net = a->data;
  if (!net->stopping)
    LOG_INFO("stop requested: finishing in-flight requests");
  begin_stop(net);
}

/* Binds and listens; returns the fd, or a negative code with a logged
 * reason. */
static int listen_on(const embps_server_config_t *cfg, int *port_out) {
  char port[16];
  snprintf(port, sizeof port, "%d", cfg->listen_port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
  struct addrinfo *res;
  int rc = getaddrinfo(cfg->listen_host, port, &hints, &res);
  if (rc) {
    LOG_ERROR("cannot resolve %s: %s", cfg->listen_host, gai_strerror(rc));
    return EMBPS_EINVAL;
  }
  int fd = -1, err = EADDRNOTAVAIL; /* never left: at least one address */
  for (struct addrinfo *a = res; a; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0)
      break;
    err = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) {
    LOG_ERROR("cannot listen on %s:%d: %s", cfg->listen_host,
              cfg->listen_port, strerror(err));
    return -err;
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl)) {
    err = errno;
    LOG_ERROR("cannot read the port of %s:%d: %s", cfg->listen_host,
              cfg->listen_port, strerror(err));
    close(fd);
    return -err;
  }
  *port_out = ntohs(ss.ss_family == AF_INET6
                        ? ((struct sockaddr_in6 *)&ss)->sin6_port
                        : ((struct sockaddr_in *)&ss)->sin_port);
  return fd;
}

/* Writes the port to path via a temporary file and rename, so a reader
 * never sees a partial number. 0 or -errno. */
static int write_port_file(const char *path, int port) {
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f)
    return -errno;
  fprintf(f, "%d\n", port);
  if (fclose(f) != 0 || rename(tmp, path) != 0) {
    int err = errno;
    unlink(tmp);
    return -err;
  }
  return 0;
}

/* Every connection takes a descriptor: make RLIMIT_NOFILE's soft limit
 * room for --max-connections, as far as the hard limit allows. */
static void check_nofile(const embps_server_config_t *cfg) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl))
    return;
  rlim_t want = (rlim_t)cfg->max_connections + FD_RESERVE +
                4 * (rlim_t)cfg->io_threads;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
    rlim_t old = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want
                      ? want
                      : rl.rlim_max;
    if (rl.rlim_cur > old && setrlimit(RLIMIT_NOFILE, &rl) == 0)
      LOG_INFO("raised the open-file limit from %llu to %llu for "
               "--max-connections %u", (unsigned long long)old,
               (unsigned long long)rl.rlim_cur, cfg->max_connections);
    else
      rl.rlim_cur = old;
  }
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want)
    LOG_WARN("open-file limit %llu (hard %llu) is below what --max-"
             "connections %u needs (%llu): past about %llu connections, "
             "new ones wait in the backlog (raise it with ulimit -n)",
             (unsigned long long)rl.rlim_cur,
             (unsigned long long)rl.rlim_max, cfg->max_connections,
             (unsigned long long)want,
             (unsigned long long)(rl.rlim_cur > FD_RESERVE
                                      ? rl.rlim_cur - FD_RESERVE
                                      : 0));
}

/* The main loop's handles: the listener, its retry timer, the stop call
 * and, for the daemon, SIGTERM and SIGINT (stop) and SIGHUP (reload),
 * unreferenced. 0 or a negative code (the handles set up are closed by
 * loop_close). */
static int loop_start(net_t *net) {
  int rc = uv_loop_init(&net->loop);
  if (rc)
    return rc;
  net->loop_ready = 1;
  rc = uv_poll_init(&net->loop, &net->listen_poll, net->listen_fd);
  net->listen_poll.data = net;
  if (!rc)
    rc = uv_timer_init(&net->loop, &net->accept_retry);
  net->accept_retry.data = net;
  if (!rc)
    rc = uv_async_init(&net->loop, &net->stop_async, on_stop);
  net->stop_async.data = net;
  if (!rc) {
    uv_unref((uv_handle_t *)&net->stop_async);
    rc = uv_poll_start(&net->listen_poll, UV_READABLE, on_listen);
  }
  if (rc || !net->srv.cfg.handle_signals)
    return rc;
  rc = uv_signal_init(&net->loop, &net->sig_term);
  if (!rc)
    rc = uv_signal_init(&net->loop, &net->sig_int);
  if (!rc)
    rc = uv_signal_init(&net->loop, &net->sig_hup);
  net->sig_term.data = net->sig_int.data = net->sig_hup.data = net;
  if (!rc)
    rc = uv_signal_start(&net->sig_term, on_signal, SIGTERM);
  if (!rc)
    rc = uv_signal_start(&net->sig_int, on_signal, SIGINT);
  if (!rc)
    rc = uv_signal_start(&net->sig_hup, on_reload, SIGHUP);
  uv_unref((uv_handle_t *)&net->sig_term);
  uv_unref((uv_handle_t *)&net->sig_int);
  uv_unref((uv_handle_t *)&net->sig_hup);
  return rc;
}

/* ------------------------------------------------------------ lifecycle */

static net_t *net_of(embps_server_t *srv) {
  return (net_t *)((char *)srv - offsetof(net_t, srv));
}

/* What /metrics reads from the durable layer and the cluster. */
static const embps_metrics_hooks_t metrics_hooks = {
    .durable_stats = embps_durable_stats,
    .durable_space = embps_durable_space,
    .durable_stall_ms = embps_durable_stall_ms,
    .cluster_counts = embps_cluster_counts,
    .cluster_ready = embps_cluster_ready,
    .repl_stats = embps_failover_stats,
    .coord_status = embps_failover_status,
    .coord_members = embps_failover_members,
    .repl_followers = embps_follow_followers,
    .repl_ready = embps_follow_ready,
    .sync_degrade = embps_feed_degrade_figures,
};

/* The durable layer's way back into the core (embps_durable_hooks_t). */
static void durable_submit(void *ctx, embps_request_t *req) {
  embps_server_t *srv = ctx;
  embps_apply_submit(srv->apply, req);
}

static void durable_restored(void *ctx, uint64_t lsn, uint32_t epoch,
                             embps_seen_t *seen) {
  embps_server_t *srv = ctx;
  embps_apply_restore(srv->apply, lsn, epoch, seen);
}

/* A snapshot session keeps the feed's records after its LSN (a
 * follower's copy fetches them next: copy.h); the pin's number + 1 is its
 * handle. With --data-dir the log keeps them (the session pins it). */
static void *snapshot_pin(void *ctx, uint64_t lsn) {
  embps_server_t *srv = ctx;
  uint32_t pin;
  if (srv->dur)
    return NULL;
  if (embps_feed_pin(srv->feed, lsn + 1, &pin)) {
    LOG_WARN("snapshot session: the replication backlog cannot keep the "
             "records after LSN %" PRIu64 ": a follower copying it may have "
             "to copy again", lsn);
    return NULL;
  }
  return (void *)(uintptr_t)(pin + 1);
}

static int sink_put(void *ctx, const void *p, size_t n, char *err,
                    size_t err_len) {
  embps_ckpt_sink_t *b = ctx;
  return b->write(b, p, n, err, err_len);
}

/* The records after..upto a pin kept, as one log segment of the stream
 * (as a data dir's segments are copied). */
static int snapshot_records(void *ctx, void *pin, uint64_t after,
                            uint64_t upto, embps_ckpt_stream_t *out,
                            char *err, size_t err_len) {
  embps_server_t *srv = ctx;
  if (upto <= after)
    return 0;
  uint8_t h[EMBPS_WAL_HEADER_BYTES];
  embps_wal_segment_header(h, after + 1);
  if (embps_ckpt_stream_log(out, after + 1, err, err_len))
    return -1;
  int rc = out->base.write(&out->base, h, sizeof h, err, err_len);
  if (!rc)
    rc = embps_feed_pinned_records(srv->feed, (uint32_t)((uintptr_t)pin - 1),
                                   after, upto, sink_put, &out->base, err,
                                   err_len);
  return out->base.end(&out->base, rc, err, err_len);
}

static void snapshot_unpin(void *ctx, void *pin) {
  embps_server_t *srv = ctx;
  embps_feed_unpin(srv->feed, (uint32_t)((uintptr_t)pin - 1));
}

/* Without --data-dir: a primary begins epoch 1 at LSN 1; a follower
 * starts empty, its history its primary's. 0 or -ENOMEM. */
static int start_memory_only(embps_server_t *srv) {
  embps_history_t h;
  embps_history_init(&h);
  embps_seen_t seen;
  embps_seen_init(&seen);
  const int follower = embps_failover_starts_following(srv);
  int rc = follower ? 0 : embps_history_add(&h, 1, 1);
  if (!rc)
    rc = embps_feed_set_history(srv->feed, &h);
  if (!rc)
    embps_apply_restore(srv->apply, 0, follower ? 0 : 1, &seen);
  embps_history_close(&h);
  embps_seen_close(&seen);
  return rc;
}

/* create's steps in order; on failure the caller undoes those done. */
static int net_start(net_t *net) {
  embps_server_t *srv = &net->srv;
  const embps_server_config_t *cfg = &srv->cfg;
  int rc = embps_apply_start(srv, &srv->apply);
  if (rc) {
    LOG_ERROR("cannot start the apply thread");
    return rc;
  }
  /* --coordinator: who to follow, from etcd (sets cfg->follow) */
  if (embps_failover_prepare(srv))
    return EMBPS_EINVAL;
  rc = embps_feed_create(srv, &srv->feed);
  if (rc) {
    LOG_ERROR("cannot start the replication feed");
    return rc;
  }
  const int follower = embps_failover_starts_following(srv);
  atomic_store(&srv->role, follower ? EMBPS_ROLE_FOLLOWER
                                    : EMBPS_ROLE_PRIMARY);
  if (follower && embps_follow_create(srv))
    return EMBPS_EINVAL;
  /* a primary of another layout: refused before anything is served */
  if ((rc = embps_follow_probe(srv)))
    return rc;
  if ((rc = embps_snapshots_create(srv, &srv->snap)))
    return rc;
  const embps_snapshot_feed_t snap_feed = {
      .pin = snapshot_pin, .unpin = snapshot_unpin,
      .records = snapshot_records, .ctx = srv};
  embps_snapshot_set_feed(srv->snap, &snap_feed);
  /* before the restore: /healthz answers during it */
  if (embps_metrics_start(srv, &metrics_hooks))
    return EMBPS_EINVAL;
  net->metrics_started = cfg->metrics_host[0] != 0;
  if (cfg->data_dir[0]) { /* restored before anyone can connect */
    char err[2048];
    const embps_durable_hooks_t hooks = {
        .submit = durable_submit,
        .restored = durable_restored,
        .at_marker = embps_evict_at_checkpoint,
        .join = srv->failover    ? embps_failover_join
                : cfg->follow[0] ? embps_follow_join
                                 : NULL,
        .ctx = srv,
    };
    if (embps_durable_open(srv, &hooks, err, sizeof err)) {
      LOG_ERROR("%s", err);
      return EMBPS_EIO;
    }
  } else if (start_memory_only(srv)) {
    return EMBPS_ENOMEM;
  }
  rc = listen_on(cfg, &net->port);
  if (rc < 0)
    return rc;
  net->listen_fd = rc;
  net->io = calloc(cfg->io_threads, sizeof *net->io);
  if (!net->io)
    return EMBPS_ENOMEM;
  for (; net->n_io < cfg->io_threads; net->n_io++) {
    rc = embps_io_start(srv, &net->shared, &net->io[net->n_io]);
    if (rc) {
      LOG_ERROR("cannot start I/O thread %u: %s", net->n_io, uv_strerror(rc));
      return rc;
    }
  }
  rc = loop_start(net);
  if (rc) {
    LOG_ERROR("cannot set up the main loop: %s", uv_strerror(rc));
    return rc;
  }
  if (embps_cluster_start(srv)) /* /readyz: the tables the others hold */
    return EMBPS_EINVAL;
  net->cluster_started = cfg->cluster_servers != NULL;
  if (srv->follow && embps_follow_run(srv, net->port))
    return EMBPS_EINVAL;
  if (embps_failover_start(srv, net->port)) /* elects, or follows */
    return EMBPS_EINVAL;
  if (cfg->port_file[0] &&
      (rc = write_port_file(cfg->port_file, net->port))) {
    LOG_ERROR("cannot write --port-file %s: %s", cfg->port_file,
              strerror(-rc));
    return rc;
  }
  /* Nothing can fail any more. The one line scripts wait for; printed
   * whatever the log level. */
  embps_log_ready("embps-server %s ready on %s:%d (io-threads %u, shards %u, "
                  "cluster %u/%u)", EMBPS_VERSION_STRING, cfg->listen_host,
                  net->port, cfg->io_threads, cfg->shards, cfg->cluster_index,
                  cfg->cluster_size);
  set_ready(net, 1);
  embps_notify_ready(cfg->listen_host, net->port); /* systemd Type=notify */
  return 0;
}

/* Stops the threads net_start started, in the reverse order, once the
 * I/O loops have drained (or telling them to, when they never served),
 * with the final checkpoint. Returns the exit status; runs once. */
static int net_stop_threads(net_t *net) {
  embps_server_t *srv = &net->srv;
  if (net->threads_stopped)
    return 0;
  net->threads_stopped = 1;
  if (net->cluster_started)
    embps_cluster_stop();
  embps_failover_stop(srv); /* a primary gives its lease back */
  embps_follow_destroy(srv); /* hands the apply thread nothing more */
  if (!net->stopping) {
    embps_feed_drain(srv->feed);
    io_drain_all(net);
  }
  for (uint32_t i = 0; i < net->n_io; i++)
    embps_io_join(net->io[i]);
  embps_snapshots_destroy(srv->snap); /* no READ can come any more */
  srv->snap = NULL;
  int status = 0;
  if (srv->apply) {
    status = embps_durable_shutdown(srv) ? 1 : 0; /* final checkpoint */
    embps_apply_stop(srv->apply);
    srv->apply = NULL;
  }
  if (net->metrics_started)
    embps_metrics_stop(); /* before what it reads goes */
  embps_feed_destroy(srv->feed);
  srv->feed = NULL;
  embps_durable_close(srv);
  return status;
}

/* Frees net once its threads are stopped. */
static void net_free(net_t *net) {
  for (uint32_t i = 0; i < net->n_io; i++)
    embps_io_close(net->io[i]);
  free(net->io);
  if (net->loop_ready) /* before the fd its poll handle watches */
    embps_loop_close(&net->loop, "the main loop");
  if (net->listen_fd >= 0)
    close(net->listen_fd);
  embps_registry_close(&net->srv.registry);
  embps_bufpool_close(&net->srv.bodies);
  embps_auth_close(&net->srv.auth);
  free(net);
}

int embps_server_create(const embps_server_config_t *cfg,
                        embps_server_t **out) {
  *out = NULL;
  net_t *net = calloc(1, sizeof *net);
  if (!net)
    return EMBPS_ENOMEM;
  net->listen_fd = -1;
  embps_server_t *srv = &net->srv;
  srv->cfg = *cfg;
  srv->start_ns = embps_now_ns();
  srv->stop = embps_server_stop;
  embps_registry_init(&srv->registry);
  embps_bufpool_init(&srv->bodies, EMBPS_MMAP_THRESHOLD, EMBPS_BODY_POOL_BYTES);
  embps_tokens_t tokens;
  embps_server_config_tokens(cfg, &tokens);
  embps_auth_init(&srv->auth, &tokens);
  if (cfg->insecure && !cfg->has_token)
    LOG_WARN("--insecure: serving %s without an auth token; anyone who can "
             "reach it can read, change and drop every table",
             cfg->listen_host);
  check_nofile(cfg);
  int rc = net_start(net);
  if (rc) {
    net_stop_threads(net);
    net_free(net);
    return rc;
  }
  *out = srv;
  return 0;
}

int embps_server_port(const embps_server_t *srv) {
  return net_of((embps_server_t *)srv)->port;
}

int embps_server_run(embps_server_t *srv) {
  net_t *net = net_of(srv);
  for (;;) {
    if (uv_run(&net->loop, UV_RUN_DEFAULT))
      LOG_WARN("the main loop stopped with handles active");
    if (net->stopping)
      break;
    /* nothing polls the listener any more (on_accept_retry failed) */
    LOG_ERROR("cannot accept connections any more: stopping");
    begin_stop(net);
  }
  int status = net_stop_threads(net);
  LOG_INFO("stopped");
  return atomic_load(&srv->exit_status) ? atomic_load(&srv->exit_status)
                                        : status;
}

void embps_server_stop(embps_server_t *srv) {
  /* 0 on a handle not closed (until destroy); nothing here may log or
   * lock: a signal handler may call this */
  (void)uv_async_send(&net_of(srv)->stop_async);
}

void embps_server_destroy(embps_server_t *srv) {
  if (!srv)
    return;
  net_t *net = net_of(srv);
  net_stop_threads(net); /* when run was never called */
  net_free(net);
}
