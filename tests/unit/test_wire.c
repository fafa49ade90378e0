/* test_wire.c - unit tests of the message codec (common/wire.c) and of
 * table spec validation (common/spec.c): pack/unpack round trips of every
 * message kind, whole frames from embps_frame_build, refusal of garbage,
 * unknown kinds and out-of-bounds names, and embps_table_spec_check. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embps/embps.h"
#include "frame.h"
#include "wire.h"

/* ---------------------------------------------------------------- helpers */

/* A name of n characters from [a-z]. */
static void make_name(char *dst, size_t n) {
  for (size_t i = 0; i < n; i++)
    dst[i] = (char)('a' + i % 26);
  dst[n] = 0;
}

/* A spec with every field away from its default. */
static void full_spec(embps_table_spec_t *s, const char *name, int dynamic,
                      embps_optimizer_t opt) {
  memset(s, 0, sizeof *s);
  snprintf(s->name, sizeof s->name, "%s", name);
  s->dim = 300;
  s->rows = dynamic ? 0 : (1ULL << 40) - 3;
  s->dynamic = dynamic;
  s->optimizer = opt;
  s->lr = 0.123;
  s->eps = 3.5e-7;
  s->beta1 = 0.81;
  s->beta2 = 0.9876;
  s->initial_accumulator = 0.37;
  s->l1 = 0.011;
  s->l2 = 0.022;
  s->lr_power = -0.3;
  s->weight_decay = 0.0042;
  s->init = EMBPS_INIT_NORMAL;
  s->init_value = 0.0625;
  s->seed = UINT64_MAX - 12345;
  s->has_padding = 1;
  s->padding_id = dynamic ? INT64_MIN + 7 : 123;
  s->dtype = dynamic ? EMBPS_DTYPE_BF16 : EMBPS_DTYPE_F16; /* travels */
  s->sync_workers = 17;
  if (dynamic) { /* admission and eviction travel too */
    s->admit_after = 65535;
    s->admit_probability = 0.375;
    s->admit_sketch_bytes = (1ULL << 34) - 1;
    s->ttl_steps = UINT64_MAX - 1;
    s->max_rows = (1ULL << 40) + 5;
    s->evict = EMBPS_EVICT_LFU;
    s->evict_l2_below = 1e-3;
  }
}

static void assert_spec_equal(const embps_table_spec_t *a,
                              const embps_table_spec_t *b) {
  assert_string_equal(a->name, b->name);
  assert_int_equal(a->dim, b->dim);
  assert_int_equal(a->rows, b->rows);
  assert_int_equal(!!a->dynamic, !!b->dynamic);
  assert_int_equal(a->optimizer, b->optimizer);
  assert_true(a->lr == b->lr);
  assert_true(a->eps == b->eps);
  assert_true(a->beta1 == b->beta1);
  assert_true(a->beta2 == b->beta2);
  assert_true(a->initial_accumulator == b->initial_accumulator);
  assert_true(a->l1 == b->l1);
  assert_true(a->l2 == b->l2);
  assert_true(a->lr_power == b->lr_power);
  assert_true(a->weight_decay == b->weight_decay);
  assert_int_equal(a->init, b->init);
  assert_true(a->init_value == b->init_value);
  assert_int_equal(a->seed, b->seed);
  assert_int_equal(!!a->has_padding, !!b->has_padding);
  assert_true(a->padding_id == b->padding_id);
  assert_int_equal(a->dtype, b->dtype);
  assert_int_equal(a->sync_workers, b->sync_workers);
  assert_int_equal(a->admit_after, b->admit_after);
  assert_true(a->admit_probability == b->admit_probability);
  assert_int_equal(a->admit_sketch_bytes, b->admit_sketch_bytes);
  assert_int_equal(a->ttl_steps, b->ttl_steps);
  assert_int_equal(a->max_rows, b->max_rows);
  assert_int_equal(a->evict, b->evict);
  assert_true(a->evict_l2_below == b->evict_l2_below);
}

static void full_info(embps_table_info_t *i, const char *name, int k) {
  memset(i, 0, sizeof *i);
  full_spec(&i->spec, name, k % 2, (embps_optimizer_t)(k % 4));
  i->spec.dim = 8 + (uint32_t)k;
  i->rows_allocated = 1000 + (uint64_t)k;
  i->bytes_used = (1ULL << 35) + (uint64_t)k;
  i->pushes = 77 + (uint64_t)k;
  i->pulls = UINT64_MAX - (uint64_t)k;
  i->step = 5 + (uint64_t)k;
  i->rows_admitted = 11 + (uint64_t)k;
  i->rows_pending = 12 + (uint64_t)k;
  i->evicted_ttl = 13 + (uint64_t)k;
  i->evicted_capacity = 14 + (uint64_t)k;
  i->evicted_l2 = 15 + (uint64_t)k;
  i->capacity = 16 + (uint64_t)k;
  i->evict_stall_max_us = 17 + (uint64_t)k;
}

static void assert_info_equal(const embps_table_info_t *a,
                              const embps_table_info_t *b) {
  assert_spec_equal(&a->spec, &b->spec);
  assert_int_equal(a->rows_allocated, b->rows_allocated);
  assert_int_equal(a->bytes_used, b->bytes_used);
  assert_int_equal(a->pushes, b->pushes);
  assert_int_equal(a->pulls, b->pulls);
  assert_int_equal(a->step, b->step);
  assert_int_equal(a->rows_admitted, b->rows_admitted);
  assert_int_equal(a->rows_pending, b->rows_pending);
  assert_int_equal(a->evicted_ttl, b->evicted_ttl);
  assert_int_equal(a->evicted_capacity, b->evicted_capacity);
  assert_int_equal(a->evicted_l2, b->evicted_l2);
  assert_int_equal(a->capacity, b->capacity);
  assert_int_equal(a->evict_stall_max_us, b->evict_stall_max_us);
}

/* Packs m and unpacks it into out (release with embps_msg_free). */
static void round_trip(const embps_msg_t *m, embps_msg_t *out) {
  size_t n = embps_msg_size(m);
  uint8_t *buf = malloc(n + 1);
  assert_non_null(buf);
  embps_msg_pack(m, buf);
  int rc = embps_msg_unpack(m->kind, buf, n, out);
  free(buf);
  assert_int_equal(rc, 0);
  assert_int_equal(out->kind, m->kind);
}

static embps_msg_t *new_msg(uint16_t kind) {
  embps_msg_t *m = calloc(1, sizeof *m);
  assert_non_null(m);
  m->kind = kind;
  return m;
}

/* A tiny protobuf writer for hand-made (bad) messages. */
typedef struct {
  uint8_t b[4096];
  size_t n;
} pb_t;

static void pb_varint(pb_t *p, uint64_t v) {
  while (v >= 0x80) {
    p->b[p->n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p->b[p->n++] = (uint8_t)v;
}

static void pb_uint(pb_t *p, uint32_t field, uint64_t v) {
  pb_varint(p, (uint64_t)field << 3);
  pb_varint(p, v);
}

static void pb_bytes(pb_t *p, uint32_t field, const void *data, size_t len) {
  pb_varint(p, (uint64_t)field << 3 | 2);
  pb_varint(p, len);
  assert_true(p->n + len <= sizeof p->b);
  memcpy(p->b + p->n, data, len);
  p->n += len;
}

static void pb_str(pb_t *p, uint32_t field, const char *s) {
  pb_bytes(p, field, s, strlen(s));
}

static void pb_sub(pb_t *p, uint32_t field, const pb_t *sub) {
  pb_bytes(p, field, sub->b, sub->n);
}

static int unpack_pb(uint16_t kind, const pb_t *p) {
  embps_msg_t *m = new_msg(0);
  int rc = embps_msg_unpack(kind, p->b, p->n, m);
  if (rc == 0)
    embps_msg_free(m);
  free(m);
  return rc;
}

/* Every kind that has a message. */
static const uint16_t known_kinds[] = {
    EMBPS_KIND_HELLO,
    EMBPS_KIND_HELLO | EMBPS_KIND_REPLY,
    EMBPS_KIND_ERROR,
    EMBPS_KIND_CREATE,
    EMBPS_KIND_CREATE | EMBPS_KIND_REPLY,
    EMBPS_KIND_DROP,
    EMBPS_KIND_DROP | EMBPS_KIND_REPLY,
    EMBPS_KIND_DESCRIBE,
    EMBPS_KIND_DESCRIBE | EMBPS_KIND_REPLY,
    EMBPS_KIND_LIST,
    EMBPS_KIND_LIST | EMBPS_KIND_REPLY,
    EMBPS_KIND_PULL,
    EMBPS_KIND_PULL | EMBPS_KIND_REPLY,
    EMBPS_KIND_PUSH,
    EMBPS_KIND_PUSH | EMBPS_KIND_REPLY,
    EMBPS_KIND_STATS,
    EMBPS_KIND_STATS | EMBPS_KIND_REPLY,
    EMBPS_KIND_SCAN,
    EMBPS_KIND_SCAN | EMBPS_KIND_REPLY,
    EMBPS_KIND_WRITE_ROWS,
    EMBPS_KIND_WRITE_ROWS | EMBPS_KIND_REPLY,
};
#define N_KNOWN (sizeof known_kinds / sizeof *known_kinds)

/* ------------------------------------------------------------ round trips */

static void test_hello(void **state) {
  (void)state;
  embps_msg_t *m = new_msg(EMBPS_KIND_HELLO), *o = new_msg(0);
  m->u.hello.version = EMBPS_PROTOCOL_VERSION;
  /* a binary token of the maximum length, NULs included */
  m->u.hello.token_len = EMBPS_TOKEN_MAX;
  for (size_t i = 0; i < EMBPS_TOKEN_MAX; i++)
    m->u.hello.token[i] = (char)(i * 37);
  round_trip(m, o);
  assert_int_equal(o->u.hello.version, EMBPS_PROTOCOL_VERSION);
  assert_int_equal(o->u.hello.token_len, EMBPS_TOKEN_MAX);
  assert_memory_equal(o->u.hello.token, m->u.hello.token, EMBPS_TOKEN_MAX);
  embps_msg_free(o);

  /* no token */
  m->u.hello.version = 0xabcdef;
  m->u.hello.token_len = 0;
  round_trip(m, o);
  assert_int_equal(o->u.hello.version, 0xabcdef);
  assert_int_equal(o->u.hello.token_len, 0);
  embps_msg_free(o);

  /* a short token */
  m->u.hello.token_len = 5;
  memcpy(m->u.hello.token, "s3cr3", 5);
  round_trip(m, o);
  assert_int_equal(o->u.hello.token_len, 5);
  assert_memory_equal(o->u.hello.token, "s3cr3", 5);
  embps_msg_free(o);
  free(m);
  free(o);
}

static void test_hello_reply_and_error(void **state) {
  (void)state;
  embps_msg_t *m = new_msg(EMBPS_KIND_HELLO | EMBPS_KIND_REPLY);
  embps_msg_t *o = new_msg(0);
  m->u.hello_reply.version = 1;
  m->u.hello_reply.cluster_size = 9;
  m->u.hello_reply.cluster_index = 8;
  m->u.hello_reply.max_frame_bytes = (1ULL << 36) + 5;
  snprintf(m->u.hello_reply.server_version,
           sizeof m->u.hello_reply.server_version, "embps 0.1.0-rc1");
  round_trip(m, o);
  assert_int_equal(o->u.hello_reply.version, 1);
  assert_int_equal(o->u.hello_reply.cluster_size, 9);
  assert_int_equal(o->u.hello_reply.cluster_index, 8);
  assert_int_equal(o->u.hello_reply.max_frame_bytes, (1ULL << 36) + 5);
  assert_string_equal(o->u.hello_reply.server_version, "embps 0.1.0-rc1");
  embps_msg_free(o);

  memset(m, 0, sizeof *m);
  m->kind = EMBPS_KIND_ERROR;
  const int codes[] = {EMBPS_EWRONGSERVER, EMBPS_EINTERNAL, -12, 0,
                       INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < sizeof codes / sizeof *codes; i++) {
    m->u.error.code = codes[i];
    snprintf(m->u.error.message, sizeof m->u.error.message,
             "id %zu belongs to server 3", i);
    round_trip(m, o);
    assert_int_equal(o->u.error.code, codes[i]);
    assert_string_equal(o->u.error.message, m->u.error.message);
    embps_msg_free(o);
  }
  /* the longest message */
  memset(m->u.error.message, 'x', EMBPS_MESSAGE_MAX - 1);
  m->u.error.message[EMBPS_MESSAGE_MAX - 1] = 0;
  round_trip(m, o);
  assert_string_equal(o->u.error.message, m->u.error.message);
  embps_msg_free(o);
  free(m);
  free(o);
}

static void test_create_drop_describe(void **state) {
  (void)state;
  embps_msg_t *m = new_msg(EMBPS_KIND_CREATE), *o = new_msg(0);
  char longest[EMBPS_TABLE_NAME_MAX];
  make_name(longest, EMBPS_TABLE_NAME_MAX - 1);
  for (int opt = EMBPS_OPT_SGD; opt <= EMBPS_OPT_FTRL; opt++) {
    for (int dyn = 0; dyn <= 1; dyn++) {
      full_spec(&m->u.spec, opt == EMBPS_OPT_ADAM ? longest : "user.emb-v2_1",
                dyn, (embps_optimizer_t)opt);
      round_trip(m, o);
      assert_spec_equal(&o->u.spec, &m->u.spec);
      embps_msg_free(o);
    }
  }
  /* a spec at its defaults (padding_id 0, flags off) */
  embps_table_spec_init(&m->u.spec, "plain", 4, EMBPS_OPT_ADAGRAD);
  m->u.spec.rows = 10;
  round_trip(m, o);
  assert_spec_equal(&o->u.spec, &m->u.spec);
  embps_msg_free(o);

  const uint16_t name_kinds[] = {EMBPS_KIND_DROP, EMBPS_KIND_DESCRIBE,
                                 EMBPS_KIND_EVICT};
  for (size_t k = 0; k < 3; k++) {
    memset(m, 0, sizeof *m);
    m->kind = name_kinds[k];
    snprintf(m->u.name, sizeof m->u.name, "t.1");
    round_trip(m, o);
    assert_string_equal(o->u.name, "t.1");
    embps_msg_free(o);
    memcpy(m->u.name, longest, sizeof longest);
    round_trip(m, o);
    assert_string_equal(o->u.name, longest);
    embps_msg_free(o);
  }

  memset(m, 0, sizeof *m);
  m->kind = EMBPS_KIND_DESCRIBE | EMBPS_KIND_REPLY;
  full_info(&m->u.info, "described", 3);
  round_trip(m, o);
  assert_info_equal(&o->u.info, &m->u.info);
  embps_msg_free(o);
  free(m);
  free(o);
}

static void test_list_reply(void **state) {
  (void)state;
  embps_msg_t *m = new_msg(EMBPS_KIND_LIST | EMBPS_KIND_REPLY);
  embps_msg_t *o = new_msg(0);
  embps_table_info_t infos[5];
  char name[32];
  for (int i = 0; i < 5; i++) {
    snprintf(name, sizeof name, "table_%d", i);
    full_info(&infos[i], name, i);
  }
  m->u.list.v = infos;
  m->u.list.n = 5;
  round_trip(m, o);
  assert_int_equal(o->u.list.n, 5);
  assert_non_null(o->u.list.v);
  for (int i = 0; i < 5; i++)
    assert_info_equal(&o->u.list.v[i], &infos[i]);
  embps_msg_free(o);
  assert_null(o->u.list.v);

  /* no tables */
  m->u.list.n = 0;
  round_trip(m, o);
  assert_int_equal(o->u.list.n, 0);
  embps_msg_free(o);
  free(m);
  free(o);
}

static void test_pull_push(void **state) {
  (void)state;
  embps_msg_t *m = new_msg(EMBPS_KIND_PULL), *o = new_msg(0);
  snprintf(m->u.pull.table, sizeof m->u.pull.table, "items");
  m->u.pull.n_ids = 4000000;
  m->u.pull.dim = 65536;
  round_trip(m, o);
  assert_string_equal(o->u.pull.table, "items");
  assert_int_equal(o->u.pull.n_ids, 4000000);
  assert_int_equal(o->u.pull.dim, 65536);
  embps_msg_free(o);

  memset(m, 0, sizeof *m);
  m->kind = EMBPS_KIND_PULL | EMBPS_KIND_REPLY;
  m->u.pull_reply.n_rows = 77;
  m->u.pull_reply.dim = 16;
  round_trip(m, o);
  assert_int_equal(o->u.pull_reply.n_rows, 77);
  assert_int_equal(o->u.pull_reply.dim, 16);
  embps_msg_free(o);

  memset(m, 0, sizeof *m);
  m->kind = EMBPS_KIND_PUSH;
  snprintf(m->u.push.table, sizeof m->u.push.table, "users");
  m->u.push.n = 123456;
  m->u.push.dim = 32;
  m->u.push.dense_rows = 1ULL << 33;
  m->u.push.client_id = 0xfedcba9876543210ULL;
  m->u.push.seq = UINT64_MAX;
  m->u.push.step = 99;
  round_trip(m, o);
  assert_string_equal(o->u.push.table, "users");
  assert_int_equal(o->u.push.n, 123456);
  assert_int_equal(o->u.push.dim, 32);
  assert_int_equal(o->u.push.dense_rows, 1ULL << 33);
  assert_int_equal(o->u.push.client_id, 0xfedcba9876543210ULL);
  assert_int_equal(o->u.push.seq, UINT64_MAX);
  assert_int_equal(o->u.push.step, 99);
  embps_msg_free(o);

  memset(m, 0, sizeof *m);
  m->kind = EMBPS_KIND_PUSH | EMBPS_KIND_REPLY;
  for (int applied = 0; applied <= 1; applied++) {
    for (int dup = 0; dup <= 1; dup++) {
      m->u.push_reply.applied = applied;
      m->u.push_reply.duplicate = dup;
      m->u.push_reply.n_unique = 4242u + (uint32_t)(applied * 2 + dup);
      round_trip(m, o);
      assert_int_equal(!!o->u.push_reply.applied, applied);
      assert_int_equal(!!o->u.push_reply.duplicate, dup);
      assert_int_equal(o->u.push_reply.n_unique, m->u.push_reply.n_unique);
      embps_msg_free(o);
    }
  }
  free(m);
  free(o);
}

static void test_scan_write_rows(void **state) {
  (void)state;
  embps_msg_t *m = new_msg(EMBPS_KIND_SCAN), *o = new_msg(0);
  snprintf(m->u.scan.table, sizeof m->u.scan.table, "emb");
  m->u.scan.cursor = (5ULL << 48) | 12345;
  m->u.scan.max_rows = 4096;
  m->u.scan.with_state = 1;
  round_trip(m, o);
  assert_string_equal(o->u.scan.table, "emb");
  assert_int_equal(o->u.scan.cursor, (5ULL << 48) | 12345);
  assert_int_equal(o->u.scan.max_rows, 4096);
  assert_true(o->u.scan.with_state);
  embps_msg_free(o);

  memset(m, 0, sizeof *m);
  m->kind = EMBPS_KIND_SCAN | EMBPS_KIND_REPLY;
  m->u.scan_reply = (embps_scan_reply_t){.n_rows = 99, .dim = 64,
                                         .state_floats = 2,
                                         .next_cursor = UINT64_MAX - 1,
                                         .step = 1ULL << 40, .done = 1};
  round_trip(m, o);
  assert_int_equal(o->u.scan_reply.n_rows, 99);
  assert_int_equal(o->u.scan_reply.dim, 64);
  assert_int_equal(o->u.scan_reply.state_floats, 2);
  assert_int_equal(o->u.scan_reply.next_cursor, UINT64_MAX - 1);
  assert_int_equal(o->u.scan_reply.step, 1ULL << 40);
  assert_true(o->u.scan_reply.done);
  embps_msg_free(o);

  memset(m, 0, sizeof *m);
  m->kind = EMBPS_KIND_WRITE_ROWS;
  snprintf(m->u.write_rows.table, sizeof m->u.write_rows.table, "emb");
  m->u.write_rows.n = 1000;
  m->u.write_rows.dim = 8;
  m->u.write_rows.state_floats = 1;
  for (int set = 0; set <= 1; set++) {
    m->u.write_rows.has_step = set;
    m->u.write_rows.step = 77;
    round_trip(m, o);
    assert_string_equal(o->u.write_rows.table, "emb");
    assert_int_equal(o->u.write_rows.n, 1000);
    assert_int_equal(o->u.write_rows.dim, 8);
    assert_int_equal(o->u.write_rows.state_floats, 1);
    assert_int_equal(!!o->u.write_rows.has_step, set);
    assert_int_equal(o->u.write_rows.step, 77);
    embps_msg_free(o);
  }
  memset(m, 0, sizeof *m);
  m->kind = EMBPS_KIND_WRITE_ROWS | EMBPS_KIND_REPLY;
  round_trip(m, o);
  embps_msg_free(o);
  free(m);
  free(o);
}

/* The snapshot session's messages; a READ reply's meta has one length
 * whatever its values (the server builds it in front of its chunk). */
static void test_snapshot(void **state) {
  (void)state;
  embps_msg_t *m = new_msg(EMBPS_KIND_SNAPSHOT_BEGIN), *o = new_msg(0);
  m->u.snap_begin = (embps_snapshot_begin_t){1, 1u << 20, 300};
  round_trip(m, o);
  assert_true(o->u.snap_begin.with_log);
  assert_int_equal(o->u.snap_begin.max_chunk_bytes, 1u << 20);
  assert_int_equal(o->u.snap_begin.idle_ms, 300);
  embps_msg_free(o);
  memset(m, 0, sizeof *m);
  m->kind = EMBPS_KIND_SNAPSHOT_BEGIN | EMBPS_KIND_REPLY;
  m->u.snap_begin_reply = (embps_snapshot_begin_reply_t){
      UINT64_MAX - 3, 1ULL << 40, 8u << 20, 3, 2, 16, 5, 30000};
  round_trip(m, o);
  assert_memory_equal(&o->u.snap_begin_reply, &m->u.snap_begin_reply,
                      sizeof m->u.snap_begin_reply);
  embps_msg_free(o);
  memset(m, 0, sizeof *m);
  m->kind = EMBPS_KIND_SNAPSHOT_READ;
  m->u.snap_read = (embps_snapshot_read_t){7, UINT64_MAX, 4096};
  round_trip(m, o);
  assert_int_equal(o->u.snap_read.session, 7);
  assert_int_equal(o->u.snap_read.seq, UINT64_MAX);
  assert_int_equal(o->u.snap_read.max_bytes, 4096);
  embps_msg_free(o);
  size_t len[2];
  for (int i = 0; i < 2; i++) {
    memset(m, 0, sizeof *m);
    m->kind = EMBPS_KIND_SNAPSHOT_READ | EMBPS_KIND_REPLY;
    m->u.snap_read_reply = i ? (embps_snapshot_read_reply_t){UINT64_MAX,
                                                             UINT64_MAX, 1}
                             : (embps_snapshot_read_reply_t){0, 0, 0};
    len[i] = embps_msg_size(m);
    round_trip(m, o);
    assert_int_equal(o->u.snap_read_reply.seq, i ? UINT64_MAX : 0);
    assert_int_equal(o->u.snap_read_reply.offset, i ? UINT64_MAX : 0);
    assert_int_equal(!!o->u.snap_read_reply.done, i);
    embps_msg_free(o);
  }
  assert_int_equal(len[0], len[1]);
  memset(m, 0, sizeof *m);
  m->kind = EMBPS_KIND_SNAPSHOT_END;
  m->u.snap_session = 0x1234567890abcdefULL;
  round_trip(m, o);
  assert_int_equal(o->u.snap_session, 0x1234567890abcdefULL);
  embps_msg_free(o);
  memset(m, 0, sizeof *m);
  m->kind = EMBPS_KIND_SNAPSHOT_END | EMBPS_KIND_REPLY;
  round_trip(m, o);
  embps_msg_free(o);
  free(m);
  free(o);
}

static void test_stats_reply(void **state) {
  (void)state;
  embps_msg_t *m = new_msg(EMBPS_KIND_STATS | EMBPS_KIND_REPLY);
  embps_msg_t *o = new_msg(0);
  embps_server_stats_t *s = &m->u.stats;
  embps_table_info_t infos[3];
  full_info(&infos[0], "a", 0);
  full_info(&infos[1], "b", 1);
  full_info(&infos[2], "c", 2);
  snprintf(s->version, sizeof s->version, "0.1.0");
  s->cluster_size = 4;
  s->cluster_index = 3;
  s->io_threads = 6;
  s->shards = 64;
  s->uptime_ms = 1;
  s->connections = 2;
  s->requests = 3;
  s->pulls = 4;
  s->pushes = 5;
  s->pull_rows = 6;
  s->push_rows = 7;
  s->errors = 8;
  s->bytes_in = 1ULL << 50;
  s->bytes_out = UINT64_MAX;
  s->tables = infos;
  s->n_tables = 3;
  round_trip(m, o);
  const embps_server_stats_t *r = &o->u.stats;
  assert_string_equal(r->version, "0.1.0");
  assert_int_equal(r->cluster_size, 4);
  assert_int_equal(r->cluster_index, 3);
  assert_int_equal(r->io_threads, 6);
  assert_int_equal(r->shards, 64);
  assert_int_equal(r->uptime_ms, 1);
  assert_int_equal(r->connections, 2);
  assert_int_equal(r->requests, 3);
  assert_int_equal(r->pulls, 4);
  assert_int_equal(r->pushes, 5);
  assert_int_equal(r->pull_rows, 6);
  assert_int_equal(r->push_rows, 7);
  assert_int_equal(r->errors, 8);
  assert_int_equal(r->bytes_in, 1ULL << 50);
  assert_int_equal(r->bytes_out, UINT64_MAX);
  assert_int_equal(r->n_tables, 3);
  for (int i = 0; i < 3; i++)
    assert_info_equal(&r->tables[i], &infos[i]);
  embps_msg_free(o);
  assert_null(o->u.stats.tables);
  free(m);
  free(o);
}

/* A coordinated server's member primaries (issue 22) go through, the
 * empty primary of an election too; a reply of more than
 * EMBPS_STATS_MEMBERS_MAX of them, or an address past its field, is
 * refused (EMBPS_EPROTO) before the caller sees any. */
static int stats_with_members(uint32_t n, embps_msg_t *out) {
  embps_msg_t *m = new_msg(EMBPS_KIND_STATS | EMBPS_KIND_REPLY);
  embps_member_primary_t *v = calloc(n, sizeof *v);
  assert_non_null(v);
  for (uint32_t i = 0; i < n; i++) {
    v[i].member = i;
    v[i].epoch = i % 3 ? i + 7 : 0;
    if (i % 3) /* every third: an election, no primary */
      snprintf(v[i].primary, sizeof v[i].primary, "10.0.%u.%u:7070",
               i / 256, i % 256);
  }
  snprintf(m->u.stats.version, sizeof m->u.stats.version, "0.1.0");
  m->u.stats.members = v;
  m->u.stats.n_members = n;
  size_t len = embps_msg_size(m);
  uint8_t *buf = malloc(len + 1);
  assert_non_null(buf);
  embps_msg_pack(m, buf);
  int rc = embps_msg_unpack(m->kind, buf, len, out);
  free(buf);
  free(v);
  free(m);
  return rc;
}

/* A stats reply holding one member primary whose address is len bytes. */
static int stats_member_addr(size_t len, embps_msg_t *out) {
  char addr[300];
  assert_true(len < sizeof addr);
  memset(addr, 'h', len);
  addr[len] = 0;
  pb_t inner = {.n = 0}, p = {.n = 0};
  pb_uint(&inner, 1, 0);
  pb_str(&inner, 3, addr);
  pb_str(&p, 16, "0.1.0");
  pb_bytes(&p, 34, inner.b, inner.n);
  return embps_msg_unpack(EMBPS_KIND_STATS | EMBPS_KIND_REPLY, p.b, p.n, out);
}

static void test_stats_members(void **state) {
  (void)state;
  embps_msg_t *o = new_msg(0);
  assert_int_equal(stats_with_members(5, o), 0);
  const embps_server_stats_t *r = &o->u.stats;
  assert_int_equal(r->n_members, 5);
  assert_int_equal(r->members[0].member, 0);
  assert_string_equal(r->members[0].primary, "");
  assert_int_equal(r->members[0].epoch, 0);
  assert_int_equal(r->members[4].member, 4);
  assert_string_equal(r->members[4].primary, "10.0.0.4:7070");
  assert_int_equal(r->members[4].epoch, 11);
  embps_msg_free(o);
  assert_null(o->u.stats.members);
  assert_int_equal(o->u.stats.n_members, 0);
  memset(o, 0, sizeof *o);
  assert_int_equal(stats_with_members(EMBPS_STATS_MEMBERS_MAX, o), 0);
  assert_int_equal(o->u.stats.n_members, EMBPS_STATS_MEMBERS_MAX);
  embps_msg_free(o);
  memset(o, 0, sizeof *o);
  assert_int_equal(stats_with_members(EMBPS_STATS_MEMBERS_MAX + 1, o),
                   EMBPS_EPROTO);
  memset(o, 0, sizeof *o);
  assert_int_equal(stats_member_addr(sizeof r->members[0].primary - 1, o), 0);
  assert_int_equal(strlen(o->u.stats.members[0].primary),
                   sizeof r->members[0].primary - 1);
  embps_msg_free(o);
  memset(o, 0, sizeof *o);
  assert_int_equal(stats_member_addr(sizeof r->members[0].primary, o),
                   EMBPS_EPROTO);
  free(o);
}

/* A stats reply's sync_degraded (--sync-degrade-ms) is a flag: 0 and 1
 * round-trip, anything else is refused (EMBPS_EPROTO). */
static void test_stats_sync_degraded(void **state) {
  (void)state;
  embps_msg_t *o = new_msg(0);
  for (uint64_t v = 0; v < 3; v++) {
    pb_t p = {.n = 0};
    pb_str(&p, 16, "0.1.0");
    pb_uint(&p, 35, v);
    memset(o, 0, sizeof *o);
    int rc = embps_msg_unpack(EMBPS_KIND_STATS | EMBPS_KIND_REPLY, p.b, p.n,
                              o);
    if (v < 2) {
      assert_int_equal(rc, 0);
      assert_int_equal(o->u.stats.sync_degraded, v);
      embps_msg_free(o);
    } else {
      assert_int_equal(rc, EMBPS_EPROTO);
    }
  }
  embps_msg_t *m = new_msg(EMBPS_KIND_STATS | EMBPS_KIND_REPLY);
  snprintf(m->u.stats.version, sizeof m->u.stats.version, "0.1.0");
  m->u.stats.sync_degraded = 1;
  size_t len = embps_msg_size(m);
  uint8_t *buf = malloc(len + 1);
  assert_non_null(buf);
  embps_msg_pack(m, buf);
  memset(o, 0, sizeof *o);
  assert_int_equal(embps_msg_unpack(m->kind, buf, len, o), 0);
  assert_int_equal(o->u.stats.sync_degraded, 1);
  embps_msg_free(o);
  free(buf);
  free(m);
  free(o);
}

/* Requests and replies without a body (LIST, STATS, CREATE and DROP
 * replies) pack as an empty Ack and unpack. */
static void test_ack_kinds(void **state) {
  (void)state;
  const uint16_t kinds[] = {EMBPS_KIND_LIST, EMBPS_KIND_STATS,
                            EMBPS_KIND_EVICT | EMBPS_KIND_REPLY,
                            EMBPS_KIND_CREATE | EMBPS_KIND_REPLY,
                            EMBPS_KIND_DROP | EMBPS_KIND_REPLY};
  embps_msg_t *m = new_msg(0), *o = new_msg(0);
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
    m->kind = kinds[i];
    round_trip(m, o);
    embps_msg_free(o);
    assert_int_equal(embps_msg_unpack(kinds[i], NULL, 0, o), 0);
    embps_msg_free(o);
  }
  free(m);
  free(o);
}

/* ------------------------------------------------------------------ frames */

static void test_frame_build(void **state) {
  (void)state;
  embps_msg_t *msgs[4];
  msgs[0] = new_msg(EMBPS_KIND_PULL);
  snprintf(msgs[0]->u.pull.table, sizeof msgs[0]->u.pull.table, "t");
  msgs[0]->u.pull.n_ids = 3;
  msgs[0]->u.pull.dim = 4;
  msgs[1] = new_msg(EMBPS_KIND_CREATE);
  full_spec(&msgs[1]->u.spec, "created", 0, EMBPS_OPT_FTRL);
  msgs[2] = new_msg(EMBPS_KIND_LIST); /* empty meta */
  msgs[3] = new_msg(EMBPS_KIND_PUSH);
  snprintf(msgs[3]->u.push.table, sizeof msgs[3]->u.push.table, "abcdefg");
  msgs[3]->u.push.n = 5;
  msgs[3]->u.push.dim = 2;
  const size_t bulks[] = {0, 1, 7, 8, 24, 4096 + 3};
  embps_msg_t *o = new_msg(0);
  for (size_t mi = 0; mi < 4; mi++) {
    for (size_t bi = 0; bi < sizeof bulks / sizeof *bulks; bi++) {
      uint8_t *f = NULL;
      size_t len = 0, off = 0;
      uint32_t req = 1000u + (uint32_t)(mi * 10 + bi);
      assert_int_equal(
          embps_frame_build(msgs[mi], req, bulks[bi], &f, &len, &off), 0);
      assert_non_null(f);
      embps_frame_header_t h;
      assert_int_equal(embps_frame_header_decode(f, len, &h), 0);
      size_t meta = embps_msg_size(msgs[mi]);
      assert_int_equal(h.kind, msgs[mi]->kind);
      assert_int_equal(h.req_id, req);
      assert_int_equal(h.meta_len, meta);
      assert_int_equal(h.body_len, len - EMBPS_FRAME_HEADER_LEN);
      assert_int_equal(off % 8, 0);
      assert_int_equal(off, EMBPS_FRAME_HEADER_LEN + embps_bulk_offset(meta));
      assert_int_equal(off + bulks[bi], len);
      for (size_t p = EMBPS_FRAME_HEADER_LEN + meta; p < off; p++)
        assert_int_equal(f[p], 0); /* zero padding */
      memset(f + off, 0x5a, bulks[bi]); /* the bulk region is ours */
      assert_int_equal(
          embps_msg_unpack(h.kind, f + EMBPS_FRAME_HEADER_LEN, h.meta_len, o),
          0);
      if (mi == 0) {
        assert_string_equal(o->u.pull.table, "t");
        assert_int_equal(o->u.pull.n_ids, 3);
      } else if (mi == 1) {
        assert_spec_equal(&o->u.spec, &msgs[1]->u.spec);
      } else if (mi == 3) {
        assert_string_equal(o->u.push.table, "abcdefg");
        assert_int_equal(o->u.push.n, 5);
      }
      embps_msg_free(o);
      free(f);
    }
  }
  /* a body past 4 GiB cannot be framed (u32 body_len) */
  {
    uint8_t *f = NULL;
    size_t len = 0, off = 0;
    int rc = embps_frame_build(msgs[0], 1, (size_t)UINT32_MAX, &f, &len, &off);
    assert_true(rc == EMBPS_EFRAMESIZE || rc == -ENOMEM);
    free(f);
  }
  /* error frames, with and without a message */
  uint8_t *f;
  size_t len;
  assert_int_equal(
      embps_frame_error(77, EMBPS_ERANGE, "id 12 out of range", &f, &len), 0);
  embps_frame_header_t h;
  assert_int_equal(embps_frame_header_decode(f, len, &h), 0);
  assert_int_equal(h.kind, EMBPS_KIND_ERROR);
  assert_int_equal(h.req_id, 77);
  assert_int_equal(h.body_len + EMBPS_FRAME_HEADER_LEN, len);
  assert_int_equal(
      embps_msg_unpack(h.kind, f + EMBPS_FRAME_HEADER_LEN, h.meta_len, o), 0);
  assert_int_equal(o->u.error.code, EMBPS_ERANGE);
  assert_string_equal(o->u.error.message, "id 12 out of range");
  free(f);
  assert_int_equal(embps_frame_error(78, EMBPS_EAUTH, NULL, &f, &len), 0);
  assert_int_equal(embps_frame_header_decode(f, len, &h), 0);
  assert_int_equal(
      embps_msg_unpack(h.kind, f + EMBPS_FRAME_HEADER_LEN, h.meta_len, o), 0);
  assert_int_equal(o->u.error.code, EMBPS_EAUTH);
  assert_string_equal(o->u.error.message, embps_strerror(EMBPS_EAUTH));
  free(f);
  for (size_t mi = 0; mi < 4; mi++)
    free(msgs[mi]);
  free(o);
}

/* --------------------------------------------------------- refusals */

static void test_garbage(void **state) {
  (void)state;
  static const uint8_t g1[] = {0xff, 0xff, 0xff, 0xff, 0xff,
                               0xff, 0xff, 0xff, 0xff, 0xff};
  static const uint8_t g2[] = {0x0a, 0x7f, 'x'}; /* length past the end */
  static const uint8_t g3[] = {0x0f, 0x01};      /* wire type 7 */
  static const uint8_t g4[] = {0x08};            /* varint cut short */
  static const uint8_t g5[] = {0x08, 0x80};      /* varint cut short */
  static const uint8_t g6[] = {0x0b, 0x08, 0x01}; /* unclosed group */
  const struct {
    const uint8_t *b;
    size_t n;
  } garbage[] = {{g1, sizeof g1}, {g2, sizeof g2}, {g3, sizeof g3},
                 {g4, sizeof g4}, {g5, sizeof g5}, {g6, sizeof g6}};
  embps_msg_t *o = new_msg(0);
  for (size_t k = 0; k < N_KNOWN; k++) {
    for (size_t g = 0; g < sizeof garbage / sizeof *garbage; g++) {
      int rc = embps_msg_unpack(known_kinds[k], garbage[g].b, garbage[g].n, o);
      if (rc != EMBPS_EPROTO) {
        print_error("kind 0x%x, garbage %zu: got %d\n", known_kinds[k], g, rc);
        fail();
      }
    }
  }
  /* messages with required fields refuse an empty buffer */
  const uint16_t required[] = {
      EMBPS_KIND_HELLO, EMBPS_KIND_HELLO | EMBPS_KIND_REPLY, EMBPS_KIND_ERROR,
      EMBPS_KIND_CREATE, EMBPS_KIND_DROP, EMBPS_KIND_DESCRIBE,
      EMBPS_KIND_DESCRIBE | EMBPS_KIND_REPLY, EMBPS_KIND_PULL,
      EMBPS_KIND_PULL | EMBPS_KIND_REPLY, EMBPS_KIND_PUSH,
      EMBPS_KIND_PUSH | EMBPS_KIND_REPLY};
  for (size_t k = 0; k < sizeof required / sizeof *required; k++)
    assert_int_equal(embps_msg_unpack(required[k], g1, 0, o), EMBPS_EPROTO);
  /* a CREATE whose spec lacks its required dim */
  pb_t spec = {.n = 0}, msg = {.n = 0};
  pb_str(&spec, 1, "t");
  pb_sub(&msg, 1, &spec);
  assert_int_equal(unpack_pb(EMBPS_KIND_CREATE, &msg), EMBPS_EPROTO);
  /* ... which decodes once dim is there */
  pb_uint(&spec, 2, 8);
  msg.n = 0;
  pb_sub(&msg, 1, &spec);
  assert_int_equal(unpack_pb(EMBPS_KIND_CREATE, &msg), 0);
  free(o);
}

/* A 32-bit field whose varint holds more than 32 bits is refused, saying
 * which field, not cut to its low bits (a CREATE with dim 2^32 + 4 would
 * make a dim-4 table); the largest 32-bit value still decodes. */
static void test_varint_width(void **state) {
  (void)state;
  const uint64_t wide[] = {(1ULL << 32) + 4, 1ULL << 32, UINT64_MAX};
  embps_msg_t *o = new_msg(0);
  for (size_t i = 0; i < sizeof wide / sizeof *wide; i++) {
    pb_t spec = {.n = 0}, msg = {.n = 0};
    pb_str(&spec, 1, "t");
    pb_uint(&spec, 2, wide[i]);
    pb_sub(&msg, 1, &spec);
    char why[160];
    assert_int_equal(embps_msg_unpack_why(EMBPS_KIND_CREATE, msg.b, msg.n, o,
                                          why, sizeof why),
                     EMBPS_EPROTO);
    assert_non_null(strstr(why, "dim"));
    assert_non_null(strstr(why, "32 bits"));
    assert_int_equal(unpack_pb(EMBPS_KIND_CREATE, &msg), EMBPS_EPROTO);
  }
  /* in a spec's other 32-bit fields, and in a pull's dim and count */
  pb_t spec = {.n = 0}, msg = {.n = 0};
  pb_str(&spec, 1, "t");
  pb_uint(&spec, 2, 8);
  pb_uint(&spec, 21, (1ULL << 32) + 1); /* sync_workers */
  pb_sub(&msg, 1, &spec);
  assert_int_equal(unpack_pb(EMBPS_KIND_CREATE, &msg), EMBPS_EPROTO);
  pb_t pull = {.n = 0};
  pb_str(&pull, 1, "t");
  pb_uint(&pull, 2, 1ULL << 33);
  pb_uint(&pull, 3, 8);
  assert_int_equal(unpack_pb(EMBPS_KIND_PULL, &pull), EMBPS_EPROTO);
  /* the largest value that fits decodes as itself */
  spec.n = msg.n = 0;
  pb_str(&spec, 1, "t");
  pb_uint(&spec, 2, UINT32_MAX);
  pb_sub(&msg, 1, &spec);
  assert_int_equal(embps_msg_unpack(EMBPS_KIND_CREATE, msg.b, msg.n, o), 0);
  assert_int_equal(o->u.spec.dim, UINT32_MAX);
  embps_msg_free(o);
  /* a 64-bit field takes the whole varint */
  spec.n = msg.n = 0;
  pb_str(&spec, 1, "t");
  pb_uint(&spec, 2, 8);
  pb_uint(&spec, 3, (1ULL << 40) + 1); /* rows */
  pb_sub(&msg, 1, &spec);
  assert_int_equal(embps_msg_unpack(EMBPS_KIND_CREATE, msg.b, msg.n, o), 0);
  assert_true(o->u.spec.rows == (1ULL << 40) + 1);
  embps_msg_free(o);
  free(o);
}

static void test_unknown_kind(void **state) {
  (void)state;
  const uint16_t kinds[] = {0,      0x30,   0x10,   0x7f,  0x80,  0xb0,
                            0xfe,   0x100,  0x101,  0x1ff, 0x8000, 0xffff,
                            EMBPS_KIND_ERROR | 0x100};
  /* a valid Pull meta, so only the kind is wrong */
  pb_t p = {.n = 0};
  pb_str(&p, 1, "t");
  pb_uint(&p, 2, 1);
  pb_uint(&p, 3, 1);
  assert_int_equal(unpack_pb(EMBPS_KIND_PULL, &p), 0);
  embps_msg_t *o = new_msg(0);
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
    assert_int_equal(unpack_pb(kinds[i], &p), EMBPS_EKIND);
    assert_int_equal(embps_msg_unpack(kinds[i], NULL, 0, o), EMBPS_EKIND);
    o->kind = kinds[i];
    assert_int_equal(embps_msg_size(o), 0);
  }
  free(o);
}

/* Builds a message of `kind` carrying table name `name`. */
static void named_msg(pb_t *p, uint16_t kind, const char *name) {
  pb_t spec = {.n = 0}, info = {.n = 0};
  p->n = 0;
  switch (kind) {
  case EMBPS_KIND_DROP:
  case EMBPS_KIND_DESCRIBE:
    pb_str(p, 1, name);
    break;
  case EMBPS_KIND_PULL:
  case EMBPS_KIND_PUSH:
    pb_str(p, 1, name);
    pb_uint(p, 2, 1);
    pb_uint(p, 3, 4);
    break;
  default: /* specs: CREATE, DESCRIBE/LIST/STATS replies */
    pb_str(&spec, 1, name);
    pb_uint(&spec, 2, 4);
    if (kind == EMBPS_KIND_CREATE) {
      pb_sub(p, 1, &spec);
      break;
    }
    pb_sub(&info, 1, &spec);
    if (kind == (EMBPS_KIND_DESCRIBE | EMBPS_KIND_REPLY)) {
      *p = info;
    } else if (kind == (EMBPS_KIND_LIST | EMBPS_KIND_REPLY)) {
      pb_t ok = {.n = 0}, ok_spec = {.n = 0};
      pb_str(&ok_spec, 1, "fine");
      pb_uint(&ok_spec, 2, 4);
      pb_sub(&ok, 1, &ok_spec);
      pb_sub(p, 1, &ok); /* a good table first */
      pb_sub(p, 1, &info);
    } else {
      pb_sub(p, 15, &info); /* StatsReply.tables */
    }
    break;
  }
}

static void test_name_bounds(void **state) {
  (void)state;
  const uint16_t kinds[] = {EMBPS_KIND_DROP,
                            EMBPS_KIND_DESCRIBE,
                            EMBPS_KIND_PULL,
                            EMBPS_KIND_PUSH,
                            EMBPS_KIND_CREATE,
                            EMBPS_KIND_DESCRIBE | EMBPS_KIND_REPLY,
                            EMBPS_KIND_LIST | EMBPS_KIND_REPLY,
                            EMBPS_KIND_STATS | EMBPS_KIND_REPLY};
  char name[1001];
  pb_t p;
  for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
    /* 1 and 127 characters are fine */
    make_name(name, 1);
    named_msg(&p, kinds[k], name);
    assert_int_equal(unpack_pb(kinds[k], &p), 0);
    make_name(name, EMBPS_TABLE_NAME_MAX - 1);
    named_msg(&p, kinds[k], name);
    assert_int_equal(unpack_pb(kinds[k], &p), 0);
    /* empty, 128 and more are not */
    const size_t bad[] = {0, EMBPS_TABLE_NAME_MAX, EMBPS_TABLE_NAME_MAX + 1,
                          300, 1000};
    for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
      make_name(name, bad[b]);
      named_msg(&p, kinds[k], name);
      int rc = unpack_pb(kinds[k], &p);
      if (rc != EMBPS_EPROTO) {
        print_error("kind 0x%x, name of %zu chars: got %d\n", kinds[k], bad[b],
                    rc);
        fail();
      }
    }
  }
}

/* Other bounded fields: the hello token and the stats version string. */
static void test_other_bounds(void **state) {
  (void)state;
  uint8_t token[EMBPS_TOKEN_MAX + 1];
  memset(token, 't', sizeof token);
  pb_t p = {.n = 0};
  pb_uint(&p, 1, 1);
  pb_bytes(&p, 2, token, EMBPS_TOKEN_MAX);
  assert_int_equal(unpack_pb(EMBPS_KIND_HELLO, &p), 0);
  p.n = 0;
  pb_uint(&p, 1, 1);
  pb_bytes(&p, 2, token, EMBPS_TOKEN_MAX + 1);
  assert_int_equal(unpack_pb(EMBPS_KIND_HELLO, &p), EMBPS_EPROTO);

  char v[40];
  embps_server_stats_t *s = NULL;
  make_name(v, sizeof s->version - 1);
  p.n = 0;
  pb_str(&p, 16, v);
  assert_int_equal(unpack_pb(EMBPS_KIND_STATS | EMBPS_KIND_REPLY, &p), 0);
  make_name(v, sizeof s->version);
  p.n = 0;
  pb_str(&p, 16, v);
  assert_int_equal(unpack_pb(EMBPS_KIND_STATS | EMBPS_KIND_REPLY, &p),
                   EMBPS_EPROTO);
}

/* ------------------------------------------------------------- spec check */

static void valid_spec(embps_table_spec_t *s, embps_optimizer_t opt,
                       int dynamic) {
  embps_table_spec_init(s, "emb.table-1_x", 16, opt);
  if (dynamic)
    s->dynamic = 1;
  else
    s->rows = 1000;
}

#define EXPECT_REFUSED(mutation)                                              \
  do {                                                                        \
    embps_table_spec_t s_;                                                    \
    char why_[256] = "";                                                      \
    valid_spec(&s_, base_opt, base_dyn);                                      \
    assert_int_equal(embps_table_spec_check(&s_, NULL, 0), 0);                \
    {                                                                         \
      embps_table_spec_t *s = &s_;                                            \
      mutation;                                                               \
    }                                                                         \
    int rc_ = embps_table_spec_check(&s_, why_, sizeof why_);                 \
    if (rc_ != EMBPS_EPARAM) {                                                \
      print_error("%s (%s, %s) accepted: %d\n", #mutation,                    \
                  embps_optimizer_name(base_opt),                             \
                  base_dyn ? "dynamic" : "dense", rc_);                       \
      fail();                                                                 \
    }                                                                         \
    assert_true(why_[0] != 0);                                                \
    assert_int_equal(embps_table_spec_check(&s_, NULL, 0), EMBPS_EPARAM);     \
  } while (0)

#define EXPECT_ACCEPTED(mutation)                                             \
  do {                                                                        \
    embps_table_spec_t s_;                                                    \
    char why_[256] = "";                                                      \
    valid_spec(&s_, base_opt, base_dyn);                                      \
    {                                                                         \
      embps_table_spec_t *s = &s_;                                            \
      mutation;                                                               \
    }                                                                         \
    int rc_ = embps_table_spec_check(&s_, why_, sizeof why_);                 \
    if (rc_ != 0) {                                                           \
      print_error("%s refused: %s\n", #mutation, why_);                       \
      fail();                                                                 \
    }                                                                         \
  } while (0)

static void test_spec_defaults(void **state) {
  (void)state;
  for (int opt = EMBPS_OPT_SGD; opt <= EMBPS_OPT_FTRL; opt++) {
    embps_table_spec_t s;
    embps_table_spec_init(&s, "t", 8, (embps_optimizer_t)opt);
    assert_string_equal(s.name, "t");
    assert_int_equal(s.dim, 8);
    assert_int_equal(s.optimizer, opt);
    assert_true(s.lr == 0.01);
    assert_int_equal(s.init, EMBPS_INIT_ZEROS);
    assert_int_equal(s.has_padding, 0);
    assert_int_equal(s.dtype, EMBPS_DTYPE_F32);
    assert_int_equal(s.sync_workers, 0);
    if (opt == EMBPS_OPT_ADAGRAD)
      assert_true(s.eps == 1e-10);
    if (opt == EMBPS_OPT_ADAM) {
      assert_true(s.beta1 == 0.9);
      assert_true(s.beta2 == 0.999);
      assert_true(s.eps == 1e-8);
    }
    if (opt == EMBPS_OPT_FTRL) {
      assert_true(s.initial_accumulator == 0.1);
      assert_true(s.lr_power == -0.5);
    }
    s.rows = 100;
    assert_int_equal(embps_table_spec_check(&s, NULL, 0), 0);
    s.rows = 0;
    s.dynamic = 1;
    assert_int_equal(embps_table_spec_check(&s, NULL, 0), 0);
  }
}

/* ALTER: exactly the fields set travel; its reply is a TableInfo. And
 * embps_table_spec_alter writes those fields or, refused, nothing. */
static void test_alter(void **state) {
  (void)state;
  embps_msg_t *m = new_msg(EMBPS_KIND_ALTER), *o = new_msg(0);
  snprintf(m->u.alter.name, sizeof m->u.alter.name, "t.1");
  m->u.alter.set = (embps_table_alter_t){
      .size = sizeof(embps_table_alter_t),
      .set = EMBPS_ALTER_LR | EMBPS_ALTER_BETA2 | EMBPS_ALTER_WEIGHT_DECAY,
      .lr = 0.125, .beta2 = 0.98, .weight_decay = 1e-4};
  round_trip(m, o);
  assert_string_equal(o->u.alter.name, "t.1");
  assert_memory_equal(&o->u.alter.set, &m->u.alter.set,
                      sizeof m->u.alter.set);
  embps_msg_free(o);
  m->u.alter.set = (embps_table_alter_t){
      .size = sizeof(embps_table_alter_t), .set = EMBPS_ALTER_ALL, .lr = 1,
      .eps = 2, .beta1 = 3, .beta2 = 4, .l1 = 5, .l2 = 6, .lr_power = 7,
      .weight_decay = 8};
  round_trip(m, o);
  assert_memory_equal(&o->u.alter.set, &m->u.alter.set,
                      sizeof m->u.alter.set);
  embps_msg_free(o);
  memset(m, 0, sizeof *m);
  m->kind = EMBPS_KIND_ALTER | EMBPS_KIND_REPLY;
  full_info(&m->u.info, "altered", 3);
  round_trip(m, o);
  assert_info_equal(&o->u.info, &m->u.info);
  embps_msg_free(o);

  embps_table_spec_t s, before;
  embps_table_spec_init(&s, "t", 4, EMBPS_OPT_ADAM);
  s.rows = 10;
  before = s;
  char why[128];
  embps_table_alter_t a = {.size = sizeof a,
                           .set = EMBPS_ALTER_LR | EMBPS_ALTER_BETA1,
                           .lr = 0.5, .beta1 = 1};
  assert_int_equal(embps_table_spec_alter(&s, &a, why, sizeof why),
                   EMBPS_EPARAM);
  assert_string_equal(why, "beta1 must be in [0, 1) (got 1)");
  assert_memory_equal(&s, &before, sizeof s);
  a.set = 1u << 12;
  assert_int_equal(embps_table_spec_alter(&s, &a, why, sizeof why),
                   EMBPS_EPARAM);
  a = (embps_table_alter_t){.size = sizeof a,
                            .set = EMBPS_ALTER_LR | EMBPS_ALTER_L2,
                            .lr = 0.5, .l2 = 0.25};
  assert_int_equal(embps_table_spec_alter(&s, &a, why, sizeof why), 0);
  before.lr = 0.5;
  before.l2 = 0.25;
  assert_memory_equal(&s, &before, sizeof s);
  free(m);
  free(o);
}

/* Admission and eviction: dynamic tables only, every field bounded. */
static void test_spec_dynamic_refusals(void **state) {
  (void)state;
  embps_table_spec_t s;
  full_spec(&s, "t", 1, EMBPS_OPT_ADAGRAD);
  assert_int_equal(embps_table_spec_check(&s, NULL, 0), 0);
  char why[128];
  embps_table_spec_t bad[7];
  for (int i = 0; i < 7; i++)
    bad[i] = s;
  bad[0].dynamic = 0, bad[0].rows = 10, bad[0].padding_id = 1;
  bad[1].admit_after = 65536;
  bad[2].admit_probability = 1.5;
  bad[3].admit_probability = -0.1;
  bad[4].admit_sketch_bytes = (1ULL << 34) + 1;
  bad[5].evict = 2;
  bad[6].evict_l2_below = -1;
  for (int i = 0; i < 7; i++)
    assert_int_equal(embps_table_spec_check(&bad[i], why, sizeof why),
                     EMBPS_EPARAM);
  assert_non_null(strstr(
      (embps_table_spec_check(&bad[0], why, sizeof why), why), "--dynamic"));
}

static void test_spec_refusals(void **state) {
  (void)state;
  for (int oi = EMBPS_OPT_SGD; oi <= EMBPS_OPT_FTRL; oi++) {
    for (int base_dyn = 0; base_dyn <= 1; base_dyn++) {
      const embps_optimizer_t base_opt = (embps_optimizer_t)oi;
      EXPECT_REFUSED(s->lr = 0);
      EXPECT_REFUSED(s->lr = -0.01);
      EXPECT_REFUSED(s->beta1 = -0.1);
      EXPECT_REFUSED(s->beta1 = 1.0);
      EXPECT_REFUSED(s->beta1 = 1.5);
      EXPECT_REFUSED(s->beta2 = -1e-9);
      EXPECT_REFUSED(s->beta2 = 1.0);
      EXPECT_REFUSED(s->beta2 = 2.0);
      EXPECT_REFUSED(s->lr_power = 0.1);
      EXPECT_REFUSED(s->lr_power = 1e-12);
      EXPECT_REFUSED(s->l1 = -0.1);
      EXPECT_REFUSED(s->l2 = -1e-9);
      EXPECT_REFUSED(s->eps = -1e-8);
      EXPECT_REFUSED(s->weight_decay = -0.01);
      EXPECT_REFUSED(s->initial_accumulator = -0.5);
      EXPECT_REFUSED(s->dim = 0);
      EXPECT_REFUSED(s->dim = EMBPS_DIM_MAX + 1);
      EXPECT_REFUSED(s->optimizer = (embps_optimizer_t)4);
      EXPECT_REFUSED(s->init = (embps_init_t)4);
      EXPECT_REFUSED(s->dtype = (embps_dtype_t)3);
      EXPECT_ACCEPTED(s->dtype = EMBPS_DTYPE_F16);
      EXPECT_ACCEPTED(s->dtype = EMBPS_DTYPE_BF16);
      EXPECT_REFUSED(s->sync_workers = 4097);
      EXPECT_REFUSED(s->init = EMBPS_INIT_UNIFORM; s->init_value = -0.1);
      EXPECT_REFUSED(s->init = EMBPS_INIT_NORMAL; s->init_value = -0.1);
      /* initial rows finite in the dtype: normal draws reach 8.66 std */
      EXPECT_REFUSED(s->init = EMBPS_INIT_NORMAL; s->init_value = 1e300);
      EXPECT_REFUSED(s->init = EMBPS_INIT_NORMAL; s->init_value = 4e37);
      EXPECT_ACCEPTED(s->init = EMBPS_INIT_NORMAL; s->init_value = 3.9e37);
      EXPECT_REFUSED(s->init = EMBPS_INIT_NORMAL; s->init_value = 7600;
                     s->dtype = EMBPS_DTYPE_F16);
      EXPECT_ACCEPTED(s->init = EMBPS_INIT_NORMAL; s->init_value = 7500;
                      s->dtype = EMBPS_DTYPE_F16);
      EXPECT_REFUSED(s->init = EMBPS_INIT_UNIFORM; s->init_value = 1e39);
      EXPECT_REFUSED(s->init = EMBPS_INIT_UNIFORM; s->init_value = 65600;
                     s->dtype = EMBPS_DTYPE_F16);
      EXPECT_ACCEPTED(s->init = EMBPS_INIT_UNIFORM; s->init_value = 65504;
                      s->dtype = EMBPS_DTYPE_F16);
      EXPECT_REFUSED(s->init = EMBPS_INIT_CONSTANT; s->init_value = -1e39);
      EXPECT_REFUSED(s->init = EMBPS_INIT_CONSTANT; s->init_value = 3.4e38;
                     s->dtype = EMBPS_DTYPE_BF16);
      EXPECT_ACCEPTED(s->init = EMBPS_INIT_CONSTANT; s->init_value = -3.4e38);
      EXPECT_ACCEPTED(s->init = EMBPS_INIT_ZEROS; s->init_value = 1e300);
      /* parameters the optimizers keep as float32 */
      EXPECT_REFUSED(s->lr = 1e39);
      EXPECT_REFUSED(s->initial_accumulator = 1e300);
      EXPECT_REFUSED(s->l2 = 3.5e38);
      EXPECT_REFUSED(s->lr_power = -1e39);
      /* dense vs dynamic */
      if (base_dyn) {
        EXPECT_REFUSED(s->rows = 10);
        EXPECT_ACCEPTED(s->has_padding = 1; s->padding_id = INT64_MIN);
        EXPECT_ACCEPTED(s->has_padding = 1; s->padding_id = -5);
      } else {
        EXPECT_REFUSED(s->rows = 0);
        EXPECT_REFUSED(s->rows = (1ULL << 40) + 1);
        EXPECT_REFUSED(s->has_padding = 1; s->padding_id = 1000);
        EXPECT_REFUSED(s->has_padding = 1; s->padding_id = -1);
        EXPECT_REFUSED(s->has_padding = 1; s->padding_id = INT64_MAX);
        EXPECT_REFUSED(s->has_padding = 1; s->padding_id = INT64_MIN);
        EXPECT_ACCEPTED(s->has_padding = 1; s->padding_id = 999);
        EXPECT_ACCEPTED(s->has_padding = 1; s->padding_id = 0);
        /* padding_id only matters with has_padding */
        EXPECT_ACCEPTED(s->padding_id = -1);
        EXPECT_ACCEPTED(s->rows = 1ULL << 40);
      }
      /* non-finite parameters, each one */
      const double bad[] = {NAN, INFINITY, -INFINITY};
      for (size_t b = 0; b < 3; b++) {
        const double x = bad[b];
        EXPECT_REFUSED(s->lr = x);
        EXPECT_REFUSED(s->eps = x);
        EXPECT_REFUSED(s->beta1 = x);
        EXPECT_REFUSED(s->beta2 = x);
        EXPECT_REFUSED(s->initial_accumulator = x);
        EXPECT_REFUSED(s->l1 = x);
        EXPECT_REFUSED(s->l2 = x);
        EXPECT_REFUSED(s->lr_power = x);
        EXPECT_REFUSED(s->weight_decay = x);
        EXPECT_REFUSED(s->init_value = x);
        EXPECT_REFUSED(s->init = EMBPS_INIT_UNIFORM; s->init_value = x);
      }
      /* bad names */
      EXPECT_REFUSED(s->name[0] = 0);
      EXPECT_REFUSED(memcpy(s->name, "a b", 4));
      EXPECT_REFUSED(memcpy(s->name, "a/b", 4));
      EXPECT_REFUSED(memcpy(s->name, "tab\t", 5));
      EXPECT_REFUSED(memcpy(s->name, "caf\xc3\xa9", 6));
      EXPECT_REFUSED(memcpy(s->name, "x;rm", 5));
      EXPECT_REFUSED(memcpy(s->name, "new\nline", 9));
      EXPECT_REFUSED(memset(s->name, 'a', EMBPS_TABLE_NAME_MAX));
      /* boundaries that are fine */
      EXPECT_ACCEPTED(make_name(s->name, EMBPS_TABLE_NAME_MAX - 1));
      EXPECT_ACCEPTED(memcpy(s->name, "A-z_0.9", 8));
      EXPECT_ACCEPTED(s->beta1 = 0; s->beta2 = 0);
      EXPECT_ACCEPTED(s->beta1 = 0.999999; s->beta2 = 0.999999);
      EXPECT_ACCEPTED(s->lr_power = 0);
      EXPECT_ACCEPTED(s->lr_power = -2);
      EXPECT_ACCEPTED(s->l1 = 0.5; s->l2 = 0.5; s->weight_decay = 0.1);
      EXPECT_ACCEPTED(s->dim = EMBPS_DIM_MAX);
      EXPECT_ACCEPTED(s->sync_workers = 4096);
      EXPECT_ACCEPTED(s->init = EMBPS_INIT_UNIFORM; s->init_value = 0.05;
                      s->seed = UINT64_MAX);
      EXPECT_ACCEPTED(s->init = EMBPS_INIT_CONSTANT; s->init_value = -3);
      /* the initial accumulator: ftrl needs > 0, the others >= 0 */
      if (base_opt == EMBPS_OPT_FTRL)
        EXPECT_REFUSED(s->initial_accumulator = 0);
      else
        EXPECT_ACCEPTED(s->initial_accumulator = 0);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hello),
      cmocka_unit_test(test_hello_reply_and_error),
      cmocka_unit_test(test_create_drop_describe),
      cmocka_unit_test(test_list_reply),
      cmocka_unit_test(test_pull_push),
      cmocka_unit_test(test_scan_write_rows),
      cmocka_unit_test(test_snapshot),
      cmocka_unit_test(test_stats_reply),
      cmocka_unit_test(test_stats_members),
      cmocka_unit_test(test_stats_sync_degraded),
      cmocka_unit_test(test_ack_kinds),
      cmocka_unit_test(test_frame_build),
      cmocka_unit_test(test_garbage),
      cmocka_unit_test(test_varint_width),
      cmocka_unit_test(test_unknown_kind),
      cmocka_unit_test(test_name_bounds),
      cmocka_unit_test(test_other_bounds),
      cmocka_unit_test(test_spec_defaults),
      cmocka_unit_test(test_spec_refusals),
      cmocka_unit_test(test_alter),
      cmocka_unit_test(test_spec_dynamic_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
