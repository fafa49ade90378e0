/* flags.h - command-line flags from a table, parsed with getopt_long.
 *
 * A program (or one CLI command) describes its flags once, in tables of
 * embps_flag_t: the name, the value's name for --help (NULL: the flag takes
 * none), a help sentence, and what the value sets: a setter and the offset
 * of the field it writes. The same tables print --help. A value follows its
 * flag (`--dim 8`) or joins it (`--dim=8`); names are matched whole, never
 * as abbreviations (a flag added later must not change what an old command
 * line means).
 *
 * A table ends with an entry whose name is NULL. Flags come in groups: a
 * table and where, in the object being filled, its offsets start (so one
 * table can fill a struct nested in several objects). Adding a flag is one
 * entry, e.g.
 *   EMBPS_FLAG_BITS("dense", opts_t, flags, EXPORT_DENSE, "write ...")
 *
 * Setters get the flag, its value (NULL for a flag without one) and the
 * group's object (the field is at f->off in it); they return 0, or -1 with
 * err holding the message: most use embps_flag_refuse(), `--dim "x" is
 * not a dimension`. A program's own setters may set several fields. */
#ifndef EMBPS_FLAGS_H
#define EMBPS_FLAGS_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct embps_flag embps_flag_t;
typedef int (*embps_flag_set_fn)(const embps_flag_t *f, const char *v,
                                 void *obj, char *err, size_t err_len);

struct embps_flag {
  const char *name; /* without the leading "--" */
  const char *arg;  /* the value in --help ("N", "HOST:PORT"); NULL: none */
  const char *help; /* one or more sentences; --help wraps them */
  embps_flag_set_fn set;
  size_t off;              /* the field set writes, from the group's object */
  size_t size;             /* sizeof that field (integers: 4 or 8 bytes) */
  long double lo, hi;      /* numbers: the accepted range */
  unsigned long long bits; /* embps_flag_set_bits: what it ORs in */
  const char *what; /* refusals: `--NAME "V" is not WHAT` (NULL: a range) */
};

/* A table of flags and where its offsets start in the object parsed into. */
typedef struct {
  const embps_flag_t *flags;
  size_t base;
} embps_flag_group_t;

#define EMBPS_FLAG_GROUPS_MAX 8

/* ---- the setters ---- */
int embps_flag_set_true(const embps_flag_t *f, const char *v, void *obj,
                        char *err, size_t err_len); /* int: 1 */
int embps_flag_set_bits(const embps_flag_t *f, const char *v, void *obj,
                        char *err, size_t err_len); /* unsigned: |= bits */
int embps_flag_set_string(const embps_flag_t *f, const char *v, void *obj,
                          char *err, size_t err_len); /* const char *: v */
/* char[size]: a copy of v, refused when it does not fit */
int embps_flag_set_text(const embps_flag_t *f, const char *v, void *obj,
                        char *err, size_t err_len);
/* Decimal integers in [lo, hi] into a field of size 4 or 8: _uint
 * unsigned, _int signed, _size unsigned with an optional K, M or G suffix
 * (binary multiples). */
int embps_flag_set_uint(const embps_flag_t *f, const char *v, void *obj,
                        char *err, size_t err_len);
int embps_flag_set_int(const embps_flag_t *f, const char *v, void *obj,
                       char *err, size_t err_len);
int embps_flag_set_size(const embps_flag_t *f, const char *v, void *obj,
                        char *err, size_t err_len);
/* A number strtod reads (1e6 too): _double into a double, in [lo, hi]
 * (NaN passes only when the range is the whole line); _count a whole
 * number in [lo, hi] into an unsigned field of size 4 or 8. */
int embps_flag_set_double(const embps_flag_t *f, const char *v, void *obj,
                          char *err, size_t err_len);
int embps_flag_set_count(const embps_flag_t *f, const char *v, void *obj,
                         char *err, size_t err_len);
/* Writes `--NAME "V" is not WHAT` (f->what, else a number in [lo, hi])
 * into err; returns -1. */
int embps_flag_refuse(const embps_flag_t *f, const char *v, char *err,
                      size_t err_len);

/* Entries for the common cases; T is the struct the group fills. */
#define EMBPS_FLAG_FIELD_(T, field) offsetof(T, field), sizeof(((T *)0)->field)
#define EMBPS_FLAG_TRUE(name, T, field, help)                                  \
  {                                                                            \
    name, NULL, help, embps_flag_set_true, EMBPS_FLAG_FIELD_(T, field), 0, 0,  \
        0, NULL                                                                \
  }
#define EMBPS_FLAG_BITS(name, T, field, bits, help)                            \
  {                                                                            \
    name, NULL, help, embps_flag_set_bits, EMBPS_FLAG_FIELD_(T, field), 0, 0,  \
        bits, NULL                                                             \
  }
#define EMBPS_FLAG_STRING(name, arg, T, field, help)                           \
  {                                                                            \
    name, arg, help, embps_flag_set_string, EMBPS_FLAG_FIELD_(T, field), 0, 0, \
        0, NULL                                                                \
  }
#define EMBPS_FLAG_TEXT(name, arg, T, field, help)                             \
  {                                                                            \
    name, arg, help, embps_flag_set_text, EMBPS_FLAG_FIELD_(T, field), 0, 0,   \
        0, NULL                                                                \
  }
/* set: embps_flag_set_uint, _int, _size, _double or _count; what may be NULL */
#define EMBPS_FLAG_NUMBER(name, arg, set, T, field, lo, hi, what, help)        \
  { name, arg, help, set, EMBPS_FLAG_FIELD_(T, field), lo, hi, 0, what }
#define EMBPS_FLAG_END                                                         \
  { NULL, NULL, NULL, NULL, 0, 0, 0, 0, 0, NULL }

/* ---- parsing ---- */
typedef struct {
  int next; /* after a parse: argv index of the first non-flag argument */
  uint64_t seen[EMBPS_FLAG_GROUPS_MAX]; /* bit i: the group's flag i */
  const embps_flag_group_t *groups;
} embps_flags_t;

/* Parses argv[1..argc) (argv[0] is the program or the command and is
 * skipped) into obj through groups (at most EMBPS_FLAG_GROUPS_MAX, ending
 * with a NULL table), stopping at the first argument that is not a flag or
 * after "--". Returns 0 (p->next: that argument), or -1 with err: an
 * unknown flag ("unknown option X", then " for CONTEXT" when context is
 * given), a missing value, a value given to a flag that takes none, or
 * what a setter refused. Uses getopt_long: not thread-safe, and it resets
 * getopt's state, so parses may follow each other. */
int embps_flags_parse(embps_flags_t *p, const embps_flag_group_t *groups,
                      void *obj, int argc, char **argv, const char *context,
                      char *err, size_t err_len);
/* 1 if the last parse into p met flag `name` (of any of its groups). */
int embps_flags_given(const embps_flags_t *p, const char *name);

/* Prints one line per flag of groups, `--name ARG`, indent spaces in, its
 * help from column col (or two spaces after a wider `--name ARG`), wrapped
 * to 79 columns, continued from column col: the layout
 * packaging/helpdoc.awk reads to make man pages and completions. */
void embps_flags_print(FILE *out, const embps_flag_group_t *groups, int indent,
                       int col);
/* Prints text from column col, or two spaces on when `used` columns
 * already written reach past col - 2, wrapped at spaces to 79 columns
 * (the next lines from col). */
void embps_flags_print_wrapped(FILE *out, const char *text, int used, int col);
#endif
