/* cli.c - the embps command-line client: table administration, pulls and
 * pushes from the shell, stats. Formats are DESIGN.md's contract: binary
 * files are little-endian int64 ids and float32 row-major values; pulled
 * rows print as "id<TAB>v v v" with %.9g, which reads back to the identical
 * float32. Every failure prints one line naming the problem and exits 1
 * (2 for a command line that does not parse).
 *
 * The command line is tables (flags.h): the global flags, then per command
 * its flags and what they set in opts_t; main parses them all before it
 * connects, and --help prints the same tables. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "embps_revision.h"
#include "embps/embps.h"
#include "util.h"

static int die(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int die(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("embps: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return code;
}

static int usage_error(const char *fmt, const char *arg) {
  fputs("embps: ", stderr);
  fprintf(stderr, fmt, arg);
  fputs(" (see embps --help)\n", stderr);
  return 2;
}

/* ------------------------------------------------------------ flags */

/* What the flags before the COMMAND set. */
typedef struct {
  embps_client_options_t client;
  const char *token_file;
  int64_t retry_ms;
  uint32_t member;
  int help, version;
} global_t;

static int set_read_from(const embps_flag_t *f, const char *v, void *obj,
                         char *err, size_t err_len) {
  int *field = (int *)((char *)obj + f->off);
  if (!strcmp(v, "primary"))
    *field = EMBPS_READ_PRIMARY;
  else if (!strcmp(v, "follower"))
    *field = EMBPS_READ_FOLLOWER;
  else
    return embps_flag_refuse(f, v, err, err_len);
  return 0;
}

static const embps_flag_t global_flags[] = {
    EMBPS_FLAG_STRING("servers", "H:P[,H:P...]", global_t, client.servers,
                      "the cluster's servers, in cluster order (default "
                      "$EMBPS_SERVERS, then 127.0.0.1:7070); a member's "
                      "primary and followers as H:P|H:P (writes find its "
                      "primary)"),
    EMBPS_FLAG_STRING("token-file", "F", global_t, token_file,
                      "send the auth token in file F (default "
                      "$EMBPS_TOKEN_FILE)"),
    EMBPS_FLAG_NUMBER("timeout-ms", "N", embps_flag_set_int, global_t,
                      client.timeout_ms, 1, INT32_MAX, "a positive number",
                      "bound on one attempt of a call (default 30000)"),
    EMBPS_FLAG_NUMBER("retry-ms", "N", embps_flag_set_int, global_t, retry_ms,
                      -1, INT32_MAX, "a number of ms (or -1)",
                      "how long a push or a read goes on retrying after a "
                      "broken connection (default 30000; 0 or -1: never)"),
    {"read-from", "primary|follower",
     "pull and export read from each member's primary (default) or, for "
     "a member listed as PRIMARY|FOLLOWER..., from a follower: rows as the "
     "primary had them at the LSN the follower has applied (pull --json "
     "says which)",
     set_read_from, offsetof(global_t, client.read_from),
     sizeof(int), 0, 0, 0, "primary or follower"},
    EMBPS_FLAG_NUMBER("member", "I", embps_flag_set_uint, global_t, member, 0,
                      UINT32_MAX - 1, "a server index",
                      "stats and tables ask server I of the list alone (the "
                      "list stays the whole cluster, in order)"),
    EMBPS_FLAG_TRUE("help", global_t, help, "print this help and exit (or -h)"),
    EMBPS_FLAG_TRUE("version", global_t, version,
                    "print the version (and the protocol's) and exit"),
    EMBPS_FLAG_END};
static const embps_flag_group_t global_groups[] = {{global_flags, 0},
                                                   {NULL, 0}};

/* What the flags of every command set (each command reads its own). */
typedef struct {
  embps_table_spec_t spec;          /* create-table */
  unsigned create_flags;            /* create-table: EMBPS_CREATE_* */
  embps_table_alter_t alter;        /* alter */
  int json;                         /* tables, stats, pull */
  const char *ids, *ids_file, *out; /* pull; --out of export too */
  const char *indices, *values, *indices_file, *values_file; /* push */
  uint64_t step;                                             /* push */
  const char *from;                                          /* import */
  unsigned io_flags; /* export, import: EMBPS_EXPORT_*, EMBPS_IMPORT_* */
  /* pull --ids, push --indices and --values, as the checks parse them */
  int64_t *id_list;
  float *value_list;
  size_t n_ids, n_values;
} opts_t;

static int set_optimizer(const embps_flag_t *f, const char *v, void *obj,
                         char *err, size_t err_len) {
  embps_table_spec_t *spec = obj;
  return embps_optimizer_parse(v, &spec->optimizer)
             ? embps_flag_refuse(f, v, err, err_len)
             : 0;
}

static int set_dtype(const embps_flag_t *f, const char *v, void *obj, char *err,
                     size_t err_len) {
  embps_table_spec_t *spec = obj;
  return embps_dtype_parse(v, &spec->dtype)
             ? embps_flag_refuse(f, v, err, err_len)
             : 0;
}

static int set_init(const embps_flag_t *f, const char *v, void *obj, char *err,
                    size_t err_len) {
  static const struct {
    const char *name;
    embps_init_t init;
  } kinds[] = {{"zeros", EMBPS_INIT_ZEROS},
               {"constant:", EMBPS_INIT_CONSTANT},
               {"uniform:", EMBPS_INIT_UNIFORM},
               {"normal:", EMBPS_INIT_NORMAL}};
  embps_table_spec_t *spec = obj;
  for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
    size_t len = strlen(kinds[k].name);
    if (strncmp(v, kinds[k].name, len))
      continue;
    double x = 0;
    if (kinds[k].init == EMBPS_INIT_ZEROS) {
      if (v[len])
        break;
    } else {
      char *end;
      errno = 0;
      x = strtod(v + len, &end);
      if (errno || end == v + len || *end)
        break;
    }
    spec->init = kinds[k].init;
    spec->init_value = x;
    return 0;
  }
  return embps_flag_refuse(f, v, err, err_len);
}

#define SPEC embps_table_spec_t
/* create-table's flags but the optimizer's hyperparameters and the
 * admission and eviction ones (cli_dyn.c) */
static const embps_flag_t spec_flags[] = {
    EMBPS_FLAG_NUMBER("dim", "D", embps_flag_set_uint, SPEC, dim, 0, UINT32_MAX,
                      "a dimension", "values per row (required)"),
    EMBPS_FLAG_NUMBER("rows", "N", embps_flag_set_uint, SPEC, rows, 0,
                      UINT64_MAX, "a row count",
                      "a dense table of rows 0..N-1"),
    EMBPS_FLAG_TRUE("dynamic", SPEC, dynamic,
                    "a table of any int64 ids, each row made at its first "
                    "push (one of --rows and --dynamic is required)"),
    {"optimizer", "sgd|adagrad|adam|ftrl",
     "the update rule (default sgd); "
     "it sets the defaults below",
     set_optimizer, 0, 0, 0, 0, 0, "sgd|adagrad|adam|ftrl"},
    {"init", "zeros|constant:V|uniform:A|normal:STD",
     "the value of rows "
     "never pushed (default zeros)",
     set_init, 0, 0, 0, 0, 0, "zeros|constant:V|uniform:A|normal:STD"},
    EMBPS_FLAG_NUMBER("seed", "S", embps_flag_set_uint, SPEC, seed, 0,
                      UINT64_MAX, "a number",
                      "seed of the random initial values"),
    EMBPS_FLAG_NUMBER("padding-id", "ID", embps_flag_set_int, SPEC, padding_id,
                      INT64_MIN, INT64_MAX, "an id",
                      "an id whose row stays zero: pulled as zeros, never "
                      "updated"),
    EMBPS_FLAG_NUMBER("sync-workers", "N", embps_flag_set_uint, SPEC,
                      sync_workers, 0, UINT32_MAX, "a count",
                      "synchronous training: each step is applied once N "
                      "workers pushed it, averaged (default 0: "
                      "asynchronous)"),
    {"dtype", "f32|f16|bf16", "how the weights are stored (default f32)",
     set_dtype, 0, 0, 0, 0, 0, "f32|f16|bf16"},
    EMBPS_FLAG_END};

/* The optimizer's hyperparameters: flag, field (embps_table_spec_t and
 * embps_table_alter_t name it alike), alter's bit, help. create-table may
 * set them all; alter changes them. */
#define HYPERPARAMETERS(X)                                                     \
  X("lr", lr, EMBPS_ALTER_LR, "learning rate (default 0.01)")                  \
  X("eps", eps, EMBPS_ALTER_EPS,                                               \
    "adagrad's and adam's epsilon (default 1e-10 and 1e-8)")                   \
  X("beta1", beta1, EMBPS_ALTER_BETA1,                                         \
    "adam's decay of the first moment (default 0.9)")                          \
  X("beta2", beta2, EMBPS_ALTER_BETA2,                                         \
    "adam's decay of the second moment (default 0.999)")                       \
  X("l1", l1, EMBPS_ALTER_L1, "ftrl's L1 regularisation (default 0)")          \
  X("l2", l2, EMBPS_ALTER_L2, "ftrl's L2 regularisation (default 0)")          \
  X("lr-power", lr_power, EMBPS_ALTER_LR_POWER,                                \
    "ftrl's learning-rate power (default -0.5)")                               \
  X("weight-decay", weight_decay, EMBPS_ALTER_WEIGHT_DECAY,                    \
    "adam's decoupled weight decay (default 0)")

#define HYPER_SPEC_(name, field, bit, help)                                    \
  EMBPS_FLAG_NUMBER(name, "X", embps_flag_set_double, SPEC, field, -HUGE_VALL, \
                    HUGE_VALL, "a number", help),
static const embps_flag_t hyper_flags[] = {
    HYPERPARAMETERS(HYPER_SPEC_) EMBPS_FLAG_NUMBER(
        "initial-accumulator", "X", embps_flag_set_double, SPEC,
        initial_accumulator, -HUGE_VALL, HUGE_VALL, "a number",
        "adagrad's and ftrl's accumulator at start (default 0 "
        "and 0.1)"),
    EMBPS_FLAG_END};

/* alter: the value, and its bit in alter.set */
static int set_alter(const embps_flag_t *f, const char *v, void *obj, char *err,
                     size_t err_len) {
  if (embps_flag_set_double(f, v, obj, err, err_len))
    return -1;
  ((embps_table_alter_t *)obj)->set |= (unsigned)f->bits;
  return 0;
}
#define HYPER_ALTER_(name, field, bit, help)                                   \
  {name,                                                                       \
   "X",                                                                        \
   help,                                                                       \
   set_alter,                                                                  \
   EMBPS_FLAG_FIELD_(embps_table_alter_t, field),                              \
   -HUGE_VALL,                                                                 \
   HUGE_VALL,                                                                  \
   bit,                                                                        \
   "a number"},
static const embps_flag_t alter_flags[] = {HYPERPARAMETERS(HYPER_ALTER_)
                                               EMBPS_FLAG_END};

#define OPTS opts_t
static const embps_flag_t create_flags[] = {
    EMBPS_FLAG_BITS("exist-ok", OPTS, create_flags, EMBPS_CREATE_EXIST_OK,
                    "succeed when every server holds the table with this "
                    "spec already (some servers lacking it is an error: "
                    "see complete-table)"),
    EMBPS_FLAG_END};
static const embps_flag_t json_flags[] = {
    EMBPS_FLAG_TRUE("json", OPTS, json, "print JSON"), EMBPS_FLAG_END};
static const embps_flag_t pull_flags[] = {
    EMBPS_FLAG_STRING("ids", "1,2,3", OPTS, ids, "the ids to pull"),
    EMBPS_FLAG_STRING("ids-file", "F", OPTS, ids_file,
                      "the ids to pull, int64 little-endian in file F"),
    EMBPS_FLAG_STRING("out", "F", OPTS, out,
                      "write the rows to file F (float32 little-endian, row "
                      "after row) instead of printing them"),
    EMBPS_FLAG_TRUE("json", OPTS, json, "print JSON"), EMBPS_FLAG_END};
static const embps_flag_t push_flags[] = {
    EMBPS_FLAG_STRING("indices", "1,2,2", OPTS, indices,
                      "the ids the gradient rows are for (repeats add up)"),
    EMBPS_FLAG_STRING("values", "v,v,...", OPTS, values,
                      "the gradient rows, dim values per index"),
    EMBPS_FLAG_STRING("indices-file", "F", OPTS, indices_file,
                      "the ids, int64 little-endian in file F"),
    EMBPS_FLAG_STRING("values-file", "F", OPTS, values_file,
                      "the gradient rows, float32 little-endian in file F"),
    EMBPS_FLAG_NUMBER("step", "S", embps_flag_set_uint, OPTS, step, 1,
                      UINT64_MAX, "a step number (from 1)",
                      "synchronous tables: the step this push is for"),
    EMBPS_FLAG_END};
static const embps_flag_t export_flags[] = {
    EMBPS_FLAG_STRING("out", "DIR", OPTS, out,
                      "the directory to write (required)"),
    EMBPS_FLAG_BITS("with-state", OPTS, io_flags, EMBPS_EXPORT_STATE,
                    "the optimizer state and step too"),
    EMBPS_FLAG_BITS("state", OPTS, io_flags, EMBPS_EXPORT_STATE,
                    "the same as --with-state"),
    EMBPS_FLAG_BITS("dense", OPTS, io_flags, EMBPS_EXPORT_DENSE,
                    "every row of a fixed-size table, [rows, dim] by id (not "
                    "with --with-state)"),
    EMBPS_FLAG_END};
static const embps_flag_t import_flags[] = {
    EMBPS_FLAG_STRING("from", "DIR", OPTS, from,
                      "the directory to read (required)"),
    EMBPS_FLAG_BITS("with-state", OPTS, io_flags, EMBPS_IMPORT_STATE,
                    "set the optimizer state and step from it too"),
    EMBPS_FLAG_BITS("state", OPTS, io_flags, EMBPS_IMPORT_STATE,
                    "the same as --with-state"),
    EMBPS_FLAG_BITS("create", OPTS, io_flags, EMBPS_IMPORT_CREATE,
                    "create the table from DIR/spec.json if it is missing"),
    EMBPS_FLAG_END};

static const embps_flag_group_t create_groups[] = {
    {spec_flags, offsetof(opts_t, spec)},
    {hyper_flags, offsetof(opts_t, spec)},
    {embps_cli_dyn_flags, offsetof(opts_t, spec)},
    {create_flags, 0},
    {NULL, 0}};
static const embps_flag_group_t alter_groups[] = {
    {alter_flags, offsetof(opts_t, alter)}, {NULL, 0}};
static const embps_flag_group_t json_groups[] = {{json_flags, 0}, {NULL, 0}};
static const embps_flag_group_t pull_groups[] = {{pull_flags, 0}, {NULL, 0}};
static const embps_flag_group_t push_groups[] = {{push_flags, 0}, {NULL, 0}};
static const embps_flag_group_t export_groups[] = {{export_flags, 0},
                                                   {NULL, 0}};
static const embps_flag_group_t import_groups[] = {{import_flags, 0},
                                                   {NULL, 0}};
static const embps_flag_t backup_flags[] = {
    EMBPS_FLAG_STRING("out", "DIR", OPTS, out,
                      "the directory to write: new or empty (required)"),
    EMBPS_FLAG_END};
static const embps_flag_group_t backup_groups[] = {{backup_flags, 0},
                                                   {NULL, 0}};
static const embps_flag_group_t no_groups[] = {{NULL, 0}};

/* ------------------------------------------------------------ parsing */

/* One item of a comma-separated list into *out. */
typedef int (*list_item_fn)(const char *token, void *out);

static int id_item(const char *token, void *out) {
  char *end;
  errno = 0;
  long long v = strtoll(token, &end, 10);
  if (errno || end == token || *end)
    return -1;
  *(int64_t *)out = v;
  return 0;
}

/* Non-finite values parse: the server refuses them by name. */
static int value_item(const char *token, void *out) {
  char *end;
  float v = strtof(token, &end);
  if (end == token || *end)
    return -1;
  *(float *)out = v;
  return 0;
}

/* The value of --flag, a comma-separated list (empty items skipped), into
 * a malloc'd array of items of `size` bytes, read by `item`. Returns the
 * exit status: 0, 2 naming an item that is not `what`, 1 when out of
 * memory. */
static int parse_list(const char *flag, const char *s, size_t size,
                      list_item_fn item, const char *what, void **out,
                      size_t *n) {
  size_t cap = 1;
  for (const char *p = s; *p; p++)
    cap += *p == ',';
  char *copy = strdup(s), *save = NULL;
  unsigned char *v = malloc(cap * size);
  if (!copy || !v) {
    free(copy);
    free(v);
    return die(1, "out of memory for a list of %zu items", cap);
  }
  size_t k = 0;
  for (char *tok = strtok_r(copy, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save), k++)
    if (item(tok, v + k * size)) {
      die(2, "--%s: item \"%s\" is not %s", flag, tok, what);
      free(copy);
      free(v);
      return 2;
    }
  free(copy);
  *out = v;
  *n = k;
  return 0;
}

/* Reads a binary file of elements of `size` bytes. */
static int read_array(const char *path, size_t size, void **out, size_t *n) {
  char *data;
  size_t len;
  int rc = embps_read_file(path, &data, &len);
  if (rc)
    return die(1, "cannot read %s: %s", path, strerror(-rc));
  if (len % size) {
    free(data);
    return die(1, "%s: %zu bytes is not a whole number of %zu-byte values",
               path, len, size);
  }
  *out = data;
  *n = len / size;
  return 0;
}

static int write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f)
    return die(1, "cannot write %s: %s", path, strerror(errno));
  size_t w = fwrite(data, 1, len, f);
  if (fclose(f) != 0 || w != len)
    return die(1, "cannot write %s: %s", path, strerror(errno));
  return 0;
}

/* ------------------------------------------------------------ commands */

typedef struct {
  embps_client_t *client;
  const char *name; /* the table NAME, for the commands that take one */
  opts_t *o;
  const embps_flags_t *flags; /* which ones were given */
  uint32_t member;            /* --member, or UINT32_MAX */
} cmd_t;

static int server_error(embps_client_t *c, int rc) {
  return die(1, "%s", embps_client_last_error(c)[0]
                          ? embps_client_last_error(c)
                          : embps_strerror(rc));
}

/* The checks of a command's flags that need no server; 0 or the exit
 * status. */
static int check_create(cmd_t *cmd) {
  embps_table_spec_t *spec = &cmd->o->spec;
  if (strlen(cmd->name) >= sizeof spec->name)
    return usage_error("table name \"%s\" is too long", cmd->name);
  snprintf(spec->name, sizeof spec->name, "%s", cmd->name);
  if (!embps_flags_given(cmd->flags, "dim"))
    return usage_error("%s", "create-table needs --dim D");
  if (embps_flags_given(cmd->flags, "rows") == spec->dynamic)
    return usage_error("%s", "create-table needs exactly one of --rows N "
                       "and --dynamic");
  spec->has_padding = embps_flags_given(cmd->flags, "padding-id");
  /* the optimizer's defaults for the hyperparameters not given */
  embps_table_spec_t d;
  embps_table_spec_init(&d, NULL, 0, spec->optimizer);
  for (const embps_flag_t *f = hyper_flags; f->name; f++)
    if (!embps_flags_given(cmd->flags, f->name))
      memcpy((char *)spec + f->off, (const char *)&d + f->off, f->size);
  return 0;
}

static int cmd_create(cmd_t *cmd) {
  int rc = embps_create_table_ex(cmd->client, &cmd->o->spec,
                                 cmd->o->create_flags);
  return rc ? server_error(cmd->client, rc) : 0;
}

static int cmd_complete(cmd_t *cmd) {
  uint32_t created = 0;
  int rc = embps_complete_table(cmd->client, cmd->name, &created);
  if (rc)
    return server_error(cmd->client, rc);
  if (created)
    printf("table %s: created on %u server(s) that lacked it, with the spec "
           "the others hold; its rows there start from the initializer\n",
           cmd->name, created);
  else
    printf("table %s: every server holds it, nothing to complete\n",
           cmd->name);
  return 0;
}

static int cmd_drop(cmd_t *cmd) {
  int rc = embps_drop_table(cmd->client, cmd->name);
  return rc ? server_error(cmd->client, rc) : 0;
}

static int check_alter(cmd_t *cmd) {
  if (!cmd->o->alter.set)
    return usage_error("%s", "alter needs at least one of --lr, --eps, "
                       "--beta1, --beta2, --l1, --l2, --lr-power, "
                       "--weight-decay");
  return 0;
}

static int cmd_alter(cmd_t *cmd) {
  embps_table_info_t info;
  int rc = embps_alter_table(cmd->client, cmd->name, &cmd->o->alter, &info);
  if (rc)
    return server_error(cmd->client, rc);
  const embps_table_spec_t *s = &info.spec;
  printf("table %s: lr %.9g, eps %.9g, beta1 %.9g, beta2 %.9g, l1 %.9g, "
         "l2 %.9g, lr-power %.9g, weight-decay %.9g\n", s->name, s->lr,
         s->eps, s->beta1, s->beta2, s->l1, s->l2, s->lr_power,
         s->weight_decay);
  return 0;
}

static void print_spec_json(const embps_table_spec_t *s) {
  printf("\"name\": \"%s\", \"dim\": %u, ", s->name, s->dim);
  if (s->dynamic)
    printf("\"dynamic\": true, ");
  else
    printf("\"rows\": %" PRIu64 ", ", s->rows);
  printf("\"optimizer\": \"%s\", \"dtype\": \"%s\", \"lr\": %.9g",
         embps_optimizer_name(s->optimizer), embps_dtype_name(s->dtype), s->lr);
}

static void print_durability(const embps_server_stats_t *x, int json);
static void print_json_string(const char *s);
static const embps_member_primary_t *
member_primary(const embps_server_stats_t *st, size_t n, uint32_t member);
static void print_member_primary(const embps_member_primary_t *m, int json);

/* Under a table of `tables --json`: `, "servers": [{"server": S,
 * "address": "H:P", <stats' durability figures>}, ...]` for the servers
 * that hold it (nothing when stats could not be read: st NULL). */
static void print_table_servers_json(const embps_server_stats_t *st,
                                     size_t n, const uint8_t *held) {
  if (!st)
    return;
  printf(", \"servers\": [");
  int any = 0;
  for (size_t s = 0; s < n; s++) {
    if (!held[s])
      continue;
    printf("%s{\"server\": %zu, \"address\": \"%s\"", any++ ? ", " : "", s,
           st[s].address);
    print_durability(&st[s], 1);
    const embps_member_primary_t *p = member_primary(st, n, (uint32_t)s);
    if (p) { /* coordinated: the primary of member s */
      printf(", ");
      print_member_primary(p, 1);
    }
    printf("}");
  }
  printf("]");
}

/* The directory a checkpoint covering lsn is kept in (DIR/ckpt-<hex>):
 * the LSN as an operator finds it on disk. */
static const char *ckpt_dir(uint64_t lsn, char buf[32]) {
  snprintf(buf, 32, "ckpt-%016" PRIx64, lsn);
  return buf;
}

/* The primary of member slot `member` as the servers of st (n of them)
 * know it: server `member`'s own word (its slot's key is the one it
 * watches), else the first that names it; NULL when none is coordinated. */
static const embps_member_primary_t *
member_primary(const embps_server_stats_t *st, size_t n, uint32_t member) {
  const embps_member_primary_t *found = NULL;
  for (size_t i = 0; i < n; i++)
    for (uint32_t j = 0; j < st[i].n_members; j++)
      if (st[i].members[j].member == member &&
          (!found || i == member))
        found = &st[i].members[j];
  return found;
}

/* One member's primary: as JSON `"primary": "H:P", "epoch": E` (null and
 * 0 during an election), as text `primary H:P epoch E` or `no primary
 * (an election is on)`. */
static void print_member_primary(const embps_member_primary_t *m, int json) {
  if (json) {
    printf("\"primary\": ");
    if (m->primary[0])
      print_json_string(m->primary);
    else
      printf("null");
    printf(", \"epoch\": %u", m->epoch);
  } else if (m->primary[0]) {
    printf("primary %s epoch %u", m->primary, m->epoch);
  } else {
    printf("no primary (an election is on)");
  }
}

/* Under `tables`: one line per server that has a data dir, then, for a
 * coordinated cluster, one per member slot naming its primary. */
static void print_tables_durability(cmd_t *cmd) {
  embps_server_stats_t *s;
  size_t n;
  if (embps_stats(cmd->client, &s, &n))
    return;
  for (size_t i = 0; i < n; i++) {
    if (!s[i].data_dir[0])
      continue;
    printf("server %s: data dir %s, fsync %s, ", s[i].address,
           s[i].data_dir, s[i].fsync);
    char dir[32];
    if (s[i].checkpoint_unix_s)
      printf("last checkpoint at unix time %" PRIu64 " (%" PRIu64 " bytes in %"
             PRIu64 " ms, LSN %" PRIu64 ": %s)", s[i].checkpoint_unix_s,
             s[i].checkpoint_bytes, s[i].checkpoint_ms, s[i].checkpoint_lsn,
             ckpt_dir(s[i].checkpoint_lsn, dir));
    else
      printf("no checkpoint since start (restored up to LSN %" PRIu64 ")",
             s[i].checkpoint_lsn);
    printf(", log %" PRIu64 " bytes%s%s\n", s[i].log_bytes,
           s[i].durability_failed[0] ? ", FAILED: " : "",
           s[i].durability_failed);
  }
  uint32_t slots = 0; /* the highest slot any server names, plus one */
  for (size_t i = 0; i < n; i++)
    for (uint32_t j = 0; j < s[i].n_members; j++)
      if (s[i].members[j].member >= slots)
        slots = s[i].members[j].member + 1;
  for (uint32_t m = 0; m < slots; m++) {
    const embps_member_primary_t *p = member_primary(s, n, m);
    if (!p)
      continue;
    printf("member %u: ", m);
    print_member_primary(p, 0);
    printf("\n");
  }
  embps_stats_free(s, n);
}

/* The servers where a table is missing (held[s] == 0): as JSON,
 * `, "missing_on": [{"server": S, "address": "H:P"}, ...]`; as text, a line
 * `  missing on server S (H:P), ...` when there are any. */
static void print_missing(embps_client_t *c, const uint8_t *held, int json) {
  const size_t K = embps_client_n_servers(c);
  int any = 0;
  if (json)
    printf(", \"missing_on\": [");
  for (size_t s = 0; s < K; s++) {
    if (held[s])
      continue;
    const char *addr = embps_client_server_address(c, s);
    if (json)
      printf("%s{\"server\": %zu, \"address\": \"%s\"}", any ? ", " : "", s,
             addr);
    else
      printf("%s server %zu (%s)", any ? "," : "  missing on", s, addr);
    any = 1;
  }
  if (json)
    printf("]");
  else if (any)
    printf("\n");
}

/* For stats: held[i * K + s] = 1 when server s lists table names[i], for
 * the union `names` (n of them) of every server's tables. All malloc'd. */
static int stats_held(const embps_server_stats_t *x, size_t K,
                      const char ***names_out, uint8_t **held_out,
                      size_t *n_out) {
  size_t cap = 0, n = 0;
  for (size_t s = 0; s < K; s++)
    cap += x[s].n_tables;
  const char **names = malloc((cap ? cap : 1) * sizeof *names);
  uint8_t *held = calloc((cap ? cap : 1) * K, 1);
  if (!names || !held) {
    free(names);
    free(held);
    return -1;
  }
  for (size_t s = 0; s < K; s++) {
    for (size_t t = 0; t < x[s].n_tables; t++) {
      const char *name = x[s].tables[t].spec.name;
      size_t i = 0;
      while (i < n && strcmp(names[i], name))
        i++;
      if (i == n)
        names[n++] = name;
      held[i * K + s] = 1;
    }
  }
  *names_out = names;
  *held_out = held;
  *n_out = n;
  return 0;
}

static int cmd_tables(cmd_t *cmd) {
  int json = cmd->o->json;
  embps_table_info_t *v;
  size_t n;
  uint8_t *held;
  int rc = embps_list_tables_held(cmd->client, &v, &n, &held);
  if (rc)
    return server_error(cmd->client, rc);
  const size_t K = embps_client_n_servers(cmd->client);
  embps_server_stats_t *st = NULL;
  size_t n_st = 0;
  if (json && (embps_stats(cmd->client, &st, &n_st) || n_st != K)) {
    embps_stats_free(st, n_st);
    st = NULL;
  }
  if (json) {
    printf("[");
    for (size_t i = 0; i < n; i++) {
      printf("%s{", i ? ", " : "");
      print_spec_json(&v[i].spec);
      printf(", \"rows_allocated\": %" PRIu64 ", \"bytes_used\": %" PRIu64
             ", \"pushes\": %" PRIu64 ", \"pulls\": %" PRIu64,
             v[i].rows_allocated, v[i].bytes_used, v[i].pushes, v[i].pulls);
      embps_cli_dyn_print(&v[i], 1);
      print_missing(cmd->client, held + i * K, 1);
      print_table_servers_json(st, K, held + i * K);
      printf("}");
    }
    printf("]\n");
  } else {
    printf("%-24s %8s %14s %-8s %-5s %14s %14s\n", "NAME", "DIM", "ROWS",
           "OPTIM", "DTYPE", "ALLOCATED", "BYTES");
    for (size_t i = 0; i < n; i++) {
      char rows[32];
      if (v[i].spec.dynamic)
        snprintf(rows, sizeof rows, "dynamic");
      else
        snprintf(rows, sizeof rows, "%" PRIu64, v[i].spec.rows);
      printf("%-24s %8u %14s %-8s %-5s %14" PRIu64 " %14" PRIu64 "\n",
             v[i].spec.name, v[i].spec.dim, rows,
             embps_optimizer_name(v[i].spec.optimizer),
             embps_dtype_name(v[i].spec.dtype), v[i].rows_allocated,
             v[i].bytes_used);
      embps_cli_dyn_print(&v[i], 0);
      print_missing(cmd->client, held + i * K, 0);
    }
    print_tables_durability(cmd);
  }
  embps_stats_free(st, n_st);
  free(v);
  free(held);
  return 0;
}

/* Looks up the table's dim (one describe round trip). */
static int table_dim(cmd_t *cmd, const char *name, uint32_t *dim) {
  embps_table_info_t info;
  int rc = embps_describe_table(cmd->client, name, &info);
  if (rc)
    return server_error(cmd->client, rc);
  *dim = info.spec.dim;
  return 0;
}

static int check_pull(cmd_t *cmd) {
  opts_t *o = cmd->o;
  if (!o->ids == !o->ids_file)
    return usage_error("%s", "pull needs exactly one of --ids and --ids-file");
  if (!o->ids)
    return 0;
  return parse_list("ids", o->ids, sizeof *o->id_list, id_item,
                    "an integer id", (void **)&o->id_list, &o->n_ids);
}

static int cmd_pull(cmd_t *cmd) {
  opts_t *o = cmd->o;
  const char *name = cmd->name, *out_file = o->out;
  int json = o->json;
  int64_t *ids = o->id_list;
  size_t n = o->n_ids;
  int rc = 0;
  if (o->ids_file) {
    rc = read_array(o->ids_file, sizeof *ids, (void **)&ids, &n);
    if (rc)
      return rc;
    o->id_list = ids; /* freed by main */
  }
  uint32_t dim;
  rc = table_dim(cmd, name, &dim);
  float *rows = rc ? NULL : malloc((n ? n : 1) * dim * sizeof *rows);
  if (!rc && !rows)
    rc = die(1, "out of memory for %zu rows", n);
  if (!rc) {
    int prc = embps_pull(cmd->client, name, ids, n, rows, dim);
    if (prc)
      rc = server_error(cmd->client, prc);
  }
  if (!rc && out_file) {
    rc = write_file(out_file, rows, n * dim * sizeof *rows);
  } else if (!rc && json) {
    printf("{\"table\": \"%s\", \"dim\": %u, \"rows\": [", name, dim);
    for (size_t i = 0; i < n; i++) {
      printf("%s{\"id\": %" PRId64 ", \"values\": [", i ? ", " : "", ids[i]);
      for (uint32_t j = 0; j < dim; j++)
        printf("%s%.9g", j ? ", " : "", (double)rows[i * dim + j]);
      printf("]}");
    }
    /* the LSN each member read at (0: no rows asked of it) */
    printf("], \"lsn\": [");
    for (size_t s = 0; s < embps_client_n_servers(cmd->client); s++)
      printf("%s%" PRIu64, s ? ", " : "",
             embps_client_read_lsn(cmd->client, s));
    printf("]}\n");
  } else if (!rc) {
    for (size_t i = 0; i < n; i++) {
      printf("%" PRId64 "\t", ids[i]);
      for (uint32_t j = 0; j < dim; j++)
        printf("%s%.9g", j ? " " : "", (double)rows[i * dim + j]);
      putchar('\n');
    }
  }
  free(rows);
  return rc;
}

static int check_push(cmd_t *cmd) {
  opts_t *o = cmd->o;
  int lists = o->indices && o->values && !o->indices_file && !o->values_file;
  if (!lists && !(o->indices_file && o->values_file && !o->indices &&
                  !o->values))
    return usage_error("%s", "push needs --indices and --values, or "
                       "--indices-file and --values-file");
  if (!lists)
    return 0;
  int rc = parse_list("indices", o->indices, sizeof *o->id_list, id_item,
                      "an integer id", (void **)&o->id_list, &o->n_ids);
  if (rc)
    return rc;
  return parse_list("values", o->values, sizeof *o->value_list, value_item,
                    "a number", (void **)&o->value_list, &o->n_values);
}

/* A push that gave up on some servers is owed to them: this process is
 * about to exit, so it tries once more (the library sends it to those
 * servers alone, under its sequence). 0 when every server has it now;
 * otherwise both errors, and exit status 1: the push stays applied on the
 * servers the first names only. */
static int push_complete(embps_client_t *c) {
  char first[1024];
  snprintf(first, sizeof first, "%s", embps_client_last_error(c));
  if (embps_push_resume(c) == 0) {
    fprintf(stderr, "embps: %s\nembps: completed since: every server has "
            "the push now\n", first);
    return 0;
  }
  fprintf(stderr, "embps: %s\n", first);
  return die(1, "%s; this command exits, so the push stays applied only on "
             "the servers named above", embps_client_last_error(c));
}

static int cmd_push(cmd_t *cmd) {
  opts_t *o = cmd->o;
  const char *name = cmd->name;
  uint64_t step = o->step;
  int64_t *idx = o->id_list;
  float *vals = o->value_list;
  size_t n = o->n_ids, nv = o->n_values;
  int rc = 0;
  if (o->indices_file) { /* both arrays are freed by main */
    rc = read_array(o->indices_file, sizeof *idx, (void **)&o->id_list, &n);
    if (!rc)
      rc = read_array(o->values_file, sizeof *vals, (void **)&o->value_list,
                      &nv);
    idx = o->id_list;
    vals = o->value_list;
  }
  uint32_t dim = 0;
  if (!rc)
    rc = table_dim(cmd, name, &dim);
  if (!rc && nv != n * dim)
    rc = die(1, "push has %zu indices but %zu values (expected %zu x %u)", n,
             nv, n, dim);
  if (!rc) {
    int prc = step ? embps_push_step(cmd->client, name, idx, n, vals, dim, 0,
                                     step)
                   : embps_push(cmd->client, name, idx, n, vals, dim, 0);
    if (prc && embps_push_owed(cmd->client))
      rc = push_complete(cmd->client);
    else if (prc)
      rc = server_error(cmd->client, prc);
  }
  return rc;
}

/* A JSON string (quotes and control characters escaped). */
static void print_json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      printf("\\%c", *s);
    else if ((unsigned char)*s < 0x20)
      printf("\\u%04x", (unsigned char)*s);
    else
      putchar(*s);
  }
  putchar('"');
}

/* `, "name": N` for each figure of EMBPS_SERVER_STATS_FIELDS whose source
 * is DURABLE (durable = 1) or any other (durable = 0). */
static void print_stats_figures_json(const embps_server_stats_t *x,
                                     int durable) {
#define IS_DURABLE_CONFIG_ 0
#define IS_DURABLE_UPTIME_ 0
#define IS_DURABLE_TRAFFIC_ 0
#define IS_DURABLE_DURABLE_ 1
#define FIGURE_(type, f, source, doc)                                          \
  if (IS_DURABLE_##source##_ == durable)                                       \
    printf(", \"" #f "\": %" PRIu64, (uint64_t)x->f);
  EMBPS_SERVER_STATS_FIELDS(FIGURE_)
#undef FIGURE_
#undef IS_DURABLE_CONFIG_
#undef IS_DURABLE_UPTIME_
#undef IS_DURABLE_TRAFFIC_
#undef IS_DURABLE_DURABLE_
}

static void print_durability(const embps_server_stats_t *x, int json) {
  if (json) {
    printf(", \"data_dir\": ");
    print_json_string(x->data_dir);
    printf(", \"fsync\": ");
    print_json_string(x->fsync);
    print_stats_figures_json(x, 1);
    printf(", \"durability_failed\": ");
    print_json_string(x->durability_failed);
    return;
  }
  if (!x->data_dir[0]) {
    printf("  data dir: none (memory only)\n");
    return;
  }
  printf("  data dir %s  fsync %s  log %" PRIu64 " bytes\n", x->data_dir,
         x->fsync, x->log_bytes);
  char dir[32];
  if (x->checkpoint_unix_s)
    printf("  last checkpoint: unix time %" PRIu64 ", %" PRIu64 " bytes in %"
           PRIu64 " ms, covers LSN %" PRIu64 " (%s)\n", x->checkpoint_unix_s,
           x->checkpoint_bytes, x->checkpoint_ms, x->checkpoint_lsn,
           ckpt_dir(x->checkpoint_lsn, dir));
  else
    printf("  last checkpoint: none since start (restored up to LSN %" PRIu64
           ")\n", x->checkpoint_lsn);
  if (x->durability_failed[0])
    printf("  DURABILITY FAILED: %s\n", x->durability_failed);
}

/* Replication (issue 21): who the server follows, its epoch, LSN, lag. */
static void print_replication(const embps_server_stats_t *x, int json) {
  if (json) {
#define FIGURE_(type, f, doc) printf(", \"" #f "\": %" PRIu64, (uint64_t)x->f);
    EMBPS_SERVER_REPL_FIELDS(FIGURE_)
#undef FIGURE_
    printf(", \"primary\": ");
    print_json_string(x->primary);
    printf(", \"sync_degraded\": %u", x->sync_degraded);
    return;
  }
  if (x->role == 1)
    printf("  follower of %s  epoch %u  applied LSN %" PRIu64 "  lag %" PRIu64
           " records, %" PRIu64 " ms  received %" PRIu64 " bytes\n",
           x->primary, x->epoch, x->applied_lsn, x->lag_records, x->lag_ms,
           x->bytes_shipped);
  else
    printf("  primary  epoch %u  applied LSN %" PRIu64 "  followers %u (%u "
           "in sync)  lag up to %" PRIu64 " records, %" PRIu64 " ms  shipped %"
           PRIu64 " bytes\n", x->epoch, x->applied_lsn, x->followers,
           x->followers_in_sync, x->lag_records, x->lag_ms, x->bytes_shipped);
  if (x->role != 1 && x->sync_degraded)
    printf("  DEGRADED: acknowledging writes without its synchronous "
           "followers (--sync-degrade-ms)\n");
}

/* A coordinated server's word on every member's primary: as JSON
 * `, "members": [{"member": I, "primary": ..., "epoch": E}, ...]`, as text
 * a line `  member I: primary H:P epoch E` each; nothing for a server
 * without --coordinator. */
static void print_members(const embps_server_stats_t *x, int json) {
  if (!x->n_members)
    return;
  if (json)
    printf(", \"members\": [");
  for (uint32_t i = 0; i < x->n_members; i++) {
    if (json) {
      printf("%s{\"member\": %u, ", i ? ", " : "", x->members[i].member);
      print_member_primary(&x->members[i], 1);
      printf("}");
    } else {
      printf("  member %u: ", x->members[i].member);
      print_member_primary(&x->members[i], 0);
      printf("\n");
    }
  }
  if (json)
    printf("]");
}

static int cmd_promote(cmd_t *cmd) {
  uint32_t epoch;
  uint64_t lsn;
  int rc = embps_promote(cmd->client, &epoch, &lsn);
  if (rc)
    return server_error(cmd->client, rc);
  printf("promoted: primary of epoch %u from LSN %" PRIu64 "\n", epoch,
         lsn + 1);
  return 0;
}

static int cmd_checkpoint(cmd_t *cmd) {
  size_t n = embps_client_n_servers(cmd->client);
  embps_checkpoint_info_t *info = calloc(n ? n : 1, sizeof *info);
  if (!info)
    return die(1, "out of memory");
  int rc = embps_checkpoint(cmd->client, info);
  if (rc) {
    free(info);
    return server_error(cmd->client, rc);
  }
  for (size_t i = 0; i < n; i++) {
    char dir[32];
    printf("server %zu: checkpoint at LSN %" PRIu64 " (%s), %" PRIu64
           " bytes in %" PRIu64 " ms\n", i, info[i].lsn,
           ckpt_dir(info[i].lsn, dir), info[i].bytes, info[i].duration_ms);
  }
  free(info);
  return 0;
}

/* export (--out DIR) and import (--from DIR) of table NAME. */
static int check_export_import(cmd_t *cmd, int import) {
  if (!(import ? cmd->o->from : cmd->o->out))
    return die(2, "%s needs %s DIR (see embps --help)",
               import ? "import" : "export", import ? "--from" : "--out");
  return 0;
}
static int check_export(cmd_t *cmd) { return check_export_import(cmd, 0); }
static int check_backup(cmd_t *cmd) {
  return cmd->o->out ? 0 : die(2, "backup needs --out DIR (see embps --help)");
}
static int cmd_backup(cmd_t *cmd) { /* cli_backup.c */
  return embps_cli_backup(cmd->client, cmd->member, cmd->o->out);
}
static int check_import(cmd_t *cmd) { return check_export_import(cmd, 1); }

static int export_import(cmd_t *cmd, int import) {
  const char *dir = import ? cmd->o->from : cmd->o->out;
  uint64_t rows = 0;
  unsigned flags = cmd->o->io_flags;
  int rc = import ? embps_import_table(cmd->client, cmd->name, dir, flags,
                                       &rows)
                  : embps_export_table(cmd->client, cmd->name, dir, flags,
                                       &rows);
  if (rc)
    return server_error(cmd->client, rc);
  printf("%s %" PRIu64 " rows of table \"%s\" %s %s\n",
         import ? "imported" : "exported", rows, cmd->name,
         import ? "from" : "to", dir);
  return 0;
}

static int cmd_export(cmd_t *cmd) { return export_import(cmd, 0); }
static int cmd_import(cmd_t *cmd) { return export_import(cmd, 1); }

static int cmd_evict(cmd_t *cmd) {
  return embps_cli_dyn_evict(cmd->client, cmd->name);
}

static int cmd_stats(cmd_t *cmd) {
  int json = cmd->o->json;
  embps_server_stats_t *s;
  size_t n;
  int rc = embps_stats(cmd->client, &s, &n);
  if (rc)
    return server_error(cmd->client, rc);
  const char **names;
  uint8_t *held;
  size_t n_names;
  if (stats_held(s, n, &names, &held, &n_names)) {
    embps_stats_free(s, n);
    return die(1, "out of memory");
  }
  if (json)
    printf("[");
  for (size_t i = 0; i < n; i++) {
    const embps_server_stats_t *x = &s[i];
    if (json) {
      printf("%s{\"address\": \"%s\", \"version\": \"%s\"", i ? ", " : "",
             x->address, x->version);
      print_stats_figures_json(x, 0);
      printf(", \"tables\": [");
      for (size_t t = 0; t < x->n_tables; t++) {
        printf("%s{", t ? ", " : "");
        print_spec_json(&x->tables[t].spec);
        printf(", \"rows_allocated\": %" PRIu64 ", \"bytes_used\": %" PRIu64
               ", \"step\": %" PRIu64, x->tables[t].rows_allocated,
               x->tables[t].bytes_used, x->tables[t].step);
        embps_cli_dyn_print(&x->tables[t], 1);
        printf("}");
      }
      printf("]");
      print_durability(x, 1);
      print_replication(x, 1);
      print_members(x, 1);
      printf(", \"missing_tables\": [");
      int any = 0;
      for (size_t t = 0; t < n_names; t++)
        if (!held[t * n + i])
          printf("%s\"%s\"", any++ ? ", " : "", names[t]);
      printf("]}");
    } else {
      printf("server %s (embps %s, slot %u of %u, %u io threads, %u shards, "
             "up %.1f s)\n", x->address, x->version, x->cluster_index,
             x->cluster_size, x->io_threads, x->shards,
             (double)x->uptime_ms / 1000);
      printf("  connections %" PRIu64 "  requests %" PRIu64 "  errors %" PRIu64
             "\n", x->connections, x->requests, x->errors);
      printf("  pulls %" PRIu64 " (%" PRIu64 " rows)  pushes %" PRIu64
             " (%" PRIu64 " unique rows)\n", x->pulls, x->pull_rows,
             x->pushes, x->push_rows);
      printf("  bytes in %" PRIu64 "  out %" PRIu64 "\n", x->bytes_in,
             x->bytes_out);
      print_durability(x, 0);
      print_replication(x, 0);
      print_members(x, 0);
      for (size_t t = 0; t < x->n_tables; t++) {
        printf("  table %-20s dim %-5u %-8s %-5s rows %" PRIu64
               "  bytes %" PRIu64 "  step %" PRIu64 "\n",
               x->tables[t].spec.name, x->tables[t].spec.dim,
               embps_optimizer_name(x->tables[t].spec.optimizer),
               embps_dtype_name(x->tables[t].spec.dtype),
               x->tables[t].rows_allocated, x->tables[t].bytes_used,
               x->tables[t].step);
        embps_cli_dyn_print(&x->tables[t], 0);
      }
    }
  }
  if (json)
    printf("]\n");
  for (size_t t = 0; t < n_names && !json; t++) {
    int all = 1;
    for (size_t i = 0; i < n; i++)
      all &= held[t * n + i];
    if (!all) {
      printf("table %s", names[t]);
      print_missing(cmd->client, held + t * n, 0);
    }
  }
  free(names);
  free(held);
  embps_stats_free(s, n);
  return 0;
}

/* ------------------------------------------------------------ main */

typedef struct {
  const char *name;
  const char *args; /* "NAME": the command's first argument, a table */
  const char *help;
  const embps_flag_group_t *groups;
  int (*check)(cmd_t *cmd); /* before connecting: 0 or the exit status */
  int (*run)(cmd_t *cmd);   /* NULL: bench, which parses its own flags */
  /* 1: it addresses servers (stats, promote, ...): an entry of one server
   * is that server, its role not followed (servers_as_listed) */
  int as_listed;
} command_t;

static const command_t commands[] = {
    {"create-table", "NAME", "create a table on every server", create_groups,
     check_create, cmd_create, 0},
    {"complete-table", "NAME",
     "create a table some servers lack (a member that lost its data) on "
     "those, with the spec the others hold: its rows there start from the "
     "initializer",
     no_groups, NULL, cmd_complete, 0},
    {"drop-table", "NAME", "drop a table", no_groups, NULL, cmd_drop, 0},
    {"alter", "NAME",
     "change hyperparameters on every server, in order with "
     "the pushes, and print the new ones",
     alter_groups, check_alter, cmd_alter, 0},
    {"tables", NULL,
     "the tables: spec, rows, bytes, servers that lack them, "
     "durability; with --coordinator, then a line per member slot I, "
     "'member I: primary H:P epoch E' (or 'no primary (an election is "
     "on)'): the server etcd elected and its epoch, as the servers last "
     "read them (--json: \"primary\" and \"epoch\" in each entry of a "
     "table's \"servers\")",
     json_groups, NULL, cmd_tables, 1},
    {"pull", "NAME",
     "print rows (id, tab, values) in request order (--json: and the LSN "
     "each member read at)",
     pull_groups, check_pull, cmd_pull, 0},
    {"push", "NAME", "push a gradient: one optimizer step on its rows",
     push_groups, check_push, cmd_push, 0},
    {"stats", NULL,
     "every server's counters, tables and durability; with --coordinator, "
     "under each server a line per member slot I of the cluster, "
     "'member I: primary H:P epoch E' (or 'no primary (an election is "
     "on)'): that member's primary and its epoch as this server last read "
     "etcd (--json: \"members\": [{\"member\": I, \"primary\": "
     "\"H:P\" or null, \"epoch\": E}, ...])",
     json_groups, NULL, cmd_stats, 1},
    {"checkpoint", NULL, "take a checkpoint on every server (--data-dir)",
     no_groups, NULL, cmd_checkpoint, 1},
    {"export", "NAME", "write the table's rows to .npy files and spec.json",
     export_groups, check_export, cmd_export, 0},
    {"import", "NAME",
     "read rows from what export wrote (or numpy .npy "
     "files) into the table",
     import_groups, check_import, cmd_import, 0},
    {"evict", "NAME",
     "evict the expired rows now, and those of L2 norm "
     "below the table's --evict-l2-below",
     no_groups, NULL, cmd_evict, 0},
    {"promote", NULL,
     "the follower addressed (its only server, or --member I) stops "
     "following and becomes a primary of a new epoch",
     no_groups, NULL, cmd_promote, 1},
    {"backup", NULL,
     "copy every member (or --member I) while it serves: DIR/member-I is a "
     "data dir (--data-dir) holding its state at one LSN",
     backup_groups, check_backup, cmd_backup, 1},
    {"bench", NULL,
     "drive the servers with W workers pulling, then pushing, "
     "Zipf batches; report rows/s and latency",
     embps_cli_bench_groups, NULL, NULL, 0},
};
#define N_COMMANDS (sizeof commands / sizeof *commands)

/* The global flags, then each command with its flags one level in, then
 * notes: the layout packaging/helpdoc.awk reads (man page, completion). */
static void print_help(FILE *out) {
  fprintf(out, "usage: embps [options] COMMAND [NAME] [flags]\n");
  embps_flags_print(out, global_groups, 2, 30);
  for (size_t k = 0; k < N_COMMANDS; k++) {
    const command_t *c = &commands[k];
    int used = fprintf(out, "  %s%s%s", c->name, c->args ? " " : "",
                       c->args ? c->args : "");
    embps_flags_print_wrapped(out, c->help, used, 30);
    embps_flags_print(out, c->groups, 4, 30);
  }
  fprintf(out, "The options come before the COMMAND; its table NAME, then its "
               "flags, after it.\nA value follows its flag or joins it: "
               "--dim 8, --dim=8.\n");
}

/* Parses the command's NAME (if it takes one) and flags, argv[0] being the
 * command, into o and p. Returns 0 or the exit status. */
static int parse_command(const command_t *c, int argc, char **argv,
                         const char **name, opts_t *o, embps_flags_t *p) {
  int first = 0; /* argv[first]: the last argument before the flags */
  *name = NULL;
  if (c->args) {
    if (argc < 2 || !strncmp(argv[1], "--", 2))
      return usage_error("%s needs a table NAME first", c->name);
    *name = argv[first = 1];
  }
  char err[512];
  if (embps_flags_parse(p, c->groups, o, argc - first, argv + first, c->name,
                        err, sizeof err))
    return usage_error("%s", err);
  if (p->next < argc - first)
    return die(2, "unexpected argument \"%s\" for %s (see embps --help)",
               argv[first + p->next], c->name);
  return 0;
}

/* The global flags' client options: the token read from --token-file (a
 * malloc'd *token), --retry-ms 0 meaning never. 0 or the exit status. */
static int client_options(global_t *g, const embps_flags_t *p, char **token) {
  *token = NULL;
  if (embps_flags_given(p, "retry-ms"))
    g->client.retry_ms = g->retry_ms ? (int)g->retry_ms : -1;
  if (!g->token_file)
    return 0;
  size_t len;
  int rc = embps_read_file(g->token_file, token, &len);
  if (rc)
    return die(1, "cannot read --token-file %s: %s", g->token_file,
               strerror(-rc));
  (*token)[embps_token_first_line(*token, len)] = 0; /* rotation: 2 lines */
  g->client.token = *token;
  return 0;
}

/* Runs command cmd: argv[0] is its name, its NAME and flags follow. The
 * flags are checked before connecting. Returns the exit status. */
static int run_command(const command_t *cmd, global_t *g,
                       const embps_flags_t *global, int argc, char **argv) {
  char *token = NULL, err[512];
  int rc;
  if (!cmd->run) {
    rc = client_options(g, global, &token);
    if (!rc)
      rc = embps_cli_bench(&g->client, argc, argv);
    free(token);
    return rc;
  }
  opts_t o;
  memset(&o, 0, sizeof o);
  embps_table_spec_init(&o.spec, NULL, 0, EMBPS_OPT_SGD);
  embps_table_alter_init(&o.alter);
  embps_flags_t given;
  cmd_t c = {NULL, NULL, &o, &given, g->member};
  rc = parse_command(cmd, argc, argv, &c.name, &o, &given);
  if (!rc && cmd->check)
    rc = cmd->check(&c);
  if (!rc)
    rc = client_options(g, global, &token);
  g->client.servers_as_listed = cmd->as_listed;
  if (!rc && embps_client_create_member(&g->client, g->member, &c.client,
                                        err, sizeof err))
    rc = die(1, "%s", err);
  free(token); /* the client holds its own copy */
  if (!rc)
    rc = cmd->run(&c);
  embps_client_destroy(c.client);
  free(o.id_list);
  free(o.value_list);
  return rc;
}

int main(int argc, char **argv) {
  global_t g = {.member = UINT32_MAX};
  embps_client_options_init(&g.client);
  embps_flags_t p;
  char err[512];
  if (embps_flags_parse(&p, global_groups, &g, argc, argv, NULL, err,
                        sizeof err))
    return usage_error("%s", err);
  if (g.help) {
    print_help(stdout);
    return 0;
  }
  if (g.version) {
    printf("embps %s (revision %s)\nprotocol %d\n", EMBPS_VERSION_STRING,
           EMBPS_REVISION, EMBPS_PROTOCOL_VERSION);
    return 0;
  }
  if (p.next >= argc) {
    print_help(stderr);
    return 2;
  }
  for (size_t k = 0; k < N_COMMANDS; k++)
    if (!strcmp(argv[p.next], commands[k].name))
      return run_command(&commands[k], &g, &p, argc - p.next, argv + p.next);
  return usage_error("unknown command \"%s\"", argv[p.next]);
}
