/* flags.c - command-line flags from a table (flags.h): getopt_long does the
 * scanning (a value after its flag or after '='), this file builds its
 * option array from the tables, refuses abbreviations, turns its errors
 * into messages naming the flag, calls the setters, and prints --help. */
#include "flags.h"

#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* getopt_long's val for the k-th flag of all groups: clear of any char */
#define FLAG_VAL_BASE 256
#define WRAP_COLUMNS 79
/* the field flag f sets in obj */
#define FIELD(f, obj) ((void *)((char *)(obj) + (f)->off))

/* ------------------------------------------------------------ setters */

int embps_flag_refuse(const embps_flag_t *f, const char *v, char *err,
                      size_t err_len) {
  if (f->what)
    snprintf(err, err_len, "--%s \"%s\" is not %s", f->name, v, f->what);
  else if (f->lo == floorl(f->lo) && f->hi == floorl(f->hi))
    snprintf(err, err_len, "--%s \"%s\" is not a number in [%.0Lf, %.0Lf]",
             f->name, v, f->lo, f->hi);
  else
    snprintf(err, err_len, "--%s \"%s\" is not a number in [%Lg, %Lg]", f->name,
             v, f->lo, f->hi);
  return -1;
}

int embps_flag_set_true(const embps_flag_t *f, const char *v, void *obj,
                        char *err, size_t err_len) {
  *(int *)FIELD(f, obj) = 1;
  return 0;
}

int embps_flag_set_bits(const embps_flag_t *f, const char *v, void *obj,
                        char *err, size_t err_len) {
  assert(f->size == sizeof(unsigned));
  *(unsigned *)FIELD(f, obj) |= (unsigned)f->bits;
  return 0;
}

int embps_flag_set_string(const embps_flag_t *f, const char *v, void *obj,
                          char *err, size_t err_len) {
  *(const char **)FIELD(f, obj) = v;
  return 0;
}

int embps_flag_set_text(const embps_flag_t *f, const char *v, void *obj,
                        char *err, size_t err_len) {
  size_t len = strlen(v);
  if (len >= f->size) {
    snprintf(err, err_len, "--%s \"%s\" is longer than %zu bytes", f->name, v,
             f->size - 1);
    return -1;
  }
  memcpy(FIELD(f, obj), v, len + 1);
  return 0;
}

/* Stores v into an unsigned field of f->size bytes. */
static void store_unsigned(const embps_flag_t *f, void *field, uint64_t v) {
  assert(f->size == 4 || f->size == 8);
  if (f->size == 4)
    *(uint32_t *)field = (uint32_t)v;
  else
    *(uint64_t *)field = v;
}

/* A decimal unsigned number, all of s; with suffixes, then K, M or G. */
static int parse_unsigned(const char *s, int suffixes, uint64_t *out) {
  char *end;
  errno = 0;
  if (*s < '0' || *s > '9') /* no sign, no space */
    return -1;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno)
    return -1;
  uint64_t mult = 1;
  if (suffixes && *end) {
    const char *units = "KMG", *u = strchr(units, *end & ~0x20);
    if (u && end[1] == 0) {
      mult = 1ULL << (10 * (u - units + 1));
      end++;
    }
  }
  if (*end || v > UINT64_MAX / mult)
    return -1;
  *out = v * mult;
  return 0;
}

static int set_unsigned(const embps_flag_t *f, const char *v, void *obj,
                        int suffixes, char *err, size_t err_len) {
  uint64_t n;
  if (parse_unsigned(v, suffixes, &n) || (long double)n < f->lo ||
      (long double)n > f->hi || (f->size == 4 && n > UINT32_MAX))
    return embps_flag_refuse(f, v, err, err_len);
  store_unsigned(f, FIELD(f, obj), n);
  return 0;
}

int embps_flag_set_uint(const embps_flag_t *f, const char *v, void *obj,
                        char *err, size_t err_len) {
  return set_unsigned(f, v, obj, 0, err, err_len);
}

int embps_flag_set_size(const embps_flag_t *f, const char *v, void *obj,
                        char *err, size_t err_len) {
  return set_unsigned(f, v, obj, 1, err, err_len);
}

int embps_flag_set_int(const embps_flag_t *f, const char *v, void *obj,
                       char *err, size_t err_len) {
  char *end;
  errno = 0;
  long long n = strtoll(v, &end, 10);
  if ((*v != '-' && (*v < '0' || *v > '9')) || errno || *end ||
      (long double)n < f->lo || (long double)n > f->hi)
    return embps_flag_refuse(f, v, err, err_len);
  assert(f->size == 4 || f->size == 8);
  if (f->size == 4)
    *(int32_t *)FIELD(f, obj) = (int32_t)n;
  else
    *(int64_t *)FIELD(f, obj) = n;
  return 0;
}

/* A number strtod reads, all of v (ERANGE refused). */
static int parse_real(const char *v, double *out) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end)
    return -1;
  *out = x;
  return 0;
}

int embps_flag_set_double(const embps_flag_t *f, const char *v, void *obj,
                          char *err, size_t err_len) {
  double x;
  int bounded = f->lo > -HUGE_VALL || f->hi < HUGE_VALL;
  if (parse_real(v, &x) || (bounded && !(x >= f->lo && x <= f->hi)))
    return embps_flag_refuse(f, v, err, err_len);
  *(double *)FIELD(f, obj) = x;
  return 0;
}

int embps_flag_set_count(const embps_flag_t *f, const char *v, void *obj,
                         char *err, size_t err_len) {
  double x;
  if (parse_real(v, &x) || !(x >= f->lo && x <= f->hi) || x < 0 ||
      x != floor(x) || x >= (f->size == 4 ? 0x1p32 : 0x1p64))
    return embps_flag_refuse(f, v, err, err_len);
  store_unsigned(f, FIELD(f, obj), (uint64_t)x);
  return 0;
}

/* ------------------------------------------------------------ parsing */

/* Where the k-th flag of all groups is: its group g and entry. */
static const embps_flag_t *flag_at(const embps_flag_group_t *groups, int k,
                                   int *g, int *i) {
  for (*g = 0; groups[*g].flags; (*g)++)
    for (*i = 0; groups[*g].flags[*i].name; (*i)++)
      if (k-- == 0)
        return &groups[*g].flags[*i];
  return NULL;
}

/* The flag named by token ("--name" or "--name=value"), without "--". */
static int token_names(const char *token, const char *name) {
  size_t len = strlen(name);
  return !strncmp(token, "--", 2) && !strncmp(token + 2, name, len) &&
         (token[2 + len] == 0 || token[2 + len] == '=');
}

/* Builds getopt_long's array (malloc'd): flag k has val FLAG_VAL_BASE + k.
 * *has_help: a flag is named "help" (it answers -h too). */
static struct option *build_options(const embps_flag_group_t *groups,
                                    int *has_help) {
  size_t n = 0;
  for (int g = 0; groups[g].flags; g++)
    for (int i = 0; groups[g].flags[i].name; i++)
      n++;
  struct option *o = calloc(n + 1, sizeof *o);
  if (!o)
    return NULL;
  *has_help = 0;
  n = 0;
  for (int g = 0; groups[g].flags; g++) {
    assert(g < EMBPS_FLAG_GROUPS_MAX);
    for (int i = 0; groups[g].flags[i].name; i++, n++) {
      const embps_flag_t *f = &groups[g].flags[i];
      o[n] = (struct option){f->name, f->arg ? required_argument : no_argument,
                             NULL, FLAG_VAL_BASE + (int)n};
      *has_help |= !strcmp(f->name, "help");
    }
  }
  return o;
}

/* The error for getopt's answer c ('?' or ':') on token. */
static void scan_error(const embps_flag_group_t *groups, int c,
                       const char *token, const char *context, char *err,
                       size_t err_len) {
  int g, i;
  const embps_flag_t *f = optopt >= FLAG_VAL_BASE
                              ? flag_at(groups, optopt - FLAG_VAL_BASE, &g, &i)
                              : NULL;
  if (f && token_names(token, f->name)) {
    snprintf(err, err_len,
             c == ':' ? "--%s needs a value" : "--%s takes no value", f->name);
    return;
  }
  size_t len = strcspn(token, "=");
  snprintf(err, err_len, "unknown option %.*s%s%s", (int)len, token,
           context ? " for " : "", context ? context : "");
}

int embps_flags_parse(embps_flags_t *p, const embps_flag_group_t *groups,
                      void *obj, int argc, char **argv, const char *context,
                      char *err, size_t err_len) {
  memset(p, 0, sizeof *p);
  p->groups = groups;
  int has_help;
  struct option *longopts = build_options(groups, &has_help);
  if (!longopts) {
    snprintf(err, err_len, "out of memory");
    return -1;
  }
  /* '+': stop at the first non-flag; ':': report a missing value apart */
  const char *shortopts = has_help ? "+:h" : "+:";
  optind = 0; /* glibc: start over, whatever an earlier parse left */
  opterr = 0;
  int rc = 0;
  for (;;) {
    int at = optind ? optind : 1; /* no short clusters: one token a flag */
    int c = getopt_long(argc, argv, shortopts, longopts, NULL);
    if (c == -1)
      break;
    const char *token = argv[at];
    int g, i;
    const embps_flag_t *f = NULL;
    if (c == 'h') {
      for (int k = 0; (f = flag_at(groups, k, &g, &i)); k++)
        if (!strcmp(f->name, "help"))
          break;
    } else if (c >= FLAG_VAL_BASE) {
      f = flag_at(groups, c - FLAG_VAL_BASE, &g, &i);
      if (!token_names(token, f->name)) { /* an abbreviation: unknown */
        f = NULL;
        c = '?';
        optopt = 0;
      }
    }
    if (!f) {
      scan_error(groups, c, token, context, err, err_len);
      rc = -1;
      break;
    }
    void *group_obj = (char *)obj + groups[g].base;
    if (f->set(f, f->arg ? optarg : NULL, group_obj, err, err_len)) {
      rc = -1;
      break;
    }
    p->seen[g] |= 1ULL << i;
  }
  p->next = optind;
  free(longopts);
  return rc;
}

int embps_flags_given(const embps_flags_t *p, const char *name) {
  for (int g = 0; p->groups && p->groups[g].flags; g++)
    for (int i = 0; p->groups[g].flags[i].name; i++)
      if (!strcmp(p->groups[g].flags[i].name, name) && (p->seen[g] >> i & 1))
        return 1;
  return 0;
}

/* ------------------------------------------------------------ help */

void embps_flags_print_wrapped(FILE *out, const char *text, int used, int col) {
  /* from col, or two spaces after a wider head: never on a line of its
   * own, which would read as more of the head */
  int x = used > col - 2 ? used + 2 : col, empty = 1;
  fprintf(out, "%*s", x - used, "");
  while (*text) {
    size_t word = strcspn(text, " ");
    if (!empty && x + 1 + (int)word > WRAP_COLUMNS) {
      fprintf(out, "\n%*s", col, "");
      x = col;
      empty = 1;
    } else if (!empty) {
      fputc(' ', out);
      x++;
    }
    fwrite(text, 1, word, out);
    x += (int)word;
    empty = 0;
    text += word;
    text += strspn(text, " ");
  }
  fputc('\n', out);
}

void embps_flags_print(FILE *out, const embps_flag_group_t *groups, int indent,
                       int col) {
  for (int g = 0; groups[g].flags; g++)
    for (const embps_flag_t *f = groups[g].flags; f->name; f++) {
      int used = fprintf(out, "%*s--%s%s%s", indent, "", f->name,
                         f->arg ? " " : "", f->arg ? f->arg : "");
      embps_flags_print_wrapped(out, f->help, used, col);
    }
}
