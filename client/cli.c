/* cli.c - the embps command-line client: table administration, pulls and
 * pushes from the shell, stats. Formats are DESIGN.md's contract: binary
 * files are little-endian int64 ids and float32 row-major values; pulled
 * rows print as "id<TAB>v v v" with %.9g, which reads back to the identical
 * float32. Every failure prints one line naming the problem and exits 1
 * (2 for a command line that does not parse). */
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

static const char usage[] =
    "usage: embps [--servers H:P[,H:P...]] [--token-file F] [--timeout-ms N]"
    "\n             [--retry-ms N] [--member I] COMMAND ...\n"
    "  create-table NAME --dim D (--rows N | --dynamic)\n"
    "               [--optimizer sgd|adagrad|adam|ftrl] [--lr X] [--eps X]\n"
    "               [--beta1 X] [--beta2 X] [--initial-accumulator X]\n"
    "               [--l1 X] [--l2 X] [--lr-power X] [--weight-decay X]\n"
    "               [--init zeros|constant:V|uniform:A|normal:STD]\n"
    "               [--seed S] [--padding-id ID] [--sync-workers N]\n"
    "               [--dtype f32|f16|bf16] [--exist-ok]\n"
    "               [--admit-after N] [--admit-probability P]\n"
    "               [--admit-sketch-bytes B] [--ttl-steps S] [--max-rows N]\n"
    "               [--evict lru|lfu] [--evict-l2-below X]  (--dynamic only)\n"
    "  drop-table NAME\n"
    "  alter NAME [--lr X] [--eps X] [--beta1 X] [--beta2 X] [--l1 X]\n"
    "             [--l2 X] [--lr-power X] [--weight-decay X]\n"
    "  tables [--json]\n"
    "  pull NAME (--ids 1,2,3 | --ids-file F) [--out F] [--json]\n"
    "  push NAME (--indices 1,2,2 --values v,v,... |\n"
    "             --indices-file F --values-file F) [--step S]\n"
    "  stats [--json]\n"
    "  checkpoint           take a checkpoint on every server (--data-dir)\n"
    "  export NAME --out DIR [--with-state]   rows to .npy files + spec.json\n"
    "  import NAME --from DIR [--with-state] [--create]\n"
    "  evict NAME           evict expired rows and those of L2 norm below\n"
    "                       --evict-l2-below now\n"
    "  backup --out DIR     copy every member's tables while it serves:\n"
    "                       DIR/member-I is a data dir (--data-dir) for it\n"
    "  bench [--workers W] [--batch B] [--rows R] [--dim D] [--zipf S]\n"
    "        [--optimizer O] [--seconds T] [--depth N] [--mode pull|push|both]\n"
    "        [--dynamic] [--unique] [--no-prefill] [--json]\n"
    "        [--admit-after N] [--max-rows R] [--evict lru|lfu] ...\n"
    "--member I: stats, tables (and describe) ask only server I of the list\n"
    "Servers default to $EMBPS_SERVERS, then 127.0.0.1:7070; the token file\n"
    "to $EMBPS_TOKEN_FILE. --timeout-ms bounds one attempt (default 30000);\n"
    "--retry-ms how long a push or read goes on retrying after a broken\n"
    "connection (default 30000; 0 or -1: never).\n";

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

/* ------------------------------------------------------------ parsing */

static int parse_i64(const char *s, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end)
    return -1;
  *out = v;
  return 0;
}

static int parse_u64(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  if (*s == '-')
    return -1;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end)
    return -1;
  *out = v;
  return 0;
}

static int parse_double(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end)
    return -1;
  *out = v;
  return 0;
}

/* A comma-separated list of int64; *out malloc'd. */
static int parse_ids(const char *s, int64_t **out, size_t *n) {
  size_t cap = 1;
  for (const char *p = s; *p; p++)
    cap += *p == ',';
  int64_t *v = malloc(cap * sizeof *v);
  if (!v)
    return -1;
  char *copy = strdup(s), *save = NULL;
  size_t k = 0;
  for (char *tok = strtok_r(copy, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    if (parse_i64(tok, &v[k])) {
      fprintf(stderr, "embps: \"%s\" is not an integer id\n", tok);
      free(copy);
      free(v);
      return -1;
    }
    k++;
  }
  free(copy);
  *out = v;
  *n = k;
  return 0;
}

/* A comma-separated list of floats (non-finite ones parse; the server
 * refuses them by name). */
static int parse_values(const char *s, float **out, size_t *n) {
  size_t cap = 1;
  for (const char *p = s; *p; p++)
    cap += *p == ',';
  float *v = malloc(cap * sizeof *v);
  if (!v)
    return -1;
  char *copy = strdup(s), *save = NULL;
  size_t k = 0;
  for (char *tok = strtok_r(copy, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    char *end;
    v[k] = strtof(tok, &end);
    if (end == tok || *end) {
      fprintf(stderr, "embps: \"%s\" is not a number\n", tok);
      free(copy);
      free(v);
      return -1;
    }
    k++;
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
  int argc;
  char **argv;
} cmd_t;

static int server_error(embps_client_t *c, int rc) {
  return die(1, "%s", embps_client_last_error(c)[0]
                          ? embps_client_last_error(c)
                          : embps_strerror(rc));
}

static int parse_init(const char *s, embps_table_spec_t *spec) {
  const char *colon = strchr(s, ':');
  size_t len = colon ? (size_t)(colon - s) : strlen(s);
  double v = 0;
  if (colon && parse_double(colon + 1, &v))
    return -1;
  if (len == 5 && !strncmp(s, "zeros", 5) && !colon)
    spec->init = EMBPS_INIT_ZEROS;
  else if (len == 8 && !strncmp(s, "constant", 8) && colon)
    spec->init = EMBPS_INIT_CONSTANT;
  else if (len == 7 && !strncmp(s, "uniform", 7) && colon)
    spec->init = EMBPS_INIT_UNIFORM;
  else if (len == 6 && !strncmp(s, "normal", 6) && colon)
    spec->init = EMBPS_INIT_NORMAL;
  else
    return -1;
  spec->init_value = v;
  return 0;
}

static int cmd_create(cmd_t *cmd) {
  if (cmd->argc < 1)
    return usage_error("%s", "create-table needs a NAME");
  const char *name = cmd->argv[0];
  /* the optimizer decides the defaults, so find it first */
  embps_optimizer_t opt = EMBPS_OPT_SGD;
  for (int i = 1; i + 1 < cmd->argc; i++)
    if (!strcmp(cmd->argv[i], "--optimizer") &&
        embps_optimizer_parse(cmd->argv[i + 1], &opt))
      return usage_error("unknown optimizer \"%s\"", cmd->argv[i + 1]);
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, name, 0, opt);
  if (strlen(name) >= sizeof spec.name)
    return usage_error("table name \"%s\" is too long", name);
  int have_dim = 0, have_rows = 0;
  unsigned flags = 0;
  for (int i = 1; i < cmd->argc; i++) {
    const char *a = cmd->argv[i];
    if (!strcmp(a, "--dynamic")) {
      spec.dynamic = 1;
      continue;
    }
    if (!strcmp(a, "--exist-ok")) {
      flags |= EMBPS_CREATE_EXIST_OK;
      continue;
    }
    if (i + 1 >= cmd->argc)
      return usage_error("%s needs a value", a);
    const char *v = cmd->argv[++i];
    uint64_t u;
    int64_t s;
    double *d = NULL;
    int dyn;
    if (!strcmp(a, "--dim")) {
      if (parse_u64(v, &u) || u > UINT32_MAX)
        return usage_error("--dim \"%s\" is not a dimension", v);
      spec.dim = (uint32_t)u;
      have_dim = 1;
    } else if (!strcmp(a, "--rows")) {
      if (parse_u64(v, &u))
        return usage_error("--rows \"%s\" is not a row count", v);
      spec.rows = u;
      have_rows = 1;
    } else if (!strcmp(a, "--optimizer")) {
      continue; /* handled above */
    } else if (!strcmp(a, "--seed")) {
      if (parse_u64(v, &u))
        return usage_error("--seed \"%s\" is not a number", v);
      spec.seed = u;
    } else if (!strcmp(a, "--padding-id")) {
      if (parse_i64(v, &s))
        return usage_error("--padding-id \"%s\" is not an id", v);
      spec.has_padding = 1;
      spec.padding_id = s;
    } else if (!strcmp(a, "--sync-workers")) {
      if (parse_u64(v, &u) || u > UINT32_MAX)
        return usage_error("--sync-workers \"%s\" is not a count", v);
      spec.sync_workers = (uint32_t)u;
    } else if (!strcmp(a, "--dtype")) {
      if (embps_dtype_parse(v, &spec.dtype))
        return usage_error("--dtype \"%s\" is not f32|f16|bf16", v);
    } else if ((dyn = embps_cli_dyn_option(a, v, &spec)) != 0) {
      if (dyn < 0)
        return usage_error("bad value for %s", a);
    } else if (!strcmp(a, "--init")) {
      if (parse_init(v, &spec))
        return usage_error("--init \"%s\" is not zeros|constant:V|uniform:A|"
                           "normal:STD", v);
    } else {
      if (!strcmp(a, "--lr"))
        d = &spec.lr;
      else if (!strcmp(a, "--eps"))
        d = &spec.eps;
      else if (!strcmp(a, "--beta1"))
        d = &spec.beta1;
      else if (!strcmp(a, "--beta2"))
        d = &spec.beta2;
      else if (!strcmp(a, "--initial-accumulator"))
        d = &spec.initial_accumulator;
      else if (!strcmp(a, "--l1"))
        d = &spec.l1;
      else if (!strcmp(a, "--l2"))
        d = &spec.l2;
      else if (!strcmp(a, "--lr-power"))
        d = &spec.lr_power;
      else if (!strcmp(a, "--weight-decay"))
        d = &spec.weight_decay;
      else
        return usage_error("unknown option %s for create-table", a);
      if (parse_double(v, d))
        return usage_error("\"%s\" is not a number", v);
    }
  }
  if (!have_dim)
    return usage_error("%s", "create-table needs --dim D");
  if (have_rows == spec.dynamic)
    return usage_error("%s", "create-table needs exactly one of --rows N "
                       "and --dynamic");
  int rc = embps_create_table_ex(cmd->client, &spec, flags);
  return rc ? server_error(cmd->client, rc) : 0;
}

static int cmd_drop(cmd_t *cmd) {
  if (cmd->argc != 1)
    return usage_error("%s", "drop-table takes one NAME");
  int rc = embps_drop_table(cmd->client, cmd->argv[0]);
  return rc ? server_error(cmd->client, rc) : 0;
}

/* The hyperparameters `alter` may change (embps_table_alter_t). */
static const struct {
  const char *flag;
  unsigned bit;
  size_t off;
} alter_flags[] = {
    {"--lr", EMBPS_ALTER_LR, offsetof(embps_table_alter_t, lr)},
    {"--eps", EMBPS_ALTER_EPS, offsetof(embps_table_alter_t, eps)},
    {"--beta1", EMBPS_ALTER_BETA1, offsetof(embps_table_alter_t, beta1)},
    {"--beta2", EMBPS_ALTER_BETA2, offsetof(embps_table_alter_t, beta2)},
    {"--l1", EMBPS_ALTER_L1, offsetof(embps_table_alter_t, l1)},
    {"--l2", EMBPS_ALTER_L2, offsetof(embps_table_alter_t, l2)},
    {"--lr-power", EMBPS_ALTER_LR_POWER,
     offsetof(embps_table_alter_t, lr_power)},
    {"--weight-decay", EMBPS_ALTER_WEIGHT_DECAY,
     offsetof(embps_table_alter_t, weight_decay)},
};

static int cmd_alter(cmd_t *cmd) {
  if (cmd->argc < 1)
    return usage_error("%s", "alter needs a table NAME");
  const size_t n_flags = sizeof alter_flags / sizeof *alter_flags;
  embps_table_alter_t a;
  embps_table_alter_init(&a);
  for (int i = 1; i < cmd->argc; i += 2) {
    const char *f = cmd->argv[i];
    size_t k = 0;
    while (k < n_flags && strcmp(alter_flags[k].flag, f))
      k++;
    if (k == n_flags)
      return usage_error("unknown option %s for alter (it changes --lr, "
                         "--eps, --beta1, --beta2, --l1, --l2, --lr-power, "
                         "--weight-decay)", f);
    if (i + 1 >= cmd->argc)
      return usage_error("%s needs a value", f);
    if (parse_double(cmd->argv[i + 1],
                     (double *)((char *)&a + alter_flags[k].off)))
      return usage_error("\"%s\" is not a number", cmd->argv[i + 1]);
    a.set |= alter_flags[k].bit;
  }
  if (!a.set)
    return usage_error("%s", "alter needs at least one of --lr, --eps, "
                       "--beta1, --beta2, --l1, --l2, --lr-power, "
                       "--weight-decay");
  embps_table_info_t info;
  int rc = embps_alter_table(cmd->client, cmd->argv[0], &a, &info);
  if (rc)
    return server_error(cmd->client, rc);
  const embps_table_spec_t *s = &info.spec;
  printf("table %s: lr %.9g, eps %.9g, beta1 %.9g, beta2 %.9g, l1 %.9g, "
         "l2 %.9g, lr-power %.9g, weight-decay %.9g\n", s->name, s->lr,
         s->eps, s->beta1, s->beta2, s->l1, s->l2, s->lr_power,
         s->weight_decay);
  return 0;
}

static int has_flag(cmd_t *cmd, const char *flag) {
  for (int i = 0; i < cmd->argc; i++)
    if (!strcmp(cmd->argv[i], flag))
      return 1;
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
    printf("}");
  }
  printf("]");
}

/* Under `tables`: one line per server that has a data dir. */
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
    if (s[i].checkpoint_unix_s)
      printf("last checkpoint at unix time %" PRIu64 " (%" PRIu64 " bytes in %"
             PRIu64 " ms, LSN %" PRIu64 ")", s[i].checkpoint_unix_s,
             s[i].checkpoint_bytes, s[i].checkpoint_ms, s[i].checkpoint_lsn);
    else
      printf("no checkpoint since start (restored up to LSN %" PRIu64 ")",
             s[i].checkpoint_lsn);
    printf(", log %" PRIu64 " bytes%s%s\n", s[i].log_bytes,
           s[i].durability_failed[0] ? ", FAILED: " : "",
           s[i].durability_failed);
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
  int json = has_flag(cmd, "--json");
  for (int i = 0; i < cmd->argc; i++)
    if (strcmp(cmd->argv[i], "--json"))
      return usage_error("unknown option %s for tables", cmd->argv[i]);
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

static int cmd_pull(cmd_t *cmd) {
  if (cmd->argc < 1)
    return usage_error("%s", "pull needs a table NAME");
  const char *name = cmd->argv[0], *ids_arg = NULL, *ids_file = NULL,
             *out_file = NULL;
  int json = 0;
  for (int i = 1; i < cmd->argc; i++) {
    const char *a = cmd->argv[i];
    if (!strcmp(a, "--json")) {
      json = 1;
      continue;
    }
    if (i + 1 >= cmd->argc)
      return usage_error("%s needs a value", a);
    if (!strcmp(a, "--ids"))
      ids_arg = cmd->argv[++i];
    else if (!strcmp(a, "--ids-file"))
      ids_file = cmd->argv[++i];
    else if (!strcmp(a, "--out"))
      out_file = cmd->argv[++i];
    else
      return usage_error("unknown option %s for pull", a);
  }
  if (!ids_arg == !ids_file)
    return usage_error("%s", "pull needs exactly one of --ids and --ids-file");
  int64_t *ids = NULL;
  size_t n;
  if (ids_arg ? parse_ids(ids_arg, &ids, &n)
              : read_array(ids_file, sizeof *ids, (void **)&ids, &n))
    return ids_arg ? 2 : 1;
  uint32_t dim;
  int rc = table_dim(cmd, name, &dim);
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
    printf("]}\n");
  } else if (!rc) {
    for (size_t i = 0; i < n; i++) {
      printf("%" PRId64 "\t", ids[i]);
      for (uint32_t j = 0; j < dim; j++)
        printf("%s%.9g", j ? " " : "", (double)rows[i * dim + j]);
      putchar('\n');
    }
  }
  free(ids);
  free(rows);
  return rc;
}

static int cmd_push(cmd_t *cmd) {
  if (cmd->argc < 1)
    return usage_error("%s", "push needs a table NAME");
  const char *name = cmd->argv[0], *ia = NULL, *va = NULL, *ifile = NULL,
             *vfile = NULL;
  uint64_t step = 0;
  for (int i = 1; i < cmd->argc; i++) {
    const char *a = cmd->argv[i];
    if (i + 1 >= cmd->argc)
      return usage_error("%s needs a value", a);
    const char *v = cmd->argv[++i];
    if (!strcmp(a, "--indices"))
      ia = v;
    else if (!strcmp(a, "--values"))
      va = v;
    else if (!strcmp(a, "--indices-file"))
      ifile = v;
    else if (!strcmp(a, "--values-file"))
      vfile = v;
    else if (!strcmp(a, "--step")) {
      if (parse_u64(v, &step) || step == 0)
        return usage_error("--step \"%s\" is not a step number (from 1)", v);
    } else
      return usage_error("unknown option %s for push", a);
  }
  if (!((ia && va && !ifile && !vfile) || (ifile && vfile && !ia && !va)))
    return usage_error("%s", "push needs --indices and --values, or "
                       "--indices-file and --values-file");
  int64_t *idx = NULL;
  float *vals = NULL;
  size_t n = 0, nv = 0;
  int rc;
  if (ia)
    rc = parse_ids(ia, &idx, &n) || parse_values(va, &vals, &nv) ? 2 : 0;
  else
    rc = read_array(ifile, sizeof *idx, (void **)&idx, &n) ||
                 read_array(vfile, sizeof *vals, (void **)&vals, &nv)
             ? 1
             : 0;
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
    if (prc)
      rc = server_error(cmd->client, prc);
  }
  free(idx);
  free(vals);
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
  if (x->checkpoint_unix_s)
    printf("  last checkpoint: unix time %" PRIu64 ", %" PRIu64 " bytes in %"
           PRIu64 " ms, covers LSN %" PRIu64 "\n", x->checkpoint_unix_s,
           x->checkpoint_bytes, x->checkpoint_ms, x->checkpoint_lsn);
  else
    printf("  last checkpoint: none since start (restored up to LSN %" PRIu64
           ")\n", x->checkpoint_lsn);
  if (x->durability_failed[0])
    printf("  DURABILITY FAILED: %s\n", x->durability_failed);
}

static int cmd_checkpoint(cmd_t *cmd) {
  if (cmd->argc)
    return usage_error("unknown option %s for checkpoint", cmd->argv[0]);
  size_t n = embps_client_n_servers(cmd->client);
  embps_checkpoint_info_t *info = calloc(n ? n : 1, sizeof *info);
  if (!info)
    return die(1, "out of memory");
  int rc = embps_checkpoint(cmd->client, info);
  if (rc) {
    free(info);
    return server_error(cmd->client, rc);
  }
  for (size_t i = 0; i < n; i++)
    printf("server %zu: checkpoint at LSN %" PRIu64 ", %" PRIu64 " bytes in %"
           PRIu64 " ms\n", i, info[i].lsn, info[i].bytes,
           info[i].duration_ms);
  free(info);
  return 0;
}

/* export and import: NAME, then DIR after `dir_flag`; --with-state (or
 * DESIGN.md's --state) and, for import, --create. */
static int export_import(cmd_t *cmd, int import) {
  const char *what = import ? "import" : "export";
  const char *dir_flag = import ? "--from" : "--out", *dir = NULL;
  unsigned flags = 0;
  if (cmd->argc < 1)
    return usage_error("%s needs a table NAME", what);
  for (int i = 1; i < cmd->argc; i++) {
    const char *a = cmd->argv[i];
    if (!strcmp(a, "--with-state") || !strcmp(a, "--state"))
      flags |= import ? EMBPS_IMPORT_STATE : EMBPS_EXPORT_STATE;
    else if (import && !strcmp(a, "--create"))
      flags |= EMBPS_IMPORT_CREATE;
    else if (!strcmp(a, dir_flag) && i + 1 < cmd->argc)
      dir = cmd->argv[++i];
    else
      return usage_error("unknown option or missing value: %s", a);
  }
  if (!dir)
    return die(2, "%s needs %s DIR (see embps --help)", what, dir_flag);
  uint64_t rows = 0;
  int rc = import ? embps_import_table(cmd->client, cmd->argv[0], dir, flags,
                                       &rows)
                  : embps_export_table(cmd->client, cmd->argv[0], dir, flags,
                                       &rows);
  if (rc)
    return server_error(cmd->client, rc);
  printf("%s %" PRIu64 " rows of table \"%s\" %s %s\n",
         import ? "imported" : "exported", rows, cmd->argv[0],
         import ? "from" : "to", dir);
  return 0;
}

static int cmd_export(cmd_t *cmd) { return export_import(cmd, 0); }
static int cmd_import(cmd_t *cmd) { return export_import(cmd, 1); }

static int cmd_evict(cmd_t *cmd) {
  return embps_cli_dyn_evict(cmd->client, cmd->argc, cmd->argv);
}

static int cmd_stats(cmd_t *cmd) {
  int json = has_flag(cmd, "--json");
  for (int i = 0; i < cmd->argc; i++)
    if (strcmp(cmd->argv[i], "--json"))
      return usage_error("unknown option %s for stats", cmd->argv[i]);
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

typedef struct {
  const char *name;
  int (*run)(cmd_t *cmd);
} command_t;

static const command_t commands[] = {
    {"create-table", cmd_create}, {"drop-table", cmd_drop},
    {"tables", cmd_tables},       {"pull", cmd_pull},
    {"push", cmd_push},           {"stats", cmd_stats},
    {"checkpoint", cmd_checkpoint},
    {"alter", cmd_alter},
    {"export", cmd_export},       {"import", cmd_import},
    {"evict", cmd_evict},
};

int main(int argc, char **argv) {
  embps_client_options_t opts;
  embps_client_options_init(&opts);
  uint32_t member = UINT32_MAX;
  char *token = NULL;
  int i = 1;
  for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help")) {
      fputs(usage, stdout);
      return 0;
    }
    if (!strcmp(a, "--version")) {
      printf("embps %s (revision %s)\nprotocol %d\n", EMBPS_VERSION_STRING,
             EMBPS_REVISION, EMBPS_PROTOCOL_VERSION);
      return 0;
    }
    if (i + 1 >= argc)
      return usage_error("%s needs a value", a);
    const char *v = argv[++i];
    if (!strcmp(a, "--servers")) {
      opts.servers = v;
    } else if (!strcmp(a, "--token-file")) {
      size_t len;
      int rc = embps_read_file(v, &token, &len);
      if (rc)
        return die(1, "cannot read --token-file %s: %s", v, strerror(-rc));
      while (len && (token[len - 1] == '\n' || token[len - 1] == '\r'))
        token[--len] = 0;
      opts.token = token;
    } else if (!strcmp(a, "--timeout-ms")) {
      uint64_t ms;
      if (parse_u64(v, &ms) || ms == 0 || ms > INT32_MAX)
        return usage_error("--timeout-ms \"%s\" is not a positive number", v);
      opts.timeout_ms = (int)ms;
    } else if (!strcmp(a, "--retry-ms")) {
      int64_t ms;
      if (parse_i64(v, &ms) || ms < -1 || ms > INT32_MAX)
        return usage_error("--retry-ms \"%s\" is not a number of ms (or -1)",
                           v);
      opts.retry_ms = ms == 0 ? -1 : (int)ms;
    } else if (!strcmp(a, "--member")) {
      uint64_t idx;
      if (parse_u64(v, &idx) || idx >= UINT32_MAX)
        return usage_error("--member \"%s\" is not a server index", v);
      member = (uint32_t)idx;
    } else {
      return usage_error("unknown option %s", a);
    }
  }
  if (i >= argc) {
    fputs(usage, stderr);
    return 2;
  }
  if (!strcmp(argv[i], "bench")) {
    int rc = embps_cli_bench(&opts, argc - i - 1, argv + i + 1);
    free(token);
    return rc;
  }
  if (!strcmp(argv[i], "backup")) {
    int rc = embps_cli_backup(&opts, member, argc - i - 1, argv + i + 1);
    free(token);
    return rc;
  }
  const command_t *cmd = NULL;
  for (size_t k = 0; k < sizeof commands / sizeof *commands; k++)
    if (!strcmp(argv[i], commands[k].name))
      cmd = &commands[k];
  if (!cmd)
    return usage_error("unknown command \"%s\"", argv[i]);
  char err[512];
  embps_client_t *client;
  int rc = embps_client_create_member(&opts, member, &client, err, sizeof err);
  free(token);
  if (rc)
    return die(1, "%s", err);
  cmd_t c = {client, argc - i - 1, argv + i + 1};
  rc = cmd->run(&c);
  embps_client_destroy(client);
  return rc;
}
