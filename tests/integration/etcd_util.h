/* etcd_util.h - a real etcd for the tests (the coordinator's tests and
 * the etcd client's): members started on 127.0.0.1 with free ports and a
 * private data directory, waited for until healthy, killed, stopped,
 * frozen and restarted on the same ports and data. EMBPS_ETCD_BIN is the
 * etcd found at configure time (scripts/install-deps.sh installs Debian's
 * etcd-server). */
#ifndef EMBPS_TEST_ETCD_UTIL_H
#define EMBPS_TEST_ETCD_UTIL_H
#include <stddef.h>
#include <sys/types.h>

typedef struct {
  pid_t pid;       /* 0: not running */
  int client_port, peer_port;
  char name[16];
  char dir[256];   /* private: data/ and etcd.log */
  char log_file[300];
  char cluster[1024]; /* --initial-cluster */
  char token[256];    /* --initial-cluster-token: the same for all */
  char url[64];    /* etcd://127.0.0.1:CLIENT_PORT */
} it_etcd_t;

/* Starts n members of one cluster (n = 1: a single etcd) and waits up to
 * 30 s until each is healthy. url (cap bytes) gets etcd://... listing
 * every member. 0, or -1 (logs printed, nothing left running). */
int it_etcd_start(it_etcd_t *m, int n, char *url, size_t cap);
/* Starts a stopped member again on its ports and data; with wait, until
 * healthy (a member of a cluster needs a quorum for that). 0 or -1. */
int it_etcd_restart(it_etcd_t *m, int wait);
/* kill -9 and reap (data kept). */
void it_etcd_kill(it_etcd_t *m);
/* Waits up to timeout_ms until the member answers /health true. */
int it_etcd_wait_healthy(const it_etcd_t *m, int timeout_ms);
/* Kills (if running) and removes the directory of each of n members. */
void it_etcd_destroy(it_etcd_t *m, int n);
void it_etcd_dump_log(const it_etcd_t *m);
/* A free TCP port on 127.0.0.1 (bound then released). */
int it_free_port(void);
#endif
