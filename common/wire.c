/* wire.c - embps_msg_t <-> protobuf-c (see wire.h). Decoding copies every
 * field into fixed-size C storage and checks its bounds, so nothing after
 * this layer sees a protobuf pointer or an unbounded string. */
#include "wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embps.pb-c.h"

/* ---- table specs ---- */

/* How a spec field of each kind (EMBPS_TABLE_SPEC_FIELDS) goes on the
 * wire: flags as bools, enums as uint32. */
#define TO_PB_NUM_(v) (v)
#define TO_PB_REAL_(v) (v)
#define TO_PB_FLAG_(v) ((v) != 0)
#define TO_PB_ENUM_(v) ((uint32_t)(v))

static void spec_to_pb(const embps_table_spec_t *s, Embps__TableSpec *p) {
  embps__table_spec__init(p);
  p->name = (char *)s->name;
  p->dim = s->dim;
#define SPEC_TO_PB_(type, field, kind, doc)                                    \
  p->has_##field = 1;                                                          \
  p->field = TO_PB_##kind##_(s->field);
  EMBPS_TABLE_SPEC_FIELDS(SPEC_TO_PB_)
#undef SPEC_TO_PB_
}

static int copy_name(char *dst, const char *src) {
  size_t n = src ? strlen(src) : 0;
  if (n == 0 || n >= EMBPS_TABLE_NAME_MAX)
    return EMBPS_EPROTO;
  memcpy(dst, src, n + 1);
  return 0;
}

/* Missing optional fields take the optimizer's defaults. */
static int spec_from_pb(const Embps__TableSpec *p, embps_table_spec_t *s) {
  embps_optimizer_t opt = p->has_optimizer ? (embps_optimizer_t)p->optimizer
                                           : EMBPS_OPT_SGD;
  embps_table_spec_init(s, NULL, p->dim, opt);
  if (copy_name(s->name, p->name))
    return EMBPS_EPROTO;
#define SPEC_FROM_PB_(type, field, kind, doc)                                  \
  if (p->has_##field)                                                          \
    s->field = (type)p->field;
  EMBPS_TABLE_SPEC_FIELDS(SPEC_FROM_PB_)
#undef SPEC_FROM_PB_
  return 0;
}

static void info_to_pb(const embps_table_info_t *i, Embps__TableInfo *p,
                       Embps__TableSpec *sp) {
  embps__table_info__init(p);
  spec_to_pb(&i->spec, sp);
  p->spec = sp;
#define INFO_TO_PB_(type, field, merge, doc)                                   \
  p->has_##field = 1;                                                          \
  p->field = i->field;
  EMBPS_TABLE_INFO_FIELDS(INFO_TO_PB_)
#undef INFO_TO_PB_
}

static int info_from_pb(const Embps__TableInfo *p, embps_table_info_t *i) {
  memset(i, 0, sizeof *i);
  if (!p->spec || spec_from_pb(p->spec, &i->spec))
    return EMBPS_EPROTO;
#define INFO_FROM_PB_(type, field, merge, doc) i->field = p->field;
  EMBPS_TABLE_INFO_FIELDS(INFO_FROM_PB_)
#undef INFO_FROM_PB_
  return 0;
}

/* ---- alter: a field is present when its bit is set ---- */

static void alter_to_pb(const embps_table_alter_t *a, Embps__AlterTable *p) {
#define X(field, bit)                                                          \
  if (a->set & (bit)) {                                                        \
    p->has_##field = 1;                                                        \
    p->field = a->field;                                                       \
  }
  EMBPS_TABLE_ALTER_FIELDS(X)
#undef X
}

static void alter_from_pb(const Embps__AlterTable *p, embps_table_alter_t *a) {
  embps_table_alter_init(a);
#define X(field, bit)                                                          \
  if (p->has_##field) {                                                        \
    a->set |= (bit);                                                           \
    a->field = p->field;                                                       \
  }
  EMBPS_TABLE_ALTER_FIELDS(X)
#undef X
}

/* Packs a list of infos into freshly allocated protobuf views. */
typedef struct {
  Embps__TableInfo *infos;
  Embps__TableSpec *specs;
  Embps__TableInfo **ptrs;
} info_views_t;

static int views_make(info_views_t *v, const embps_table_info_t *src,
                      size_t n) {
  v->infos = calloc(n ? n : 1, sizeof *v->infos);
  v->specs = calloc(n ? n : 1, sizeof *v->specs);
  v->ptrs = calloc(n ? n : 1, sizeof *v->ptrs);
  if (!v->infos || !v->specs || !v->ptrs) {
    free(v->infos);
    free(v->specs);
    free(v->ptrs);
    return -ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    info_to_pb(&src[i], &v->infos[i], &v->specs[i]);
    v->ptrs[i] = &v->infos[i];
  }
  return 0;
}

static void views_free(info_views_t *v) {
  free(v->infos);
  free(v->specs);
  free(v->ptrs);
}

static int infos_from_pb(Embps__TableInfo **src, size_t n,
                         embps_table_info_t **out) {
  *out = calloc(n ? n : 1, sizeof **out);
  if (!*out)
    return -ENOMEM;
  for (size_t i = 0; i < n; i++) {
    if (info_from_pb(src[i], &(*out)[i])) {
      free(*out);
      *out = NULL;
      return EMBPS_EPROTO;
    }
  }
  return 0;
}

/* ---- epochs (issue 21) ---- */

/* Protobuf views of n epochs: *out (items then pointers, one allocation)
 * or NULL when n is 0. 0 or -ENOMEM. */
static int epochs_to_pb(const embps_epoch_t *src, size_t n,
                        Embps__Epoch ***out) {
  *out = NULL;
  if (!n)
    return 0;
  void *mem = calloc(n, sizeof(Embps__Epoch) + sizeof(Embps__Epoch *));
  if (!mem)
    return -ENOMEM;
  Embps__Epoch *items = mem;
  Embps__Epoch **ptrs = (Embps__Epoch **)(items + n);
  for (size_t i = 0; i < n; i++) {
    embps__epoch__init(&items[i]);
    items[i].epoch = src[i].epoch;
    items[i].start = src[i].start;
    ptrs[i] = &items[i];
  }
  *out = ptrs;
  return 0;
}

/* Frees what epochs_to_pb made (from its pointer array). */
static void epochs_pb_free(Embps__Epoch **ptrs, size_t n) {
  if (ptrs)
    free((Embps__Epoch *)ptrs - n);
}

static int epochs_from_pb(Embps__Epoch **src, size_t n, embps_epoch_t **out,
                          size_t *n_out) {
  *out = NULL;
  *n_out = 0;
  if (n > EMBPS_EPOCHS_MAX)
    return EMBPS_EPROTO;
  if (!n)
    return 0;
  if (!(*out = malloc(n * sizeof **out)))
    return -ENOMEM;
  for (size_t i = 0; i < n; i++)
    (*out)[i] = (embps_epoch_t){src[i]->epoch, src[i]->start};
  *n_out = n;
  return 0;
}

/* ---- member primaries (issue 22) ---- */

/* s->members from a stats reply's: at most EMBPS_STATS_MEMBERS_MAX, each
 * address within its field. 0, EMBPS_EPROTO, or -ENOMEM. */
static int members_from_pb(Embps__MemberPrimary **src, size_t n,
                           embps_server_stats_t *s) {
  s->members = NULL;
  s->n_members = 0;
  if (n > EMBPS_STATS_MEMBERS_MAX)
    return EMBPS_EPROTO;
  if (!n)
    return 0;
  embps_member_primary_t *v = calloc(n, sizeof *v);
  if (!v)
    return -ENOMEM;
  for (size_t i = 0; i < n; i++) {
    const char *a = src[i]->primary ? src[i]->primary : "";
    if (strlen(a) >= sizeof v[i].primary) {
      free(v);
      return EMBPS_EPROTO;
    }
    v[i].member = src[i]->member;
    v[i].epoch = src[i]->epoch;
    memcpy(v[i].primary, a, strlen(a) + 1);
  }
  s->members = v;
  s->n_members = (uint32_t)n;
  return 0;
}

/* ---- generic pack: build the protobuf view of m, then size or pack it ---- */

/* Calls protobuf's packer on the view of m: with out == NULL it returns the
 * packed size, otherwise it packs into out. */
static size_t pack_or_size(const embps_msg_t *m, uint8_t *out) {
  size_t r = 0;
#define RUN_(type, var) (out ? embps__##type##__pack(&var, out)                \
                             : embps__##type##__get_packed_size(&var))
  switch (m->kind) {
  case EMBPS_KIND_HELLO: {
    Embps__Hello p = EMBPS__HELLO__INIT;
    p.version = m->u.hello.version;
    if (m->u.hello.token_len) {
      p.has_token = 1;
      p.token.data = (uint8_t *)m->u.hello.token;
      p.token.len = m->u.hello.token_len;
    }
    r = RUN_(hello, p);
    break;
  }
  case EMBPS_KIND_HELLO | EMBPS_KIND_REPLY: {
    Embps__HelloReply p = EMBPS__HELLO_REPLY__INIT;
    p.version = m->u.hello_reply.version;
    p.has_cluster_size = p.has_cluster_index = p.has_max_frame_bytes = 1;
    p.cluster_size = m->u.hello_reply.cluster_size;
    p.cluster_index = m->u.hello_reply.cluster_index;
    p.max_frame_bytes = m->u.hello_reply.max_frame_bytes;
    p.server_version = (char *)m->u.hello_reply.server_version;
    p.has_role = p.has_epoch = p.has_applied_lsn = 1;
    p.role = m->u.hello_reply.role;
    p.epoch = m->u.hello_reply.epoch;
    p.applied_lsn = m->u.hello_reply.applied_lsn;
    p.primary = (char *)m->u.hello_reply.primary;
    r = RUN_(hello_reply, p);
    break;
  }
  case EMBPS_KIND_ERROR: {
    Embps__Error p = EMBPS__ERROR__INIT;
    p.code = m->u.error.code;
    p.message = (char *)m->u.error.message;
    p.has_lsn = m->u.error.lsn != 0;
    p.lsn = m->u.error.lsn;
    r = RUN_(error, p);
    break;
  }
  case EMBPS_KIND_CREATE: {
    Embps__CreateTable p = EMBPS__CREATE_TABLE__INIT;
    Embps__TableSpec s;
    spec_to_pb(&m->u.spec, &s);
    p.spec = &s;
    r = RUN_(create_table, p);
    break;
  }
  case EMBPS_KIND_DROP: {
    Embps__DropTable p = EMBPS__DROP_TABLE__INIT;
    p.name = (char *)m->u.name;
    r = RUN_(drop_table, p);
    break;
  }
  case EMBPS_KIND_ALTER: {
    Embps__AlterTable p = EMBPS__ALTER_TABLE__INIT;
    alter_to_pb(&m->u.alter.set, &p);
    p.name = (char *)m->u.alter.name;
    r = RUN_(alter_table, p);
    break;
  }
  case EMBPS_KIND_EVICT: {
    Embps__EvictTable p = EMBPS__EVICT_TABLE__INIT;
    p.name = (char *)m->u.name;
    r = RUN_(evict_table, p);
    break;
  }
  case EMBPS_KIND_EVICT | EMBPS_KIND_REPLY: {
    Embps__EvictReply p = EMBPS__EVICT_REPLY__INIT;
    p.has_evicted = 1;
    p.evicted = m->u.evicted;
    r = RUN_(evict_reply, p);
    break;
  }
  case EMBPS_KIND_DESCRIBE: {
    Embps__DescribeTable p = EMBPS__DESCRIBE_TABLE__INIT;
    p.name = (char *)m->u.name;
    r = RUN_(describe_table, p);
    break;
  }
  case EMBPS_KIND_ALTER | EMBPS_KIND_REPLY:
  case EMBPS_KIND_DESCRIBE | EMBPS_KIND_REPLY: {
    Embps__TableInfo p;
    Embps__TableSpec s;
    info_to_pb(&m->u.info, &p, &s);
    r = RUN_(table_info, p);
    break;
  }
  case EMBPS_KIND_LIST | EMBPS_KIND_REPLY: {
    Embps__TableList p = EMBPS__TABLE_LIST__INIT;
    info_views_t v;
    if (views_make(&v, m->u.list.v, m->u.list.n))
      return 0;
    p.n_tables = m->u.list.n;
    p.tables = v.ptrs;
    r = RUN_(table_list, p);
    views_free(&v);
    break;
  }
  case EMBPS_KIND_PULL: {
    Embps__Pull p = EMBPS__PULL__INIT;
    p.table = (char *)m->u.pull.table;
    p.n_ids = m->u.pull.n_ids;
    p.dim = m->u.pull.dim;
    r = RUN_(pull, p);
    break;
  }
  case EMBPS_KIND_PULL | EMBPS_KIND_REPLY: {
    Embps__PullReply p = EMBPS__PULL_REPLY__INIT;
    p.n_rows = m->u.pull_reply.n_rows;
    p.dim = m->u.pull_reply.dim;
    p.has_lsn = 1;
    p.lsn = m->u.pull_reply.lsn;
    r = RUN_(pull_reply, p);
    break;
  }
  case EMBPS_KIND_PUSH: {
    Embps__Push p = EMBPS__PUSH__INIT;
    const embps_push_t *q = &m->u.push;
    p.table = (char *)q->table;
    p.n = q->n;
    p.dim = q->dim;
    p.has_dense_rows = p.has_client_id = p.has_seq = p.has_step = 1;
    p.dense_rows = q->dense_rows;
    p.client_id = q->client_id;
    p.seq = q->seq;
    p.step = q->step;
    r = RUN_(push, p);
    break;
  }
  case EMBPS_KIND_PUSH | EMBPS_KIND_REPLY: {
    Embps__PushReply p = EMBPS__PUSH_REPLY__INIT;
    p.applied = m->u.push_reply.applied != 0;
    p.has_n_unique = p.has_duplicate = 1;
    p.n_unique = m->u.push_reply.n_unique;
    p.duplicate = m->u.push_reply.duplicate != 0;
    r = RUN_(push_reply, p);
    break;
  }
  case EMBPS_KIND_STATS | EMBPS_KIND_REPLY: {
    const embps_server_stats_t *s = &m->u.stats;
    Embps__StatsReply p = EMBPS__STATS_REPLY__INIT;
    info_views_t v;
    if (views_make(&v, s->tables, s->n_tables))
      return 0;
#define STAT_TO_PB_(type, field, source, doc)                                  \
  p.has_##field = 1;                                                           \
  p.field = s->field;
    EMBPS_SERVER_STATS_FIELDS(STAT_TO_PB_)
#undef STAT_TO_PB_
#define REPL_TO_PB_(type, field, doc)                                          \
  p.has_##field = 1;                                                           \
  p.field = s->field;
    EMBPS_SERVER_REPL_FIELDS(REPL_TO_PB_)
#undef REPL_TO_PB_
    p.primary = (char *)s->primary;
    p.has_sync_degraded = 1;
    p.sync_degraded = s->sync_degraded;
    p.version = (char *)s->version;
    p.data_dir = (char *)s->data_dir;
    p.fsync = (char *)s->fsync;
    p.durability_failed = (char *)s->durability_failed;
    p.n_tables = s->n_tables;
    p.tables = v.ptrs;
    Embps__MemberPrimary *mp = NULL, **mpp = NULL;
    if (s->n_members) {
      mp = calloc(s->n_members, sizeof *mp);
      mpp = calloc(s->n_members, sizeof *mpp);
      if (!mp || !mpp) {
        free(mp);
        free(mpp);
        views_free(&v);
        return 0;
      }
      for (uint32_t i = 0; i < s->n_members; i++) {
        embps__member_primary__init(&mp[i]);
        mp[i].member = s->members[i].member;
        mp[i].has_epoch = 1;
        mp[i].epoch = s->members[i].epoch;
        mp[i].primary = (char *)s->members[i].primary;
        mpp[i] = &mp[i];
      }
      p.n_members = s->n_members;
      p.members = mpp;
    }
    r = RUN_(stats_reply, p);
    free(mp);
    free(mpp);
    views_free(&v);
    break;
  }
  case EMBPS_KIND_CHECKPOINT | EMBPS_KIND_REPLY: {
    Embps__CheckpointReply p = EMBPS__CHECKPOINT_REPLY__INIT;
#define CKPT_TO_PB_(field, doc)                                                \
  p.has_##field = 1;                                                           \
  p.field = m->u.checkpoint.field;
    EMBPS_CHECKPOINT_INFO_FIELDS(CKPT_TO_PB_)
#undef CKPT_TO_PB_
    r = RUN_(checkpoint_reply, p);
    break;
  }
  case EMBPS_KIND_SCAN: {
    Embps__Scan p = EMBPS__SCAN__INIT;
    const embps_scan_t *q = &m->u.scan;
    p.table = (char *)q->table;
    p.has_cursor = p.has_max_rows = p.has_with_state = 1;
    p.cursor = q->cursor;
    p.max_rows = q->max_rows;
    p.with_state = q->with_state != 0;
    r = RUN_(scan, p);
    break;
  }
  case EMBPS_KIND_SCAN | EMBPS_KIND_REPLY: {
    Embps__ScanReply p = EMBPS__SCAN_REPLY__INIT;
    const embps_scan_reply_t *q = &m->u.scan_reply;
    p.n_rows = q->n_rows;
    p.dim = q->dim;
    p.has_state_floats = p.has_next_cursor = p.has_done = p.has_step = 1;
    p.state_floats = q->state_floats;
    p.next_cursor = q->next_cursor;
    p.done = q->done != 0;
    p.step = q->step;
    p.has_lsn = 1;
    p.lsn = q->lsn;
    r = RUN_(scan_reply, p);
    break;
  }
  case EMBPS_KIND_FETCH: {
    Embps__Fetch p = EMBPS__FETCH__INIT;
    const embps_fetch_t *q = &m->u.fetch;
    p.has_from_lsn = p.has_stream = p.has_follower_id = 1;
    p.has_applied_lsn = p.has_durable_lsn = p.has_max_bytes = 1;
    p.has_wait_ms = 1;
    p.from_lsn = q->from_lsn;
    p.stream = q->stream;
    p.follower_id = q->follower_id;
    p.name = (char *)q->name;
    p.applied_lsn = q->applied_lsn;
    p.durable_lsn = q->durable_lsn;
    p.max_bytes = q->max_bytes;
    p.wait_ms = q->wait_ms;
    if (epochs_to_pb(q->history, q->n_history, &p.history))
      return 0;
    p.n_history = q->n_history;
    r = RUN_(fetch, p);
    epochs_pb_free(p.history, p.n_history);
    break;
  }
  case EMBPS_KIND_FETCH | EMBPS_KIND_REPLY: {
    Embps__FetchReply p = EMBPS__FETCH_REPLY__INIT;
    const embps_fetch_reply_t *q = &m->u.fetch_reply;
    p.has_first_lsn = p.has_n_records = p.has_last_lsn = p.has_epoch = 1;
    p.has_lag_ms = p.has_shards = p.has_cluster_size = 1;
    p.has_cluster_index = 1;
    p.first_lsn = q->first_lsn;
    p.n_records = q->n_records;
    p.last_lsn = q->last_lsn;
    p.epoch = q->epoch;
    p.lag_ms = q->lag_ms;
    p.shards = q->shards;
    p.cluster_size = q->cluster_size;
    p.cluster_index = q->cluster_index;
    if (epochs_to_pb(q->history, q->n_history, &p.history))
      return 0;
    p.n_history = q->n_history;
    r = RUN_(fetch_reply, p);
    epochs_pb_free(p.history, p.n_history);
    break;
  }
  case EMBPS_KIND_PROMOTE | EMBPS_KIND_REPLY: {
    Embps__PromoteReply p = EMBPS__PROMOTE_REPLY__INIT;
    p.has_epoch = p.has_lsn = 1;
    p.epoch = m->u.promote.epoch;
    p.lsn = m->u.promote.lsn;
    r = RUN_(promote_reply, p);
    break;
  }
  case EMBPS_KIND_WRITE_ROWS: {
    Embps__WriteRows p = EMBPS__WRITE_ROWS__INIT;
    const embps_write_rows_t *q = &m->u.write_rows;
    p.table = (char *)q->table;
    p.n = q->n;
    p.dim = q->dim;
    p.has_state_floats = p.has_set_step = p.has_step = 1;
    p.state_floats = q->state_floats;
    p.set_step = q->has_step != 0;
    p.step = q->step;
    r = RUN_(write_rows, p);
    break;
  }
  case EMBPS_KIND_SNAPSHOT_BEGIN: {
    Embps__SnapshotBegin p = EMBPS__SNAPSHOT_BEGIN__INIT;
    const embps_snapshot_begin_t *q = &m->u.snap_begin;
    p.has_with_log = p.has_max_chunk_bytes = p.has_idle_ms = 1;
    p.with_log = q->with_log != 0;
    p.max_chunk_bytes = q->max_chunk_bytes;
    p.idle_ms = q->idle_ms;
    r = RUN_(snapshot_begin, p);
    break;
  }
  case EMBPS_KIND_SNAPSHOT_BEGIN | EMBPS_KIND_REPLY: {
    Embps__SnapshotBeginReply p = EMBPS__SNAPSHOT_BEGIN_REPLY__INIT;
    const embps_snapshot_begin_reply_t *q = &m->u.snap_begin_reply;
    p.session = q->session;
    p.has_lsn = p.has_chunk_bytes = p.has_cluster_size = 1;
    p.has_cluster_index = p.has_shards = p.has_tables = p.has_idle_ms = 1;
    p.lsn = q->lsn;
    p.chunk_bytes = q->chunk_bytes;
    p.cluster_size = q->cluster_size;
    p.cluster_index = q->cluster_index;
    p.shards = q->shards;
    p.tables = q->tables;
    p.idle_ms = q->idle_ms;
    r = RUN_(snapshot_begin_reply, p);
    break;
  }
  case EMBPS_KIND_SNAPSHOT_READ: {
    Embps__SnapshotRead p = EMBPS__SNAPSHOT_READ__INIT;
    p.session = m->u.snap_read.session;
    p.seq = m->u.snap_read.seq;
    p.max_bytes = m->u.snap_read.max_bytes;
    r = RUN_(snapshot_read, p);
    break;
  }
  case EMBPS_KIND_SNAPSHOT_READ | EMBPS_KIND_REPLY: {
    Embps__SnapshotReadReply p = EMBPS__SNAPSHOT_READ_REPLY__INIT;
    p.seq = m->u.snap_read_reply.seq;
    p.offset = m->u.snap_read_reply.offset;
    p.done = m->u.snap_read_reply.done != 0;
    r = RUN_(snapshot_read_reply, p);
    break;
  }
  case EMBPS_KIND_SNAPSHOT_END: {
    Embps__SnapshotEnd p = EMBPS__SNAPSHOT_END__INIT;
    p.session = m->u.snap_session;
    r = RUN_(snapshot_end, p);
    break;
  }
  case EMBPS_KIND_LIST:
  case EMBPS_KIND_STATS:
  case EMBPS_KIND_CHECKPOINT:
  case EMBPS_KIND_PROMOTE:
  case EMBPS_KIND_CREATE | EMBPS_KIND_REPLY:
  case EMBPS_KIND_DROP | EMBPS_KIND_REPLY:
  case EMBPS_KIND_WRITE_ROWS | EMBPS_KIND_REPLY:
  case EMBPS_KIND_SNAPSHOT_END | EMBPS_KIND_REPLY: {
    Embps__Ack p = EMBPS__ACK__INIT;
    r = RUN_(ack, p);
    break;
  }
  default:
    break;
  }
#undef RUN_
  return r;
}

size_t embps_msg_size(const embps_msg_t *m) { return pack_or_size(m, NULL); }

void embps_msg_pack(const embps_msg_t *m, uint8_t *out) {
  pack_or_size(m, out);
}

/* ---- unpack ---- */

static int varint(const uint8_t *p, size_t len, size_t *i, uint64_t *out) {
  uint64_t v = 0;
  for (unsigned shift = 0; shift < 64 && *i < len; shift += 7) {
    uint8_t b = p[(*i)++];
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *out = v;
      return 1;
    }
  }
  return 0;
}

/* The checks protobuf-c's unpacker does not make, on the wire bytes of a
 * message of type d (nested messages included): a string field holding a
 * NUL byte (protobuf-c would hand it over cut at the NUL, so "t\0x" would
 * name table "t"), and a 32-bit integer field whose varint holds more than
 * 32 bits (protobuf-c keeps the low 32: a dim of 2^32 + 4 would be 4).
 * Returns 0, or -1 with the problem in why (may be NULL). Bytes that are
 * not a well-formed message return 0: the unpacker refuses them. */
static int wire_check(const ProtobufCMessageDescriptor *d, const uint8_t *p,
                      size_t len, int depth, char *why, size_t why_len) {
  size_t i = 0;
  uint64_t key, v;
  while (i < len) {
    if (!varint(p, len, &i, &key))
      return 0;
    const ProtobufCFieldDescriptor *f =
        key >> 3 <= UINT32_MAX
            ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3))
            : NULL;
    switch (key & 7) {
    case 0: {
      if (!varint(p, len, &i, &v))
        return 0;
      int fits = 1;
      if (f && (f->type == PROTOBUF_C_TYPE_UINT32 ||
                f->type == PROTOBUF_C_TYPE_SINT32)) /* zigzag: 32 bits too */
        fits = v <= UINT32_MAX;
      else if (f && (f->type == PROTOBUF_C_TYPE_INT32 ||
                     f->type == PROTOBUF_C_TYPE_ENUM)) /* sign-extended */
        fits = v <= INT32_MAX || v >= (uint64_t)INT32_MIN;
      if (!fits) {
        if (why)
          snprintf(why, why_len, "field %s of %s is %llu, more than its 32 "
                   "bits hold", f->name, d->short_name,
                   (unsigned long long)v);
        return -1;
      }
      break;
    }
    case 1:
    case 5: {
      size_t n = (key & 7) == 1 ? 8 : 4;
      if (len - i < n)
        return 0;
      i += n;
      break;
    }
    case 2: {
      if (!varint(p, len, &i, &v) || v > len - i)
        return 0;
      if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p + i, 0, v)) {
        if (why)
          snprintf(why, why_len, "field %s of %s holds a NUL byte", f->name,
                   d->short_name);
        return -1;
      }
      if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < 8 &&
          wire_check(f->descriptor, p + i, v, depth + 1, why, why_len))
        return -1;
      i += v;
      break;
    }
    default:
      return 0;
    }
  }
  return 0;
}

static int bounded_copy(char *dst, size_t cap, const char *src) {
  size_t n = src ? strlen(src) : 0;
  if (n >= cap)
    return EMBPS_EPROTO;
  memcpy(dst, src ? src : "", n + 1);
  return 0;
}

int embps_msg_unpack(uint16_t kind, const uint8_t *meta, size_t len,
                     embps_msg_t *m) {
  return embps_msg_unpack_why(kind, meta, len, m, NULL, 0);
}

int embps_msg_unpack_why(uint16_t kind, const uint8_t *meta, size_t len,
                         embps_msg_t *m, char *why, size_t why_len) {
  memset(m, 0, sizeof *m);
  m->kind = kind;
  int rc = EMBPS_EPROTO;
  if (why && why_len)
    why[0] = 0;
#define UNPACK_(type, var)                                                     \
  if (wire_check(&embps__##type##__descriptor, meta, len, 0, why, why_len))    \
    return EMBPS_EPROTO;                                                       \
  __typeof__(embps__##type##__unpack(NULL, 0, NULL)) var =                    \
      embps__##type##__unpack(NULL, len, meta);                                \
  if (!var)                                                                    \
    return EMBPS_EPROTO
#define FREE_(type, var) embps__##type##__free_unpacked(var, NULL)
  switch (kind) {
  case EMBPS_KIND_HELLO: {
    UNPACK_(hello, p);
    rc = 0;
    m->u.hello.version = p->version;
    if (p->has_token) {
      if (p->token.len > EMBPS_TOKEN_MAX)
        rc = EMBPS_EPROTO;
      else {
        if (p->token.len) /* an empty token may have data == NULL */
          memcpy(m->u.hello.token, p->token.data, p->token.len);
        m->u.hello.token_len = p->token.len;
      }
    }
    FREE_(hello, p);
    break;
  }
  case EMBPS_KIND_HELLO | EMBPS_KIND_REPLY: {
    UNPACK_(hello_reply, p);
    m->u.hello_reply.version = p->version;
    m->u.hello_reply.cluster_size = p->cluster_size;
    m->u.hello_reply.cluster_index = p->cluster_index;
    m->u.hello_reply.max_frame_bytes = p->max_frame_bytes;
    snprintf(m->u.hello_reply.server_version,
             sizeof m->u.hello_reply.server_version, "%s",
             p->server_version ? p->server_version : "");
    m->u.hello_reply.role = p->role;
    m->u.hello_reply.epoch = p->epoch;
    m->u.hello_reply.applied_lsn = p->applied_lsn;
    rc = bounded_copy(m->u.hello_reply.primary,
                      sizeof m->u.hello_reply.primary, p->primary);
    FREE_(hello_reply, p);
    break;
  }
  case EMBPS_KIND_ERROR: {
    UNPACK_(error, p);
    m->u.error.code = p->code;
    m->u.error.lsn = p->lsn;
    snprintf(m->u.error.message, sizeof m->u.error.message, "%s",
             p->message ? p->message : "");
    rc = 0;
    FREE_(error, p);
    break;
  }
  case EMBPS_KIND_CREATE: {
    UNPACK_(create_table, p);
    rc = p->spec ? spec_from_pb(p->spec, &m->u.spec) : EMBPS_EPROTO;
    FREE_(create_table, p);
    break;
  }
  case EMBPS_KIND_DROP: {
    UNPACK_(drop_table, p);
    rc = copy_name(m->u.name, p->name);
    FREE_(drop_table, p);
    break;
  }
  case EMBPS_KIND_ALTER: {
    UNPACK_(alter_table, p);
    rc = copy_name(m->u.alter.name, p->name);
    alter_from_pb(p, &m->u.alter.set);
    FREE_(alter_table, p);
    break;
  }
  case EMBPS_KIND_EVICT: {
    UNPACK_(evict_table, p);
    rc = copy_name(m->u.name, p->name);
    FREE_(evict_table, p);
    break;
  }
  case EMBPS_KIND_EVICT | EMBPS_KIND_REPLY: {
    UNPACK_(evict_reply, p);
    m->u.evicted = p->evicted;
    rc = 0;
    FREE_(evict_reply, p);
    break;
  }
  case EMBPS_KIND_DESCRIBE: {
    UNPACK_(describe_table, p);
    rc = copy_name(m->u.name, p->name);
    FREE_(describe_table, p);
    break;
  }
  case EMBPS_KIND_ALTER | EMBPS_KIND_REPLY:
  case EMBPS_KIND_DESCRIBE | EMBPS_KIND_REPLY: {
    UNPACK_(table_info, p);
    rc = info_from_pb(p, &m->u.info);
    FREE_(table_info, p);
    break;
  }
  case EMBPS_KIND_LIST | EMBPS_KIND_REPLY: {
    UNPACK_(table_list, p);
    rc = infos_from_pb(p->tables, p->n_tables, &m->u.list.v);
    m->u.list.n = rc ? 0 : p->n_tables;
    FREE_(table_list, p);
    break;
  }
  case EMBPS_KIND_PULL: {
    UNPACK_(pull, p);
    rc = copy_name(m->u.pull.table, p->table);
    m->u.pull.n_ids = p->n_ids;
    m->u.pull.dim = p->dim;
    FREE_(pull, p);
    break;
  }
  case EMBPS_KIND_PULL | EMBPS_KIND_REPLY: {
    UNPACK_(pull_reply, p);
    m->u.pull_reply.n_rows = p->n_rows;
    m->u.pull_reply.dim = p->dim;
    m->u.pull_reply.lsn = p->lsn;
    rc = 0;
    FREE_(pull_reply, p);
    break;
  }
  case EMBPS_KIND_PUSH: {
    UNPACK_(push, p);
    embps_push_t *q = &m->u.push;
    rc = copy_name(q->table, p->table);
    q->n = p->n;
    q->dim = p->dim;
    q->dense_rows = p->dense_rows;
    q->client_id = p->client_id;
    q->seq = p->seq;
    q->step = p->step;
    FREE_(push, p);
    break;
  }
  case EMBPS_KIND_PUSH | EMBPS_KIND_REPLY: {
    UNPACK_(push_reply, p);
    m->u.push_reply.applied = p->applied;
    m->u.push_reply.n_unique = p->n_unique;
    m->u.push_reply.duplicate = p->duplicate;
    rc = 0;
    FREE_(push_reply, p);
    break;
  }
  case EMBPS_KIND_STATS | EMBPS_KIND_REPLY: {
    UNPACK_(stats_reply, p);
    embps_server_stats_t *s = &m->u.stats;
#define STAT_FROM_PB_(type, field, source, doc) s->field = p->field;
    EMBPS_SERVER_STATS_FIELDS(STAT_FROM_PB_)
#undef STAT_FROM_PB_
#define REPL_FROM_PB_(type, field, doc) s->field = p->field;
    EMBPS_SERVER_REPL_FIELDS(REPL_FROM_PB_)
#undef REPL_FROM_PB_
    rc = bounded_copy(s->version, sizeof s->version, p->version);
    s->sync_degraded = p->sync_degraded;
    if (!rc && p->sync_degraded > 1)
      rc = EMBPS_EPROTO; /* a flag */
    if (!rc && p->primary)
      rc = bounded_copy(s->primary, sizeof s->primary, p->primary);
    if (!rc && p->data_dir)
      rc = bounded_copy(s->data_dir, sizeof s->data_dir, p->data_dir);
    if (!rc && p->fsync)
      rc = bounded_copy(s->fsync, sizeof s->fsync, p->fsync);
    if (!rc && p->durability_failed)
      snprintf(s->durability_failed, sizeof s->durability_failed, "%.255s",
               p->durability_failed);
    if (!rc)
      rc = infos_from_pb(p->tables, p->n_tables, &s->tables);
    s->n_tables = rc ? 0 : p->n_tables;
    if (!rc)
      rc = members_from_pb(p->members, p->n_members, s);
    if (rc) {
      free(s->tables);
      s->tables = NULL;
      s->n_tables = 0;
    }
    FREE_(stats_reply, p);
    break;
  }
  case EMBPS_KIND_CHECKPOINT | EMBPS_KIND_REPLY: {
    UNPACK_(checkpoint_reply, p);
#define CKPT_FROM_PB_(field, doc) m->u.checkpoint.field = p->field;
    EMBPS_CHECKPOINT_INFO_FIELDS(CKPT_FROM_PB_)
#undef CKPT_FROM_PB_
    rc = 0;
    FREE_(checkpoint_reply, p);
    break;
  }
  case EMBPS_KIND_SCAN: {
    UNPACK_(scan, p);
    rc = copy_name(m->u.scan.table, p->table);
    m->u.scan.cursor = p->cursor;
    m->u.scan.max_rows = p->max_rows;
    m->u.scan.with_state = p->with_state;
    FREE_(scan, p);
    break;
  }
  case EMBPS_KIND_SCAN | EMBPS_KIND_REPLY: {
    UNPACK_(scan_reply, p);
    embps_scan_reply_t *q = &m->u.scan_reply;
    q->n_rows = p->n_rows;
    q->dim = p->dim;
    q->state_floats = p->state_floats;
    q->next_cursor = p->next_cursor;
    q->done = p->done;
    q->step = p->step;
    q->lsn = p->lsn;
    rc = 0;
    FREE_(scan_reply, p);
    break;
  }
  case EMBPS_KIND_FETCH: {
    UNPACK_(fetch, p);
    embps_fetch_t *q = &m->u.fetch;
    q->from_lsn = p->from_lsn;
    q->stream = p->stream;
    q->follower_id = p->follower_id;
    q->applied_lsn = p->applied_lsn;
    q->durable_lsn = p->durable_lsn;
    q->max_bytes = p->max_bytes;
    q->wait_ms = p->wait_ms;
    rc = bounded_copy(q->name, sizeof q->name, p->name);
    if (!rc)
      rc = epochs_from_pb(p->history, p->n_history, &q->history,
                          &q->n_history);
    FREE_(fetch, p);
    break;
  }
  case EMBPS_KIND_FETCH | EMBPS_KIND_REPLY: {
    UNPACK_(fetch_reply, p);
    embps_fetch_reply_t *q = &m->u.fetch_reply;
    q->first_lsn = p->first_lsn;
    q->n_records = p->n_records;
    q->last_lsn = p->last_lsn;
    q->epoch = p->epoch;
    q->lag_ms = p->lag_ms;
    q->shards = p->shards;
    q->cluster_size = p->cluster_size;
    q->cluster_index = p->cluster_index;
    rc = epochs_from_pb(p->history, p->n_history, &q->history,
                        &q->n_history);
    FREE_(fetch_reply, p);
    break;
  }
  case EMBPS_KIND_PROMOTE | EMBPS_KIND_REPLY: {
    UNPACK_(promote_reply, p);
    m->u.promote.epoch = p->epoch;
    m->u.promote.lsn = p->lsn;
    rc = 0;
    FREE_(promote_reply, p);
    break;
  }
  case EMBPS_KIND_WRITE_ROWS: {
    UNPACK_(write_rows, p);
    embps_write_rows_t *q = &m->u.write_rows;
    rc = copy_name(q->table, p->table);
    q->n = p->n;
    q->dim = p->dim;
    q->state_floats = p->state_floats;
    q->has_step = p->set_step;
    q->step = p->step;
    FREE_(write_rows, p);
    break;
  }
  case EMBPS_KIND_SNAPSHOT_BEGIN: {
    UNPACK_(snapshot_begin, p);
    m->u.snap_begin.with_log = p->with_log;
    m->u.snap_begin.max_chunk_bytes = p->max_chunk_bytes;
    m->u.snap_begin.idle_ms = p->idle_ms;
    rc = 0;
    FREE_(snapshot_begin, p);
    break;
  }
  case EMBPS_KIND_SNAPSHOT_BEGIN | EMBPS_KIND_REPLY: {
    UNPACK_(snapshot_begin_reply, p);
    embps_snapshot_begin_reply_t *q = &m->u.snap_begin_reply;
    q->session = p->session;
    q->lsn = p->lsn;
    q->chunk_bytes = p->chunk_bytes;
    q->cluster_size = p->cluster_size;
    q->cluster_index = p->cluster_index;
    q->shards = p->shards;
    q->tables = p->tables;
    q->idle_ms = p->idle_ms;
    rc = 0;
    FREE_(snapshot_begin_reply, p);
    break;
  }
  case EMBPS_KIND_SNAPSHOT_READ: {
    UNPACK_(snapshot_read, p);
    m->u.snap_read.session = p->session;
    m->u.snap_read.seq = p->seq;
    m->u.snap_read.max_bytes = p->max_bytes;
    rc = 0;
    FREE_(snapshot_read, p);
    break;
  }
  case EMBPS_KIND_SNAPSHOT_READ | EMBPS_KIND_REPLY: {
    UNPACK_(snapshot_read_reply, p);
    m->u.snap_read_reply.seq = p->seq;
    m->u.snap_read_reply.offset = p->offset;
    m->u.snap_read_reply.done = p->done;
    rc = 0;
    FREE_(snapshot_read_reply, p);
    break;
  }
  case EMBPS_KIND_SNAPSHOT_END: {
    UNPACK_(snapshot_end, p);
    m->u.snap_session = p->session;
    rc = 0;
    FREE_(snapshot_end, p);
    break;
  }
  case EMBPS_KIND_LIST:
  case EMBPS_KIND_STATS:
  case EMBPS_KIND_CHECKPOINT:
  case EMBPS_KIND_PROMOTE:
  case EMBPS_KIND_CREATE | EMBPS_KIND_REPLY:
  case EMBPS_KIND_DROP | EMBPS_KIND_REPLY:
  case EMBPS_KIND_WRITE_ROWS | EMBPS_KIND_REPLY:
  case EMBPS_KIND_SNAPSHOT_END | EMBPS_KIND_REPLY: {
    UNPACK_(ack, p);
    rc = 0;
    FREE_(ack, p);
    break;
  }
  default:
    return EMBPS_EKIND;
  }
#undef UNPACK_
#undef FREE_
  if (rc)
    embps_msg_free(m);
  return rc;
}

void embps_msg_free(embps_msg_t *m) {
  if (m->kind == (EMBPS_KIND_LIST | EMBPS_KIND_REPLY)) {
    free(m->u.list.v);
    m->u.list.v = NULL;
    m->u.list.n = 0;
  } else if (m->kind == (EMBPS_KIND_STATS | EMBPS_KIND_REPLY)) {
    free(m->u.stats.tables);
    m->u.stats.tables = NULL;
    m->u.stats.n_tables = 0;
    free(m->u.stats.members);
    m->u.stats.members = NULL;
    m->u.stats.n_members = 0;
  } else if (m->kind == EMBPS_KIND_FETCH) {
    free(m->u.fetch.history);
    m->u.fetch.history = NULL;
    m->u.fetch.n_history = 0;
  } else if (m->kind == (EMBPS_KIND_FETCH | EMBPS_KIND_REPLY)) {
    free(m->u.fetch_reply.history);
    m->u.fetch_reply.history = NULL;
    m->u.fetch_reply.n_history = 0;
  }
}

/* ---- frames ---- */

/* A frame of m whose header counts bulk_len bulk bytes, allocated with
 * room for the first `room` of them. */
static int frame_alloc(const embps_msg_t *m, uint32_t req_id, size_t bulk_len,
                       size_t room, uint8_t **frame, size_t *frame_len,
                       size_t *bulk_off) {
  size_t meta_len = embps_msg_size(m);
  size_t off = embps_bulk_offset(meta_len);
  size_t body = off + bulk_len;
  if (body > UINT32_MAX)
    return EMBPS_EFRAMESIZE;
  uint8_t *f = malloc(EMBPS_FRAME_HEADER_LEN + off + room);
  if (!f)
    return -ENOMEM;
  embps_frame_header_t h = {.body_len = (uint32_t)body,
                            .meta_len = (uint32_t)meta_len,
                            .req_id = req_id,
                            .kind = m->kind};
  embps_frame_header_encode(&h, f);
  embps_msg_pack(m, f + EMBPS_FRAME_HEADER_LEN);
  memset(f + EMBPS_FRAME_HEADER_LEN + meta_len, 0, off - meta_len);
  *frame = f;
  *frame_len = EMBPS_FRAME_HEADER_LEN + off + room;
  if (bulk_off)
    *bulk_off = EMBPS_FRAME_HEADER_LEN + off;
  return 0;
}

int embps_frame_build(const embps_msg_t *m, uint32_t req_id, size_t bulk_len,
                      uint8_t **frame, size_t *frame_len, size_t *bulk_off) {
  return frame_alloc(m, req_id, bulk_len, bulk_len, frame, frame_len,
                     bulk_off);
}

int embps_frame_build_head(const embps_msg_t *m, uint32_t req_id,
                           size_t bulk_len, uint8_t **head, size_t *head_len) {
  return frame_alloc(m, req_id, bulk_len, 0, head, head_len, NULL);
}

int embps_frame_error(uint32_t req_id, int code, const char *message,
                      uint8_t **frame, size_t *frame_len) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_ERROR;
  m.u.error.code = code;
  snprintf(m.u.error.message, sizeof m.u.error.message, "%s",
           message ? message : embps_strerror(code));
  return embps_frame_build(&m, req_id, 0, frame, frame_len, NULL);
}
