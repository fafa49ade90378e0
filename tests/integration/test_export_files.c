/* test_export_files.c - the files of export and import against a real
 * server (integration.export-files), as an attacker or an unlucky user
 * lays them out:
 *  - a directory path of 4070 bytes, whose files' paths pass PATH_MAX:
 *    export writes every file under its full name (none cut to ".../wei")
 *    and import reads them back, row for row; a path of 4200 bytes is
 *    refused by name before anything is written, by the library and by
 *    the CLI;
 *  - links planted at every temporary name and at every final name
 *    (DIR/weights.npy -> a victim): export writes neither victim, and
 *    every final name is a regular file afterwards, sparse and dense;
 *  - a failure while creating the files or at the final renames leaves no
 *    temporary file behind;
 *  - import refuses a FIFO (at once: the open does not wait for a writer),
 *    a symbolic link or a directory at weights.npy, ids.npy or spec.json,
 *    naming the file, and writes nothing. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness_fixture.h"

enum { DIM = 8, ROWS = 300 };

static char base[] = "/tmp/embps-exfiles-XXXXXX";

/* Table "t": dense, Adagrad, rows pushed at every third id. */
static void make_table(embps_client_t *c, const char *name) {
  embps_table_spec_t s = it_spec(name, DIM, ROWS, EMBPS_OPT_ADAGRAD, 0.1,
                                 EMBPS_INIT_UNIFORM, 0.5, 3);
  it_create(c, &s);
  int64_t ids[ROWS / 3];
  float g[ROWS / 3 * DIM];
  for (int i = 0; i < ROWS / 3; i++)
    ids[i] = 3 * i;
  it_fill_values(g, sizeof g / sizeof *g, 17);
  assert_rc(embps_push(c, name, ids, ROWS / 3, g, DIM, 0), c);
}

/* A directory path under base of exactly len bytes, made of nested
 * components of up to 200 bytes; every component but the last is
 * created when mk is set (the last is left to export). */
static char *long_path(size_t len, int mk) {
  char *p = it_xmalloc(len + 1);
  size_t n = (size_t)snprintf(p, len + 1, "%s/%d", base, (int)len);
  if (mk)
    assert_int_equal(mkdir(p, 0777), 0);
  while (n < len) {
    size_t left = len - n - 1, part = left < 200 ? left : 200;
    if (left - part == 1)
      part--; /* the next component gets a byte at least */
    p[n++] = '/';
    memset(p + n, 'd', part);
    n += part;
    p[n] = 0;
    if (mk && n < len)
      assert_int_equal(mkdir(p, 0777), 0);
  }
  assert_int_equal(strlen(p), len);
  return p;
}

/* Whether directory dirfd holds a name ending in ".tmp". */
static int has_tmp(int dirfd) {
  int fd = dup(dirfd);
  DIR *d = fdopendir(fd);
  assert_non_null(d);
  rewinddir(d);
  int found = 0;
  for (struct dirent *e; (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    if (n > 4 && !strcmp(e->d_name + n - 4, ".tmp"))
      found = 1;
  }
  closedir(d);
  return found;
}

/* Every row of table `a` equals the same row of table `b`. */
static void same_rows(embps_client_t *c, const char *a, const char *b) {
  float *x = it_pull_all(c, a, ROWS, DIM), *y = it_pull_all(c, b, ROWS, DIM);
  it_assert_floats(y, x, (size_t)ROWS * DIM, 0, "imported rows");
  free(x);
  free(y);
}

static void test_long_paths(void **state) {
  it_fx_t *f = *state;
  make_table(f->c, "t");
  /* 4070 bytes: DIR/adagrad_accumulator.npy.tmp is past PATH_MAX */
  char *dir = long_path(4070, 1);
  assert_true(strlen(dir) + strlen("/adagrad_accumulator.npy.tmp") >=
              PATH_MAX);
  uint64_t rows = 0;
  assert_rc(embps_export_table(f->c, "t", dir, EMBPS_EXPORT_STATE, &rows),
            f->c);
  assert_int_equal(rows, ROWS / 3);
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  assert_true(fd >= 0);
  const char *names[] = {"ids.npy", "weights.npy", "adagrad_accumulator.npy",
                         "spec.json"};
  struct stat st;
  for (size_t i = 0; i < 4; i++) {
    if (fstatat(fd, names[i], &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
      fail_msg("%s is not a file in the long directory", names[i]);
  }
  assert_false(has_tmp(fd));
  close(fd);
  /* nothing was written beside it under a cut name */
  char *parent = strdup(dir);
  *strrchr(parent, '/') = 0;
  fd = open(parent, O_RDONLY | O_DIRECTORY);
  assert_true(fd >= 0);
  assert_int_equal(fstatat(fd, "wei", &st, 0), -1);
  assert_false(has_tmp(fd));
  close(fd);
  make_table(f->c, "back");
  assert_rc(embps_import_table(f->c, "back", dir, EMBPS_IMPORT_STATE, &rows),
            f->c);
  same_rows(f->c, "t", "back");
  assert_rc(embps_export_table(f->c, "t", dir, EMBPS_EXPORT_DENSE, &rows),
            f->c);
  assert_int_equal(rows, ROWS);
  free(dir);
  free(parent);

  /* 4200 bytes: refused by name, nothing made */
  dir = long_path(4200, 0);
  assert_err(embps_export_table(f->c, "t", dir, 0, NULL), f->c,
             -ENAMETOOLONG, "path too long");
  assert_err(embps_import_table(f->c, "t", dir, 0, NULL), f->c,
             -ENAMETOOLONG, "path too long");
  char top[64];
  snprintf(top, sizeof top, "%s/4200", base);
  assert_int_equal(stat(top, &st), -1); /* not even the first component */
  it_cli_result_t r;
  const char *args[] = {"--servers", f->srv[0].addr, "export", "t", "--out",
                        dir, NULL};
  assert_int_equal(it_cli_run(&r, args), 1);
  assert_non_null(strstr(r.err, "path too long"));
  assert_true(r.err_len < 600); /* the path is not printed whole */
  it_cli_result_free(&r);
  assert_int_equal(stat(top, &st), -1);
  free(dir);
}

/* Plants a link to target at dir/name. */
static void plant(const char *dir, const char *name, const char *target) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  if (symlink(target, p))
    fail_msg("symlink %s: %s", p, strerror(errno));
}

static void check_victim(const char *path) {
  char text[32] = {0};
  FILE *v = fopen(path, "r");
  assert_non_null(v);
  assert_true(fread(text, 1, sizeof text - 1, v) > 0);
  fclose(v);
  assert_string_equal(text, "precious");
}

/* The scenario: links at DIR/NAME.tmp and at DIR/NAME, for every
 * file an export writes, sparse with state and dense. */
static void test_planted_links(void **state) {
  it_fx_t *f = *state;
  make_table(f->c, "t");
  char victim[128], victim2[128];
  snprintf(victim, sizeof victim, "%s/victim", base);
  snprintf(victim2, sizeof victim2, "%s/victim2", base);
  for (int k = 0; k < 2; k++) {
    FILE *v = fopen(k ? victim2 : victim, "w");
    fputs("precious", v);
    fclose(v);
  }
  static const char *const sparse[] = {"ids.npy", "weights.npy",
                                       "adagrad_accumulator.npy",
                                       "spec.json", NULL};
  static const char *const dense[] = {"weights.npy", "spec.json", NULL};
  for (int d = 0; d < 2; d++) {
    const char *const *names = d ? dense : sparse;
    char dir[128], tmp[96];
    snprintf(dir, sizeof dir, "%s/links-%d", base, d);
    assert_int_equal(mkdir(dir, 0777), 0);
    for (size_t i = 0; names[i]; i++) {
      snprintf(tmp, sizeof tmp, "%s.tmp", names[i]);
      plant(dir, tmp, victim);
      plant(dir, names[i], victim2);
    }
    assert_rc(embps_export_table(f->c, "t", dir,
                                 d ? EMBPS_EXPORT_DENSE : EMBPS_EXPORT_STATE,
                                 NULL), f->c);
    check_victim(victim);
    check_victim(victim2);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    struct stat st;
    for (size_t i = 0; names[i]; i++)
      if (fstatat(fd, names[i], &st, AT_SYMLINK_NOFOLLOW) ||
          !S_ISREG(st.st_mode))
        fail_msg("%s/%s is not a regular file after the export", dir,
                 names[i]);
    assert_false(has_tmp(fd));
    close(fd);
  }
}

/* Makes dir/name a directory holding a file, which neither unlink nor a
 * rename over it removes. */
static void plant_dir(const char *dir, const char *name) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  assert_int_equal(mkdir(p, 0777), 0);
  snprintf(p, sizeof p, "%s/%s/x", dir, name);
  FILE *x = fopen(p, "w");
  fclose(x);
}

static void test_failures_leave_no_tmp(void **state) {
  it_fx_t *f = *state;
  make_table(f->c, "t");
  char dir[128];
  /* weights.npy.tmp cannot be made: ids.npy.tmp, made before, is removed */
  snprintf(dir, sizeof dir, "%s/fail-create", base);
  assert_int_equal(mkdir(dir, 0777), 0);
  plant_dir(dir, "weights.npy.tmp");
  assert_err(embps_export_table(f->c, "t", dir, EMBPS_EXPORT_STATE, NULL),
             f->c, -EISDIR, "weights.npy.tmp");
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  struct stat st;
  assert_int_equal(fstatat(fd, "ids.npy.tmp", &st, AT_SYMLINK_NOFOLLOW), -1);
  assert_int_equal(fstatat(fd, "ids.npy", &st, AT_SYMLINK_NOFOLLOW), -1);
  close(fd);
  /* spec.json, renamed last, cannot be: no temporary file stays */
  for (int d = 0; d < 2; d++) {
    snprintf(dir, sizeof dir, "%s/fail-commit-%d", base, d);
    assert_int_equal(mkdir(dir, 0777), 0);
    plant_dir(dir, "spec.json");
    int rc = embps_export_table(f->c, "t", dir, d ? EMBPS_EXPORT_DENSE : 0,
                                NULL);
    assert_true(rc == -EISDIR || rc == -ENOTEMPTY);
    assert_non_null(strstr(embps_client_last_error(f->c), "spec.json.tmp"));
    fd = open(dir, O_RDONLY | O_DIRECTORY);
    assert_false(has_tmp(fd));
    close(fd);
  }
}

/* Exports "t" into base/NAME and returns its path (static). */
static const char *exported(it_fx_t *f, const char *name) {
  static char dir[128];
  snprintf(dir, sizeof dir, "%s/%s", base, name);
  assert_rc(embps_export_table(f->c, "t", dir, EMBPS_EXPORT_STATE, NULL),
            f->c);
  return dir;
}

/* Replaces dir/name by a FIFO (kind 0), a link to a copy (1) or a
 * directory (2). */
static void replace(const char *dir, const char *name, int kind) {
  char p[512], q[600];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  snprintf(q, sizeof q, "%s.real", p);
  assert_int_equal(rename(p, q), 0);
  if (kind == 0)
    assert_int_equal(mkfifo(p, 0600), 0);
  else if (kind == 1)
    assert_int_equal(symlink(q, p), 0);
  else
    assert_int_equal(mkdir(p, 0700), 0);
}

static void test_import_refuses_non_regular(void **state) {
  it_fx_t *f = *state;
  make_table(f->c, "t");
  make_table(f->c, "into");
  float *before = it_pull_all(f->c, "into", ROWS, DIM);
  static const char *const files[] = {"weights.npy", "ids.npy", "spec.json",
                                      "adagrad_accumulator.npy"};
  static const char *const kinds[] = {"(a FIFO)", "a symbolic link",
                                      "(a directory)"};
  for (size_t i = 0; i < 4; i++)
    for (int kind = 0; kind < 3; kind++) {
      char name[64];
      snprintf(name, sizeof name, "in-%zu-%d", i, kind);
      const char *dir = exported(f, name);
      replace(dir, files[i], kind);
      alarm(20); /* a hang fails here, not at ctest's timeout */
      int rc = embps_import_table(f->c, "into", dir, EMBPS_IMPORT_STATE,
                                  NULL);
      alarm(0);
      const char *msg = embps_client_last_error(f->c);
      if (rc != EMBPS_EBADFILE || !strstr(msg, files[i]) ||
          !strstr(msg, kinds[kind]))
        fail_msg("%s as %s: %s (%d): %s", files[i], kinds[kind],
                 embps_err_name(rc), rc, msg);
    }
  float *after = it_pull_all(f->c, "into", ROWS, DIM);
  assert_memory_equal(after, before, (size_t)ROWS * DIM * sizeof *after);
  free(before);
  free(after);
}

static int setup(void **state) {
  if (!mkdtemp(base))
    return -1;
  return it_fx_setup_one(state);
}

static int teardown(void **state) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
  int rc = system(cmd);
  strcpy(base, "/tmp/embps-exfiles-XXXXXX");
  return it_fx_teardown(state) || rc;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_long_paths, setup, teardown),
      cmocka_unit_test_setup_teardown(test_planted_links, setup, teardown),
      cmocka_unit_test_setup_teardown(test_failures_leave_no_tmp, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_import_refuses_non_regular, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
