/* cluster.c - see cluster.h. */
#include "cluster.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "embps/embps.h"

#define LOG_AGAIN_NS (60ull * 1000000000ull) /* a peer still down: re-log */
#define BODY_TABLES_MAX 50 /* missing tables named in one /readyz body */

typedef struct {
  char addr[300];
  embps_client_t *client; /* the thread's own */
  /* under cl.mu: what the last round found */
  int answered;
  char why[512]; /* why it could not be asked */
  embps_table_info_t *tables; /* sorted by name */
  size_t n_tables;
  /* the thread's own: rate limit of the "cannot ask" line */
  int down;
  uint64_t logged_ns;
} peer_t;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t wake;
  pthread_t tid;
  int started, stop, rounds; /* stop and rounds under mu */
  embps_server_t *srv;
  char *servers;
  char token[EMBPS_TOKEN_MAX + 1];
  uint32_t n, self;
  peer_t *peer;
  embps_client_t *self_client; /* --complete-tables */
} cl = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* ------------------------------------------------------------ the flag */

int embps_cluster_config_check(embps_server_config_t *cfg, char *err,
                               size_t err_len) {
  if (!cfg->cluster_servers) {
    if (cfg->complete_tables) {
      snprintf(err, err_len, "--complete-tables needs --cluster-servers");
      return -1;
    }
    if (!cfg->cluster_size)
      cfg->cluster_size = 1;
    return 0;
  }
  const char *s = cfg->cluster_servers;
  uint32_t n = 0;
  int self_port = -1;
  for (const char *p = s;; n++) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char entry[300], host[256];
    int port;
    if (len >= sizeof entry || n >= 65536) {
      snprintf(err, err_len, "--cluster-servers: entry %u is too long, or "
               "more than 65536 entries", n);
      return -1;
    }
    memcpy(entry, p, len);
    entry[len] = 0;
    if (embps_parse_hostport(entry, host, sizeof host, &port) || !port) {
      snprintf(err, err_len, "--cluster-servers: entry %u \"%s\" is not "
               "HOST:PORT", n, entry);
      return -1;
    }
    if (n == cfg->cluster_index)
      self_port = port;
    if (!end)
      break;
    p = end + 1;
  }
  n++;
  if (cfg->cluster_size && cfg->cluster_size != n) {
    snprintf(err, err_len, "--cluster-servers lists %u servers but "
             "--cluster-size is %u", n, cfg->cluster_size);
    return -1;
  }
  cfg->cluster_size = n;
  if (cfg->cluster_index >= n) {
    snprintf(err, err_len, "--cluster-index %u is past the %u servers of "
             "--cluster-servers", cfg->cluster_index, n);
    return -1;
  }
  if (cfg->listen_port && self_port != cfg->listen_port) {
    snprintf(err, err_len, "--cluster-servers entry %u (this server, "
             "--cluster-index) has port %d but --listen has port %d",
             cfg->cluster_index, self_port, cfg->listen_port);
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------ the thread */

static int by_name(const void *a, const void *b) {
  return strcmp(((const embps_table_info_t *)a)->spec.name,
                ((const embps_table_info_t *)b)->spec.name);
}

/* The options of a member client: the current token (auth.h: a reload
 * may have changed it since the last client). */
static embps_client_options_t options(void) {
  embps_auth_current(&cl.srv->auth, cl.token, sizeof cl.token);
  embps_client_options_t o = {.size = sizeof o,
                              .servers = cl.servers,
                              .token = cl.token[0] ? cl.token : NULL,
                              .timeout_ms = EMBPS_CLUSTER_PEER_TIMEOUT_MS,
                              .retry_ms = -1};
  return o;
}

/* A connected member client for server i in *c (kept between rounds), or
 * an error with the reason in why. */
static int member(uint32_t i, embps_client_t **c, char *why, size_t len) {
  if (*c)
    return 0;
  embps_client_options_t o = options();
  return embps_client_create_member(&o, i, c, why, len);
}

/* Asks peer i for its tables; records the answer, or why there is none. */
static void ask(uint32_t i) {
  peer_t *p = &cl.peer[i];
  char why[512] = "";
  embps_table_info_t *t = NULL;
  size_t n = 0;
  int rc = 0;
  /* a connection kept from the last round may have been closed since (the
   * peer restarted): then one more try on a new one */
  for (int fresh = !p->client, tries = 0; tries < 1 + !fresh; tries++) {
    rc = member(i, &p->client, why, sizeof why);
    if (rc)
      break;
    rc = embps_list_tables(p->client, &t, &n);
    if (!rc)
      break;
    snprintf(why, sizeof why, "%s", embps_client_last_error(p->client));
    embps_client_destroy(p->client);
    p->client = NULL;
  }
  if (!rc && n > 1)
    qsort(t, n, sizeof *t, by_name);
  pthread_mutex_lock(&cl.mu);
  free(p->tables);
  p->tables = rc ? NULL : t;
  p->n_tables = rc ? 0 : n;
  p->answered = !rc;
  snprintf(p->why, sizeof p->why, "%s", rc ? why : "");
  pthread_mutex_unlock(&cl.mu);

  uint64_t now = embps_now_ns();
  if (rc && (!p->down || now - p->logged_ns >= LOG_AGAIN_NS)) {
    LOG_WARN("cluster: cannot ask server %u (%s) which tables it holds: "
             "%s; /readyz does not count it until it answers", i, p->addr,
             why);
    p->logged_ns = now;
  } else if (!rc && p->down) {
    LOG_INFO("cluster: server %u (%s) answers again", i, p->addr);
  }
  p->down = rc != 0;
}

/* 1 when this server holds a table named `name`. */
static int held_here(const char *name) {
  embps_table_t *t = embps_registry_get(&cl.srv->registry, name);
  if (!t)
    return 0;
  embps_table_unref(t);
  return 1;
}

/* 1 when a peer before i that answered holds `name` (so that a table
 * missing here is counted once). */
static int held_before_locked(uint32_t i, const embps_table_info_t *t) {
  for (uint32_t j = 0; j < i; j++)
    if (cl.peer[j].answered && cl.peer[j].n_tables &&
        bsearch(t, cl.peer[j].tables, cl.peer[j].n_tables, sizeof *t,
                by_name))
      return 1;
  return 0;
}

/* Calls each(ctx, peer, table) once per table missing here, with the
 * first peer that holds it; returns how many. */
static size_t missing_locked(void (*each)(void *, uint32_t,
                                          const embps_table_info_t *),
                             void *ctx) {
  size_t n = 0;
  for (uint32_t i = 0; i < cl.n; i++) {
    const peer_t *p = &cl.peer[i];
    for (size_t k = 0; p->answered && k < p->n_tables; k++) {
      if (held_here(p->tables[k].spec.name) ||
          held_before_locked(i, &p->tables[k]))
        continue;
      if (each)
        each(ctx, i, &p->tables[k]);
      n++;
    }
  }
  return n;
}

typedef struct {
  embps_table_spec_t *spec;
  uint32_t *from;
  size_t n;
} to_create_t;

static void note_missing(void *ctx, uint32_t peer,
                         const embps_table_info_t *t) {
  to_create_t *c = ctx;
  c->spec[c->n] = t->spec;
  c->from[c->n++] = peer;
}

/* --complete-tables: creates here, from a peer's spec, every table some
 * peer holds and this server lacks, through this server's own front door
 * (a member client for itself) so the create is validated and logged like
 * any other. */
static void complete(void) {
  to_create_t c = {0};
  pthread_mutex_lock(&cl.mu);
  size_t n = missing_locked(NULL, NULL);
  if (n) {
    c.spec = malloc(n * sizeof *c.spec);
    c.from = malloc(n * sizeof *c.from);
    if (c.spec && c.from)
      missing_locked(note_missing, &c);
  }
  pthread_mutex_unlock(&cl.mu);
  char why[512];
  for (size_t i = 0; i < c.n; i++) {
    const embps_table_spec_t *s = &c.spec[i];
    /* the peer still holds it (not dropped from the cluster since) */
    embps_client_t *peer = cl.peer[c.from[i]].client;
    embps_table_info_t info;
    if (!peer || embps_describe_table(peer, s->name, &info))
      continue;
    if (member(cl.self, &cl.self_client, why, sizeof why)) {
      LOG_ERROR("--complete-tables: cannot reach this server through "
                "--cluster-servers entry %u (%s): %s", cl.self,
                cl.peer[cl.self].addr, why);
      break;
    }
    int rc = embps_create_table_ex(cl.self_client, s, EMBPS_CREATE_EXIST_OK);
    if (rc) {
      LOG_ERROR("--complete-tables: cannot create table \"%s\" here from "
                "server %u's spec: %s", s->name, c.from[i],
                embps_client_last_error(cl.self_client));
      embps_client_destroy(cl.self_client);
      cl.self_client = NULL;
      continue;
    }
    LOG_WARN("--complete-tables: CREATED table \"%s\" on this server from "
             "the spec server %u (%s) holds (dim %u, %s, %s, optimizer %s): "
             "its rows on this server start from the table's initializer, "
             "whatever they were before this server lost them", s->name,
             c.from[i], cl.peer[c.from[i]].addr, s->dim,
             s->dynamic ? "dynamic" : "dense", embps_dtype_name(s->dtype),
             embps_optimizer_name(s->optimizer));
  }
  free(c.spec);
  free(c.from);
}

static int stopping(void) {
  pthread_mutex_lock(&cl.mu);
  int stop = cl.stop;
  pthread_mutex_unlock(&cl.mu);
  return stop;
}

static void *run(void *arg) {
  (void)arg;
  pthread_mutex_lock(&cl.mu);
  while (!cl.stop) {
    pthread_mutex_unlock(&cl.mu);
    for (uint32_t i = 0; i < cl.n && !stopping(); i++)
      if (i != cl.self)
        ask(i);
    if (cl.srv->cfg.complete_tables)
      complete();
    pthread_mutex_lock(&cl.mu);
    cl.rounds++;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += EMBPS_CLUSTER_CHECK_S;
    while (!cl.stop &&
           pthread_cond_timedwait(&cl.wake, &cl.mu, &until) != ETIMEDOUT) {
    }
  }
  pthread_mutex_unlock(&cl.mu);
  return NULL;
}

int embps_cluster_start(embps_server_t *srv) {
  const embps_server_config_t *cfg = &srv->cfg;
  if (!cfg->cluster_servers)
    return 0;
  if (cl.started) {
    LOG_ERROR("--cluster-servers: another server of this process runs it");
    return -1;
  }
  cl.srv = srv;
  cl.n = cfg->cluster_size;
  cl.self = cfg->cluster_index;
  cl.servers = strdup(cfg->cluster_servers);
  cl.peer = calloc(cl.n, sizeof *cl.peer);
  if (!cl.peer || !cl.servers) {
    LOG_ERROR("--cluster-servers: out of memory");
    free(cl.peer);
    free(cl.servers);
    cl.peer = NULL;
    cl.servers = NULL;
    return -1;
  }
  const char *p = cl.servers;
  for (uint32_t i = 0; i < cl.n; i++) {
    size_t len = strcspn(p, ",");
    snprintf(cl.peer[i].addr, sizeof cl.peer[i].addr, "%.*s", (int)len, p);
    p += len + (p[len] == ',');
  }
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&cl.wake, &attr);
  pthread_condattr_destroy(&attr);
  pthread_mutex_lock(&cl.mu); /* the HTTP thread reads it */
  cl.stop = 0;
  cl.started = 1;
  pthread_mutex_unlock(&cl.mu);
  if (pthread_create(&cl.tid, NULL, run, NULL)) {
    pthread_mutex_lock(&cl.mu);
    cl.started = 0;
    free(cl.peer);
    free(cl.servers);
    cl.peer = NULL;
    cl.servers = NULL;
    pthread_mutex_unlock(&cl.mu);
    pthread_cond_destroy(&cl.wake);
    LOG_ERROR("--cluster-servers: cannot start the cluster thread");
    return -1;
  }
  LOG_INFO("cluster: asking the other %u server(s) which tables they hold "
           "every %d s; /readyz waits for every table they hold%s",
           cl.n - 1, EMBPS_CLUSTER_CHECK_S,
           cfg->complete_tables ? "; --complete-tables creates the missing "
                                  "ones here"
                                : "");
  return 0;
}

void embps_cluster_stop(void) {
  if (!cl.started)
    return;
  pthread_mutex_lock(&cl.mu);
  cl.stop = 1;
  pthread_cond_signal(&cl.wake);
  pthread_mutex_unlock(&cl.mu);
  pthread_join(cl.tid, NULL);
  pthread_mutex_lock(&cl.mu); /* the HTTP thread may still ask */
  cl.started = 0;
  for (uint32_t i = 0; i < cl.n; i++) {
    embps_client_destroy(cl.peer[i].client);
    free(cl.peer[i].tables);
  }
  embps_client_destroy(cl.self_client);
  cl.self_client = NULL;
  free(cl.peer);
  cl.peer = NULL;
  free(cl.servers);
  cl.servers = NULL;
  pthread_mutex_unlock(&cl.mu);
  pthread_cond_destroy(&cl.wake);
}

/* ------------------------------------------------------------ readiness */

typedef struct {
  FILE *f;
  size_t named;
} body_t;

static void name_missing(void *ctx, uint32_t peer,
                         const embps_table_info_t *t) {
  body_t *b = ctx;
  if (b->named++ < BODY_TABLES_MAX)
    fprintf(b->f, "missing table \"%s\" held by server %u (%s)\n",
            t->spec.name, peer, cl.peer[peer].addr);
}

/* The body of /readyz; 1 when ready. */
static int readiness_locked(FILE *f) {
  if (!cl.rounds) {
    fprintf(f, "not ready: asking the other servers which tables they "
            "hold\n");
    return 0;
  }
  body_t b = {.f = f};
  size_t missing = missing_locked(name_missing, &b);
  if (missing > BODY_TABLES_MAX)
    fprintf(f, "... and %zu more missing tables\n",
            missing - BODY_TABLES_MAX);
  for (uint32_t i = 0; i < cl.n; i++)
    if (i != cl.self && !cl.peer[i].answered)
      fprintf(f, "server %u (%s) not asked (does not count): %s\n", i,
              cl.peer[i].addr, cl.peer[i].why);
  if (missing)
    fprintf(f, "not ready: %zu table(s) the cluster holds are missing here "
            "(restore this server's data dir, or complete them: embps "
            "complete-table NAME, their rows here starting from the "
            "initializer)\n", missing);
  else
    fprintf(f, "ready\n");
  return missing == 0;
}

int embps_cluster_ready(char **body, size_t *len) {
  FILE *f = open_memstream(body, len);
  if (!f) {
    *body = NULL;
    *len = 0;
    return 0;
  }
  pthread_mutex_lock(&cl.mu);
  int ready = 1;
  if (cl.started)
    ready = readiness_locked(f);
  else
    fprintf(f, "ready\n");
  pthread_mutex_unlock(&cl.mu);
  if (fclose(f)) {
    free(*body);
    *body = NULL;
    *len = 0;
  }
  return ready;
}

int embps_cluster_counts(size_t *missing, size_t *unreachable,
                         size_t *peers) {
  pthread_mutex_lock(&cl.mu);
  if (!cl.started) {
    pthread_mutex_unlock(&cl.mu);
    return 0;
  }
  *missing = cl.rounds ? missing_locked(NULL, NULL) : 0;
  *unreachable = 0;
  for (uint32_t i = 0; i < cl.n; i++)
    *unreachable += cl.rounds && i != cl.self && !cl.peer[i].answered;
  *peers = cl.n - 1;
  pthread_mutex_unlock(&cl.mu);
  return 1;
}
