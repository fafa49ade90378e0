/* gen_corpus.c - writes the seed corpora of the fuzz targets:
 *   OUT/msg/       one message of every kind (u16 kind + packed meta)
 *   OUT/frames/    each message as a whole frame with its bulk, a stream of
 *                  all of them, and streams with an oversized or bad header
 *   OUT/framer/    that stream behind fuzz_framer.c's set-up bytes: limits
 *                  raised after a first frame, oversized frames stopped at
 *                  or skipped, split bodies, kinds that stop or are skipped
 *   OUT/dispatch/  request programs (see fuzz_dispatch.c for the encoding)
 *   OUT/json/      etcd gateway answers (fuzz_json.c: a token-limit byte,
 *                  then the text)
 * Run by tests/fuzz/gen-corpus.sh; the files are committed, and files the
 * fuzzers find are added beside them. */
#include <errno.h>
#include <sys/stat.h>

#include "fuzz.h"
#include "wire.h"

#define N_SAMPLES 17

static const char *out_dir;

static void write_file(const char *target, const char *name,
                       const uint8_t *p, size_t len) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", out_dir, target);
  if (mkdir(path, 0777) && errno != EEXIST) {
    perror(path);
    exit(1);
  }
  snprintf(path, sizeof path, "%s/%s/seed-%s", out_dir, target, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, len, f) != len || fclose(f)) {
    perror(path);
    exit(1);
  }
}

static void info_sample(embps_table_info_t *i, const char *name) {
  memset(i, 0, sizeof *i);
  embps_table_spec_init(&i->spec, name, 4, EMBPS_OPT_ADAGRAD);
  i->spec.rows = 100;
  i->rows_allocated = 3;
  i->bytes_used = 4096;
  i->pushes = 2;
  i->pulls = 5;
  i->step = 1;
}

/* Sample i of every kind; *bulk_len: the bulk its frame carries. Returns a
 * short name. */
static const char *sample(int i, embps_msg_t *m, embps_table_info_t *infos,
                          size_t *bulk_len) {
  memset(m, 0, sizeof *m);
  *bulk_len = 0;
  switch (i) {
  case 0:
    m->kind = EMBPS_KIND_HELLO;
    m->u.hello.version = EMBPS_PROTOCOL_VERSION;
    m->u.hello.token_len = 10;
    memcpy(m->u.hello.token, "fuzz-token", 10);
    return "hello";
  case 1:
    m->kind = EMBPS_KIND_HELLO | EMBPS_KIND_REPLY;
    m->u.hello_reply.version = 1;
    m->u.hello_reply.cluster_size = 2;
    m->u.hello_reply.max_frame_bytes = 1 << 20;
    snprintf(m->u.hello_reply.server_version, 32, "0.1.0");
    return "hello-reply";
  case 2:
    m->kind = EMBPS_KIND_ERROR;
    m->u.error.code = EMBPS_ERANGE;
    snprintf(m->u.error.message, sizeof m->u.error.message, "index 7 out "
             "of range [0, 4) of table \"t0\"");
    return "error";
  case 3:
    m->kind = EMBPS_KIND_CREATE;
    embps_table_spec_init(&m->u.spec, "t0", 4, EMBPS_OPT_ADAM);
    m->u.spec.rows = 100;
    m->u.spec.sync_workers = 2;
    m->u.spec.has_padding = 1;
    m->u.spec.dtype = EMBPS_DTYPE_BF16;
    return "create";
  case 4:
    m->kind = EMBPS_KIND_CREATE | EMBPS_KIND_REPLY;
    return "create-reply";
  case 5:
    m->kind = EMBPS_KIND_DROP;
    snprintf(m->u.name, sizeof m->u.name, "t0");
    return "drop";
  case 6:
    m->kind = EMBPS_KIND_DROP | EMBPS_KIND_REPLY;
    return "drop-reply";
  case 7:
    m->kind = EMBPS_KIND_DESCRIBE;
    snprintf(m->u.name, sizeof m->u.name, "t1");
    return "describe";
  case 8:
    m->kind = EMBPS_KIND_DESCRIBE | EMBPS_KIND_REPLY;
    info_sample(&m->u.info, "t1");
    return "describe-reply";
  case 9:
    m->kind = EMBPS_KIND_LIST;
    return "list";
  case 10:
    m->kind = EMBPS_KIND_LIST | EMBPS_KIND_REPLY;
    info_sample(&infos[0], "t0");
    info_sample(&infos[1], "t1");
    m->u.list.v = infos;
    m->u.list.n = 2;
    return "list-reply";
  case 11:
    m->kind = EMBPS_KIND_PULL;
    snprintf(m->u.pull.table, sizeof m->u.pull.table, "t0");
    m->u.pull.n_ids = 3;
    m->u.pull.dim = 4;
    *bulk_len = 3 * sizeof(int64_t);
    return "pull";
  case 12:
    m->kind = EMBPS_KIND_PULL | EMBPS_KIND_REPLY;
    m->u.pull_reply.n_rows = 3;
    m->u.pull_reply.dim = 4;
    *bulk_len = 3 * 4 * sizeof(float);
    return "pull-reply";
  case 13:
    m->kind = EMBPS_KIND_PUSH;
    snprintf(m->u.push.table, sizeof m->u.push.table, "t0");
    m->u.push.n = 2;
    m->u.push.dim = 4;
    m->u.push.client_id = 9;
    m->u.push.seq = 1;
    m->u.push.step = 1;
    *bulk_len = 2 * sizeof(int64_t) + 2 * 4 * sizeof(float);
    return "push";
  case 14:
    m->kind = EMBPS_KIND_PUSH | EMBPS_KIND_REPLY;
    m->u.push_reply.applied = 1;
    m->u.push_reply.n_unique = 2;
    return "push-reply";
  case 15:
    m->kind = EMBPS_KIND_STATS;
    return "stats";
  default:
    m->kind = EMBPS_KIND_STATS | EMBPS_KIND_REPLY;
    m->u.stats.cluster_size = 1;
    m->u.stats.requests = 12;
    snprintf(m->u.stats.version, sizeof m->u.stats.version, "0.1.0");
    info_sample(&infos[0], "t0");
    m->u.stats.tables = infos;
    m->u.stats.n_tables = 1;
    return "stats-reply";
  }
}

/* One framer seed: set-up bytes a0 (limits, flags) and a1 (kind), the
 * chunking seed, then pre (if any) and the stream. */
static void framer_seed(const char *name, uint8_t a0, uint8_t a1,
                        uint64_t seed, const uint8_t *pre, size_t pre_len,
                        const uint8_t *stream, size_t len) {
  uint8_t *buf = malloc(10 + pre_len + len);
  FUZZ_CHECK(buf);
  buf[0] = a0;
  buf[1] = a1;
  memcpy(buf + 2, &seed, sizeof seed);
  if (pre_len)
    memcpy(buf + 10, pre, pre_len);
  memcpy(buf + 10 + pre_len, stream, len);
  write_file("framer", name, buf, 10 + pre_len + len);
  free(buf);
}

/* Limit indexes of fuzz_framer.c's LIMITS[] and its flag bits. */
#define LIM(first, after) ((uint8_t)((first) | (after) << 3))
#define SKIP_OVERSIZED 0x40
#define SPLIT 0x80

static void gen_framer(const uint8_t *stream, size_t len) {
  uint8_t pre[EMBPS_FRAME_HEADER_LEN + 100];
  embps_frame_header_t h = {.body_len = 100, .meta_len = 4, .req_id = 77,
                            .kind = EMBPS_KIND_PUSH};
  embps_frame_header_encode(&h, pre);
  memset(pre + EMBPS_FRAME_HEADER_LEN, 0x5a, 100);
  framer_seed("stream", LIM(7, 7), 0, 1, NULL, 0, stream, len);
  framer_seed("hello-first", LIM(4, 6), 0, 2, NULL, 0, stream, len);
  framer_seed("split", LIM(7, 7) | SPLIT, 0, 3, NULL, 0, stream, len);
  framer_seed("stop-push", LIM(7, 7), EMBPS_KIND_PUSH, 4, NULL, 0, stream,
              len);
  framer_seed("skip-pulls", LIM(7, 7), (uint8_t)~EMBPS_KIND_PULL, 5, NULL, 0,
              stream, len);
  framer_seed("skip-lists", LIM(7, 7), (uint8_t)~EMBPS_KIND_LIST, 9, NULL, 0,
              stream, len); /* an empty body skipped */
  /* a 100-byte frame over a 64-byte limit: skipped, or the end */
  framer_seed("oversized-skip", LIM(2, 7) | SKIP_OVERSIZED, 0, 6, pre,
              sizeof pre, stream, len);
  framer_seed("oversized-stop", LIM(2, 7), 0, 7, pre, sizeof pre, stream,
              len);
  /* a bulk without meta (an empty first segment), then the stream */
  uint8_t bulk[EMBPS_FRAME_HEADER_LEN + 24];
  h = (embps_frame_header_t){.body_len = 24, .req_id = 78,
                             .kind = EMBPS_KIND_PULL | EMBPS_KIND_REPLY};
  embps_frame_header_encode(&h, bulk);
  memset(bulk + EMBPS_FRAME_HEADER_LEN, 0xc3, 24);
  framer_seed("split-bulk-only", LIM(7, 7) | SPLIT, 0, 10, bulk, sizeof bulk,
              stream, len);
  /* a bad magic after the first frame, the owner answering skip */
  uint8_t bad[EMBPS_FRAME_HEADER_LEN] = {0};
  framer_seed("bad-magic-skip", LIM(7, 7) | SKIP_OVERSIZED, 0, 11, bulk,
              sizeof bulk, bad, sizeof bad);
  /* small limits all along: most frames skipped, bodies split */
  framer_seed("tiny-limits", LIM(1, 3) | SKIP_OVERSIZED | SPLIT, 0, 8, NULL,
              0, stream, len);
}

static void gen_msg_and_frames(void) {
  uint8_t *stream = NULL;
  size_t stream_len = 0;
  for (int i = 0; i < N_SAMPLES; i++) {
    embps_msg_t m;
    embps_table_info_t infos[2];
    size_t bulk_len;
    const char *name = sample(i, &m, infos, &bulk_len);
    size_t len = embps_msg_size(&m);
    uint8_t *buf = malloc(2 + len);
    FUZZ_CHECK(buf);
    memcpy(buf, &m.kind, 2);
    embps_msg_pack(&m, buf + 2);
    write_file("msg", name, buf, 2 + len);
    free(buf);

    uint8_t *frame;
    size_t flen, off;
    FUZZ_CHECK(embps_frame_build(&m, (uint32_t)i + 1, bulk_len, &frame, &flen,
                                 &off) == 0);
    for (size_t b = 0; b < bulk_len; b++)
      frame[off + b] = (uint8_t)(b * 7);
    write_file("frames", name, frame, flen);
    uint8_t *v = realloc(stream, stream_len + flen);
    FUZZ_CHECK(v);
    stream = v;
    memcpy(stream + stream_len, frame, flen);
    stream_len += flen;
    free(frame);
  }
  write_file("frames", "stream", stream, stream_len);
  gen_framer(stream, stream_len);
  /* an oversized frame (skipped), then the stream */
  uint8_t *big = malloc(EMBPS_FRAME_HEADER_LEN + 64 + stream_len);
  FUZZ_CHECK(big);
  embps_frame_header_t h = {.body_len = 1u << 30, .meta_len = 4, .kind = 7};
  embps_frame_header_encode(&h, big);
  memset(big + EMBPS_FRAME_HEADER_LEN, 0xab, 64);
  memcpy(big + EMBPS_FRAME_HEADER_LEN + 64, stream, stream_len);
  write_file("frames", "oversized", big, EMBPS_FRAME_HEADER_LEN + 64);
  /* a bad magic after a good frame */
  memcpy(big, stream, 40);
  memset(big + 40, 0x45, 16);
  write_file("frames", "bad-magic", big, 56);
  free(big);
  free(stream);
}

/* ------------------------------------------------------------ dispatch */

/* Op bytes of fuzz_dispatch.c: low nibble the request, top 2 bits the
 * connection. */
#define C(n) ((uint8_t)((n) << 6))
enum { HELLO = 0, CREATE, DROP, DESCRIBE, LIST, STATS, PULL, PUSH = 8,
       RAW = 11, HANGUP = 12, SCAN = 13, WRITE_ROWS = 14 };

static const uint8_t prog_basic[] = {
    0x00,                             /* config: 1 server, 1 shard */
    HELLO, 0x00,                      /* good hello */
    CREATE, 0x01, 3, 0, 100, 0, 0x00, /* t0: adagrad, dim 4, 100 rows */
    PUSH, 0, 0, 3, 0x00, 3, 6, 3,     /* 3 ids (9, 18, 9) */
    16, 32, 48, 64, 1, 2, 3, 4, 5, 6, 7, 8, /* 12 values */
    PULL, 0, 0, 4, 3, 6, 9, 0, 0,     /* 4 ids */
    DESCRIBE, 0, LIST, STATS,
    PUSH, 0, 0, 1, 0x04, 1, 8, 8, 8, 8, /* seq 1 */
    PUSH, 0, 0, 1, 0x04, 1, 8, 8, 8, 8, /* seq 1 again: duplicate */
    DROP, 0, LIST, DROP, 0,
};

static const uint8_t prog_sync[] = {
    0x02,                                 /* 2 shards */
    HELLO, 0x00, C(1) | HELLO, 0x00,
    CREATE, 0x00, 1, 1, 50, 0, 0x07,      /* t1: sgd, dim 2, sync 2 */
    PUSH, 1, 0, 2, 0x10, 1, 2, 16, 16, 16, 16,         /* c0 step 1 */
    C(1) | PUSH, 1, 0, 2, 0x10, 2, 3, 32, 32, 32, 32,  /* c1 step 1 */
    PULL, 1, 0, 3, 1, 2, 3, 0,
    PUSH, 1, 0, 1, 0x10, 1, 8, 8,         /* step 1 again: stale */
    PUSH, 1, 0, 1, 0x20, 1, 8, 8,         /* step 2: held */
    PUSH, 1, 0, 1, 0x20, 1, 8, 8,         /* same worker twice */
    DESCRIBE, 1,
};

static const uint8_t prog_auth[] = {
    0x10,                                 /* token required */
    PUSH, 0, 0, 0, 0x00,                  /* before hello: closed */
    HELLO, 0x02, 3, 'a', 'b', 'c',        /* wrong token */
    HELLO, 0x01, 9, 0, 0, 0,              /* wrong version */
    HELLO, 0x00, LIST,
    C(2) | LIST,                          /* another connection, no hello */
    C(2) | HELLO, 0x02, 0,                /* empty token */
};

static const uint8_t prog_errors[] = {
    0x00, HELLO, 0x00,
    CREATE, 0x00, 3, 0, 10, 0, 0x00,      /* t0: dim 4, 10 rows */
    CREATE, 0x00, 3, 0, 10, 0, 0x00,      /* exists */
    CREATE, 0x00, 3, 2, 0, 0, 0x00,       /* rows 0 */
    CREATE, 0x10, 3, 3, 10, 0, 0x00, 0xfc, /* lr NaN */
    CREATE, 0x00, 3, 3, 10, 0, 0x30,      /* dtype 3 */
    PULL, 1, 0, 1, 0, 0,                  /* unknown table */
    PULL, 0, 0xe4, 1, 0, 0,               /* dim 0xe4 % 9 = 3: mismatch */
    PULL, 0, 0xe3, 1, 0, 0,               /* dim 2 */
    PULL, 0, 0, 1, 200, 0,                /* id 600 out of range */
    PULL, 0, 0, 1, 0xf1, 0,               /* id -2 */
    PULL, 0, 0, 2, 1, 2, 1,               /* bulk 8 bytes too long */
    PUSH, 0, 0, 1, 0x00, 1, 0xfc, 0, 0, 0, /* NaN */
    PUSH, 0, 0, 1, 0x00, 1, 0xfd, 0, 0, 0, /* inf */
    PUSH, 0, 0, 0x94, 0x00, 1, 1, 1, 1, 1, /* n 1, bulk 8 bytes too long */
    PUSH, 0, 0, 1, 0x40, 5, 0, 1, 1, 1, 1, 1, /* dense_rows 5 != 10 */
    PUSH, 0, 0, 1, 0x03, 1,2,3,4,5,6,7,8, 1, 1, 1, 1, 1, /* fuzzed client */
    HANGUP, LIST,                          /* reconnect without hello */
};

static const uint8_t prog_cluster[] = {
    0x09,                                 /* cluster of 2, 64 KiB memory cap */
    HELLO, 0x00,
    CREATE, 0x08, 7, 2, 0x00,             /* t2: dynamic, dim 8 */
    PUSH, 2, 0, 48, 0x00,                 /* 48 ids: half are not ours */
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
    20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37,
    38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, /* values */
    PULL, 2, 0, 2, 0, 2, 0,
    STATS,
};

static const uint8_t prog_raw[] = {
    0x00, HELLO, 0x00,
    RAW, 0x05, 0x00, 0, 0,                 /* LIST, empty meta */
    RAW, 0x85, 0x00, 0, 0,                 /* a reply kind as a request */
    RAW, 0x03, 0x00, 4, 0, 0x0a, 0x02, 't', '0', /* DROP t0 */
    RAW, 0x06, 0x00, 2, 1, 0xff, 0xff,     /* PULL, bad meta */
    RAW, 0x63, 0x00, 0, 0,                 /* unknown kind */
    C(1) | RAW, 0x01, 0x00, 4, 0, 0x08, 0x01, 0x12, 0x00, /* empty token */
};

static const uint8_t prog_names[] = {
    0x00, HELLO, 0x00,
    CREATE, 0x00, 0, 0xf0, 3, 'a', '.', 'b', 5, 0, 0x00, /* "a.b" */
    CREATE, 0x00, 0, 0xf0, 3, 'a', ' ', 'b', 5, 0, 0x00, /* bad name */
    DESCRIBE, 0xf0, 3, 'a', '.', 'b',
    LIST, DROP, 0xf0, 3, 'a', '.', 'b', LIST,
};

static const uint8_t prog_export[] = {
    0x02, HELLO, 0x00,                    /* 2 shards */
    CREATE, 0x0a, 1, 0, 0x00,             /* t0: adam, dynamic, dim 2 */
    PUSH, 0, 0, 3, 0x00, 1, 2, 5, 16, 32, 48, 64, 8, 8,
    SCAN, 0, 0x03,                        /* with state, 1 row a chunk */
    SCAN, 0, 0x01,                        /* as many as a frame holds */
    SCAN, 0, 0x21, 1, 0,                  /* cursor: shard 1 */
    SCAN, 0, 0x20, 9, 0,                  /* shard 9: refused */
    WRITE_ROWS, 0, 0, 2, 0x0e, 1, 7,      /* 2 rows with state, step 1 */
    16, 16, 8, 8, 4, 4, 4, 4, 2, 2, 2, 2,
    WRITE_ROWS, 0, 0, 1, 0x02, 1, 8, 8, 8, 8, 0xf0, 0xf0, /* v < 0 */
    WRITE_ROWS, 0, 0, 2, 0x00, 1, 1, 8, 8, 8, 8, /* id twice */
    WRITE_ROWS, 0, 0, 1, 0x01, 1, 8, 8, 8, 8,    /* 1 slot, adam has 2 */
    WRITE_ROWS, 0, 0, 1, 0x40, 1, 8, 8,   /* bulk 8 bytes too long */
    WRITE_ROWS, 0, 0, 1, 0x00, 2, 0xfc, 8, /* NaN */
    SCAN, 0, 0x03, DROP, 0, SCAN, 0, 0x01,
};

void gen_dispatch(void);
void gen_dispatch(void) {
  write_file("dispatch", "basic", prog_basic, sizeof prog_basic);
  write_file("dispatch", "sync", prog_sync, sizeof prog_sync);
  write_file("dispatch", "auth", prog_auth, sizeof prog_auth);
  write_file("dispatch", "errors", prog_errors, sizeof prog_errors);
  write_file("dispatch", "cluster", prog_cluster, sizeof prog_cluster);
  write_file("dispatch", "raw", prog_raw, sizeof prog_raw);
  write_file("dispatch", "names", prog_names, sizeof prog_names);
  write_file("dispatch", "export", prog_export, sizeof prog_export);
}

/* What etcd's gateway sends (etcd.c), behind fuzz_json.c's limit byte. */
static void gen_json(void) {
  static const struct {
    const char *name, *text;
  } seeds[] = {
      {"range", "{\"header\":{\"cluster_id\":\"324952591200643719\",\"revision\":"
                "\"2\"},\"kvs\":[{\"key\":\"L2VtYnBzL3gvcHJpbWFyeQ==\","
                "\"create_revision\":\"2\",\"mod_revision\":\"2\",\"version\":"
                "\"1\",\"value\":\"aGVsbG8=\",\"lease\":\"2324035612959321097\"}],"
                "\"count\":\"1\"}"},
      {"txn", "{\"header\":{\"revision\":\"5\"},\"succeeded\":true,"
              "\"responses\":[{\"response_put\":{\"header\":{\"revision\":"
              "\"5\"}}},{\"response_range\":{\"kvs\":[],\"more\":false}}]}"},
      {"watch", "{\"result\":{\"header\":{\"revision\":\"3\"},\"events\":"
                "[{\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"2\"}},"
                "{\"type\":\"DELETE\",\"kv\":{\"key\":\"YQ==\"}}]}}\n"
                "{\"result\":{\"canceled\":true,\"compact_revision\":\"4\"}}"},
      {"error", "{\"error\":\"etcdserver: requested lease not found\","
                "\"message\":\"etcdserver: requested lease not found\","
                "\"code\":5}"},
      {"strings", "[\"a\\\"b\\\\c\\/\\n\", \"\\u00e9\\ud83d\\ude00\", "
                  "\"\\ud83d\", -12.5e+3, 0, -0, true, false, null, {}]"},
  };
  for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
    uint8_t buf[1024];
    size_t n = strlen(seeds[i].text);
    buf[0] = 11; /* 2048 tokens */
    memcpy(buf + 1, seeds[i].text, n);
    write_file("json", seeds[i].name, buf, n + 1);
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  out_dir = argv[1];
  gen_msg_and_frames();
  gen_dispatch();
  gen_json();
  return 0;
}
