/* test_token.c - the token file rule (token.c) on every owner, group and
 * mode that matters, for a server running as root and as another user;
 * reading a real file: line ends trimmed, empty and oversize files, a
 * directory, the kubelet's symlink chain, and refusals naming the fix;
 * the two tokens of a rotation (one per line; blank lines, a third token
 * and oversize ones refused), the hello check against them (auth.c) and
 * the first line clients present (common/util.c).
 * (tests/ops/test_token.sh runs a real server as a non-root user.) */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth.h"
#include "token.h"
#include "util.h"

#define SERVER_UID 10001
#define SERVER_GID 10001
#define FS_GROUP 2000 /* a pod's fsGroup: supplementary */
#define OTHER 4242

static const embps_token_reader_t server = {
    .uid = SERVER_UID, .groups = {SERVER_GID, FS_GROUP}, .n_groups = 2};
static const embps_token_reader_t root = {
    .uid = 0, .groups = {0}, .n_groups = 1};

static char err[1024];

/* check of a regular file owned by uid:gid with mode, for reader r */
static int check(const embps_token_reader_t *r, uid_t uid, gid_t gid,
                 unsigned mode) {
  struct stat st = {.st_mode = S_IFREG | mode, .st_uid = uid, .st_gid = gid};
  err[0] = 0;
  int rc = embps_token_check("/t", &st, r, err, sizeof err);
  if (rc)
    assert_non_null(strstr(err, "/t")); /* every refusal names the file */
  return rc;
}

static void test_owner_only_modes(void **state) {
  (void)state;
  assert_int_equal(check(&server, SERVER_UID, SERVER_GID, 0600), 0);
  assert_int_equal(check(&server, SERVER_UID, SERVER_GID, 0400), 0);
  assert_int_equal(check(&root, 0, 0, 0600), 0);
  assert_int_equal(check(&root, 0, 0, 0400), 0);
  /* systemd's LoadCredential= copy: the service user's, 0400 */
  assert_int_equal(check(&server, SERVER_UID, 0, 0400), 0);
}

static void test_others_never(void **state) {
  (void)state;
  const unsigned modes[] = {0644, 0604, 0444, 0640 | 04, 0602, 0601, 0666};
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
    assert_int_equal(check(&server, 0, FS_GROUP, modes[i]), -1);
    assert_non_null(strstr(err, "every user"));
    assert_non_null(strstr(err, "defaultMode: 0440")); /* the fix */
    assert_int_equal(check(&root, 0, 0, modes[i]), -1);
  }
  assert_int_equal(check(&server, 0, FS_GROUP, 0644), -1);
  assert_non_null(strstr(err, "0644 lets every user of the machine read"));
  assert_int_equal(check(&server, 0, FS_GROUP, 0602), -1);
  assert_non_null(strstr(err, "change"));
}

static void test_group_may_not_write(void **state) {
  (void)state;
  assert_int_equal(check(&server, 0, FS_GROUP, 0460), -1);
  assert_non_null(strstr(err, "lets group 2000 change the token"));
  assert_int_equal(check(&server, SERVER_UID, SERVER_GID, 0620), -1);
  assert_int_equal(check(&server, 0, FS_GROUP, 0660), -1);
}

/* The kubelet's Secret: root-owned, 0440, group the pod's fsGroup. */
static void test_group_read_for_the_servers_group(void **state) {
  (void)state;
  assert_int_equal(check(&server, 0, FS_GROUP, 0440), 0);
  assert_int_equal(check(&server, 0, SERVER_GID, 0440), 0);
  assert_int_equal(check(&server, 0, FS_GROUP, 0640), 0);
  assert_int_equal(check(&server, SERVER_UID, SERVER_GID, 0640), 0);
  assert_int_equal(check(&server, 0, FS_GROUP, 0040), 0);
  /* execute bits give nobody the token */
  assert_int_equal(check(&server, 0, FS_GROUP, 0550), 0);
}

static void test_group_read_refused(void **state) {
  (void)state;
  /* a group the server does not hold: its members are others */
  assert_int_equal(check(&server, 0, OTHER, 0440), -1);
  assert_non_null(strstr(err, "does not hold"));
  /* a third user's file: it could open it up later */
  assert_int_equal(check(&server, OTHER, FS_GROUP, 0440), -1);
  assert_non_null(strstr(err, "belongs to uid 4242"));
  /* root needs no group grant */
  assert_int_equal(check(&root, 0, 0, 0440), -1);
  assert_non_null(strstr(err, "running as root"));
  assert_int_equal(check(&root, 0, FS_GROUP, 0640), -1);
}

static void test_not_a_regular_file(void **state) {
  (void)state;
  struct stat st = {.st_mode = S_IFDIR | 0700, .st_uid = 0};
  assert_int_equal(embps_token_check("/d", &st, &root, err, sizeof err), -1);
  assert_non_null(strstr(err, "not a regular file"));
  st.st_mode = S_IFIFO | 0600;
  assert_int_equal(embps_token_check("/d", &st, &root, err, sizeof err), -1);
}

static void test_reader_self(void **state) {
  (void)state;
  embps_token_reader_t r;
  assert_int_equal(embps_token_reader_self(&r), 0);
  assert_int_equal(r.uid, geteuid());
  assert_int_equal(r.groups[0], getegid());
  assert_true(r.n_groups >= 1);
}

/* ---- real files ---- */

static char dir[] = "/tmp/embps-token-test-XXXXXX";

static void put(const char *name, const char *text, mode_t mode) {
  char p[256];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  unlink(p);
  int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  assert_int_equal(chmod(p, mode), 0);
}

/* embps_token_read of dir/name into a 256-byte token */
static int read_tok(const char *name, char *tok, size_t *len) {
  char p[256];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  err[0] = 0;
  return embps_token_read(p, tok, 256, len, err, sizeof err);
}

static void test_read_trims_line_ends(void **state) {
  (void)state;
  char tok[256];
  size_t len = 0;
  put("a", "s3cret\r\n\n", 0600);
  assert_int_equal(read_tok("a", tok, &len), 0);
  assert_int_equal(len, 6);
  assert_memory_equal(tok, "s3cret", 6);
  put("b", "in side\n", 0400);
  assert_int_equal(read_tok("b", tok, &len), 0);
  assert_int_equal(len, 7);
  assert_memory_equal(tok, "in side", 7);
}

static void test_read_refuses_bad_sizes(void **state) {
  (void)state;
  char tok[256], big[300];
  size_t len = 99;
  memcpy(tok, "unchanged", 9);
  put("empty", "\n", 0600);
  assert_int_equal(read_tok("empty", tok, &len), -1);
  assert_non_null(strstr(err, "holds none"));
  memset(big, 'x', 257);
  big[257] = 0;
  put("big", big, 0600);
  assert_int_equal(read_tok("big", tok, &len), -1);
  assert_non_null(strstr(err, "1-256 bytes"));
  big[256] = '\n'; /* exactly 256 bytes and a line end: fits */
  put("max", big, 0600);
  assert_int_equal(read_tok("max", tok, &len), 0);
  assert_int_equal(len, 256);
  assert_int_equal(read_tok("missing", tok, &len), -1);
  assert_non_null(strstr(err, "No such file"));
  assert_int_equal(read_tok(".", tok, &len), -1);
  assert_non_null(strstr(err, "not a regular file"));
}

static void test_read_refuses_open_modes(void **state) {
  (void)state;
  char tok[256];
  size_t len = 0;
  memcpy(tok, "unchanged", 9);
  put("world", "s3cret\n", 0644);
  assert_int_equal(read_tok("world", tok, &len), -1);
  assert_non_null(strstr(err, "mode 0644"));
  assert_memory_equal(tok, "unchanged", 9);
  put("gw", "s3cret\n", 0620);
  assert_int_equal(read_tok("gw", tok, &len), -1);
  assert_non_null(strstr(err, "change the token"));
  if (geteuid() == 0) { /* ctest runs as root here: no group grant */
    put("gr", "s3cret\n", 0440);
    assert_int_equal(read_tok("gr", tok, &len), -1);
    assert_non_null(strstr(err, "running as root"));
  }
}

/* The kubelet's layout: token -> ..data/token, ..data -> ..<timestamp>;
 * the mode checked is the file's at the end of the chain. */
static void test_read_follows_the_kubelet_chain(void **state) {
  (void)state;
  char p[200], q[256], tok[256];
  size_t len = 0;
  snprintf(p, sizeof p, "%s/..2026_11_25_10_00_00.123456789", dir);
  assert_int_equal(mkdir(p, 0755), 0);
  put("..2026_11_25_10_00_00.123456789/token", "kube\n", 0400);
  snprintf(q, sizeof q, "%s/..data", dir);
  assert_int_equal(symlink("..2026_11_25_10_00_00.123456789", q), 0);
  snprintf(q, sizeof q, "%s/token", dir);
  assert_int_equal(symlink("..data/token", q), 0);
  assert_int_equal(read_tok("token", tok, &len), 0);
  assert_int_equal(len, 4);
  assert_memory_equal(tok, "kube", 4);
  snprintf(q, sizeof q, "%s/token", p);
  assert_int_equal(chmod(q, 0444), 0); /* a 0644-like defaultMode */
  assert_int_equal(read_tok("token", tok, &len), -1);
  assert_non_null(strstr(err, "defaultMode: 0440"));
}

/* embps_tokens_read of dir/name */
static int read_toks(const char *name, embps_tokens_t *t) {
  char p[256];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  err[0] = 0;
  return embps_tokens_read(p, t, err, sizeof err);
}

static void test_tokens_of_a_rotation(void **state) {
  (void)state;
  embps_tokens_t t;
  put("one", "A1\n", 0600);
  assert_int_equal(read_toks("one", &t), 0);
  assert_int_equal(t.n, 1);
  assert_true(t.len[0] == 2 && !memcmp(t.token[0], "A1", 2));
  put("two", "new token\r\nold\r\n\n", 0600);
  assert_int_equal(read_toks("two", &t), 0);
  assert_int_equal(t.n, 2);
  assert_true(t.len[0] == 9 && !memcmp(t.token[0], "new token", 9));
  assert_true(t.len[1] == 3 && !memcmp(t.token[1], "old", 3));
  embps_tokens_t kept = t;
  put("blank", "new\n\nold\n", 0600);
  assert_int_equal(read_toks("blank", &t), -1);
  assert_non_null(strstr(err, "line 2: empty"));
  put("three", "a\nb\nc\n", 0600);
  assert_int_equal(read_toks("three", &t), -1);
  assert_non_null(strstr(err, "line 3: a third token"));
  char big[300];
  memset(big, 'x', sizeof big);
  memcpy(big, "ok\n", 3);
  big[3 + 257] = 0; /* 257 bytes on line 2 */
  put("long", big, 0600);
  assert_int_equal(read_toks("long", &t), -1);
  assert_non_null(strstr(err, "line 2: too long"));
  assert_memory_equal(&t, &kept, sizeof t); /* refusals change nothing */

  /* the hello check: both tokens, nothing else, exact lengths */
  embps_auth_t a;
  embps_auth_init(&a, &t);
  assert_true(embps_auth_check(&a, "new token", 9));
  assert_true(embps_auth_check(&a, "old", 3));
  assert_false(embps_auth_check(&a, "old", 2));
  assert_false(embps_auth_check(&a, "oldx", 4));
  assert_false(embps_auth_check(&a, "", 0));
  char cur[EMBPS_TOKEN_MAX + 1];
  assert_int_equal(embps_auth_current(&a, cur, sizeof cur), 9);
  assert_string_equal(cur, "new token");
  assert_int_equal(read_toks("one", &t), 0); /* the rotation ends */
  embps_auth_set(&a, &t);
  assert_false(embps_auth_check(&a, "old", 3));
  assert_true(embps_auth_check(&a, "A1", 2));
  embps_auth_close(&a);
  embps_auth_init(&a, NULL); /* no token: every hello passes */
  assert_true(embps_auth_check(&a, "anything", 8));
  assert_int_equal(embps_auth_current(&a, cur, sizeof cur), 0);
  embps_auth_close(&a);

  /* what a client presents: the first line */
  assert_int_equal(embps_token_first_line("new\r\nold\n", 9), 3);
  assert_int_equal(embps_token_first_line("only", 4), 4);
  assert_int_equal(embps_token_first_line("crlf\r\n", 6), 4);
}

static int setup(void **state) {
  (void)state;
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_owner_only_modes),
      cmocka_unit_test(test_others_never),
      cmocka_unit_test(test_group_may_not_write),
      cmocka_unit_test(test_group_read_for_the_servers_group),
      cmocka_unit_test(test_group_read_refused),
      cmocka_unit_test(test_not_a_regular_file),
      cmocka_unit_test(test_reader_self),
      cmocka_unit_test(test_read_trims_line_ends),
      cmocka_unit_test(test_read_refuses_bad_sizes),
      cmocka_unit_test(test_read_refuses_open_modes),
      cmocka_unit_test(test_read_follows_the_kubelet_chain),
      cmocka_unit_test(test_tokens_of_a_rotation),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
