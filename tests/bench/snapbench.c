/* snapbench.c - the snapshot stream against the loopback limit
 * (tests/bench/snapshot.sh runs it).
 *
 *   snapbench fill ADDR NAME ROWS DIM dense|dynamic
 *       creates an Adagrad table of ROWS x DIM on the server at ADDR and
 *       pushes every id 0..ROWS-1 once (every row made)
 *   snapbench raw BYTES [CHUNK]
 *       the loopback limit for the same traffic: a thread writes BYTES
 *       from memory in CHUNK-byte writes (default 8 MiB) into a loopback
 *       TCP connection, this thread reads them into a CHUNK-byte buffer
 *   snapbench drain ADDR [CHUNK [DEPTH]]
 *       a snapshot of the server at ADDR read whole (READs of CHUNK bytes,
 *       DEPTH in flight: the library's defaults, 8 MiB and 4) and thrown
 *       away: the server and the wire
 *   snapbench load ADDR SHARDS [CHUNK [DEPTH]]
 *       the same snapshot loaded as it arrives into tables of SHARDS
 *       shards in this process (embps_ckpt_load_stream: a follower's
 *       path, no file written), then freed
 * Each measurement prints one line "MODE bytes B seconds S gbps G" (and
 * for load "rows R user U sys K": the rows loaded and this process's CPU
 * seconds, the kernel's including the first touch of the tables' fresh
 * memory): the stream's bytes over the wall time from BEGIN to the end
 * (raw: from the connection to the last byte). Exit 0, or 1 with a
 * message. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "benchutil.h"
#include "ckpt.h"
#include "embps/embps.h"
#include "snapshot.h"
#include "snapstream.h"

static int die(const char *what, const char *why) {
  fprintf(stderr, "snapbench: %s: %s\n", what, why);
  return 1;
}

static embps_client_t *connect_to(const char *addr) {
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = addr;
  o.timeout_ms = 600000;
  embps_client_t *c;
  char err[512];
  if (embps_client_create(&o, &c, err, sizeof err)) {
    die(addr, err);
    return NULL;
  }
  return c;
}

static int cmd_fill(const char *addr, const char *name, uint64_t rows,
                    uint32_t dim, int dynamic) {
  embps_client_t *c = connect_to(addr);
  if (!c)
    return 1;
  embps_table_spec_t s;
  embps_table_spec_init(&s, name, dim, EMBPS_OPT_ADAGRAD);
  s.init = EMBPS_INIT_UNIFORM;
  s.init_value = 0.01;
  if (dynamic)
    s.dynamic = 1;
  else
    s.rows = rows;
  if (embps_create_table(c, &s))
    return die("create", embps_client_last_error(c));
  const size_t batch = 32768;
  int64_t *ids = malloc(batch * sizeof *ids);
  float *g = malloc(batch * dim * sizeof *g);
  for (size_t i = 0; i < batch * dim; i++)
    g[i] = (float)(i % 13) / 100.0f - 0.05f;
  for (uint64_t lo = 0; lo < rows; lo += batch) {
    size_t n = rows - lo < batch ? (size_t)(rows - lo) : batch;
    for (size_t i = 0; i < n; i++)
      ids[i] = (int64_t)(lo + i);
    if (embps_push(c, name, ids, n, g, dim, 0))
      return die("push", embps_client_last_error(c));
  }
  free(ids);
  free(g);
  embps_client_destroy(c);
  return 0;
}

typedef struct {
  int fd;
  uint64_t bytes;
  size_t chunk;
} writer_t;

static void *writer_main(void *arg) {
  writer_t *w = arg;
  uint8_t *buf = malloc(w->chunk);
  memset(buf, 7, w->chunk);
  for (uint64_t left = w->bytes; left;) {
    size_t n = left < w->chunk ? (size_t)left : w->chunk;
    ssize_t k = write(w->fd, buf, n);
    if (k <= 0 && errno != EINTR)
      break;
    if (k > 0)
      left -= (uint64_t)k;
  }
  free(buf);
  return NULL;
}

static int cmd_raw(uint64_t bytes, size_t chunk) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) ||
      getsockname(ls, (struct sockaddr *)&a, &al))
    return die("listen", strerror(errno));
  int rd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  const uint64_t t0 = bu_now_ns();
  if (connect(rd, (struct sockaddr *)&a, sizeof a))
    return die("connect", strerror(errno));
  writer_t w = {.fd = accept(ls, NULL, NULL), .bytes = bytes, .chunk = chunk};
  setsockopt(rd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(w.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  pthread_t th;
  pthread_create(&th, NULL, writer_main, &w);
  uint8_t *buf = malloc(chunk);
  uint64_t got = 0;
  while (got < bytes) {
    ssize_t k = read(rd, buf + got % chunk, chunk - got % chunk);
    if (k <= 0 && errno != EINTR)
      return die("read", "the stream broke");
    if (k > 0)
      got += (uint64_t)k;
  }
  const double s = (double)(bu_now_ns() - t0) / 1e9;
  pthread_join(th, NULL);
  printf("raw bytes %" PRIu64 " seconds %.3f gbps %.3f\n", got, s,
         (double)got / s / 1e9);
  free(buf);
  close(rd);
  close(w.fd);
  close(ls);
  return 0;
}

static int cmd_stream(const char *addr, int load, uint32_t shards,
                      uint32_t chunk, uint32_t depth) {
  embps_client_t *c = connect_to(addr);
  if (!c)
    return 1;
  embps_snapshot_options_t o = {.max_chunk_bytes = chunk, .depth = depth};
  embps_snapshot_t *s;
  const uint64_t t0 = bu_now_ns();
  if (embps_snapshot_begin(c, 0, &o, &s))
    return die("begin", embps_client_last_error(c));
  uint64_t rows = 0;
  if (load) {
    embps_snapstream_reader_t r;
    embps_snapstream_reader_init(&r, embps_snapshot_reader_next, s);
    embps_ckpt_t ck;
    char err[2048];
    if (embps_ckpt_load_stream(&r, shards, 1, &ck, err, sizeof err))
      return die("load", err);
    for (size_t i = 0; i < ck.n_tables; i++) {
      embps_table_info_t info;
      embps_table_info(ck.tables[i].table, &info);
      rows += info.rows_allocated;
    }
    const uint64_t bytes = embps_snapshot_bytes(s);
    if (embps_snapshot_end(s))
      return die("end", embps_client_last_error(c));
    const double sec = (double)(bu_now_ns() - t0) / 1e9;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("load bytes %" PRIu64 " seconds %.3f gbps %.3f rows %" PRIu64
           " user %.2f sys %.2f\n", bytes, sec, (double)bytes / sec / 1e9,
           rows, (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6,
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
    embps_ckpt_free(&ck);
  } else {
    const uint8_t *p;
    size_t n;
    int rc;
    while (!(rc = embps_snapshot_next(s, &p, &n)) && n)
      ;
    if (rc)
      return die("read", embps_client_last_error(c));
    const uint64_t bytes = embps_snapshot_bytes(s);
    if (embps_snapshot_end(s))
      return die("end", embps_client_last_error(c));
    const double sec = (double)(bu_now_ns() - t0) / 1e9;
    printf("drain bytes %" PRIu64 " seconds %.3f gbps %.3f\n", bytes, sec,
           (double)bytes / sec / 1e9);
  }
  embps_client_destroy(c);
  return 0;
}

int main(int argc, char **argv) {
  const char *usage = "usage: snapbench fill ADDR NAME ROWS DIM dense|dynamic"
                      " | raw BYTES [CHUNK] | drain ADDR [CHUNK [DEPTH]] |"
                      " load ADDR SHARDS [CHUNK [DEPTH]]\n";
  if (argc >= 7 && !strcmp(argv[1], "fill"))
    return cmd_fill(argv[2], argv[3], strtoull(argv[4], NULL, 10),
                    (uint32_t)atoi(argv[5]), !strcmp(argv[6], "dynamic"));
  if (argc >= 3 && !strcmp(argv[1], "raw"))
    return cmd_raw(strtoull(argv[2], NULL, 10),
                   argc > 3 ? strtoull(argv[3], NULL, 10) : 8u << 20);
  if (argc >= 3 && !strcmp(argv[1], "drain"))
    return cmd_stream(argv[2], 0, 0,
                      argc > 3 ? (uint32_t)atoi(argv[3]) : 0,
                      argc > 4 ? (uint32_t)atoi(argv[4]) : 0);
  if (argc >= 4 && !strcmp(argv[1], "load"))
    return cmd_stream(argv[2], 1, (uint32_t)atoi(argv[3]),
                      argc > 4 ? (uint32_t)atoi(argv[4]) : 0,
                      argc > 5 ? (uint32_t)atoi(argv[5]) : 0);
  fputs(usage, stderr);
  return 2;
}
