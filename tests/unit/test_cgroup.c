/* test_cgroup.c - unit tests of server/cgroup.c (the memory limit of the
 * process's control group) against fake /proc/self/cgroup and
 * /sys/fs/cgroup trees (EMBPS_TEST_CGROUP_ROOT), v1, v2 and hybrid, and of
 * the buffer budget the server derives from it (config.c). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cgroup.h"
#include "server.h"

static char root[256];

/* Writes text to root/rel, making the directories on the way. */
static void put(const char *rel, const char *text) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
    *p = 0;
    mkdir(path, 0755);
    *p = '/';
  }
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static int setup(void **state) {
  (void)state;
  snprintf(root, sizeof root, "/tmp/embps-test-cgroup-XXXXXX");
  assert_non_null(mkdtemp(root));
  setenv("EMBPS_TEST_CGROUP_ROOT", root, 1);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  assert_int_equal(system(cmd), 0);
  unsetenv("EMBPS_TEST_CGROUP_ROOT");
  return 0;
}

/* The limit, and that the file named is root/want (NULL: no limit). */
static void expect(uint64_t limit, const char *want) {
  char file[512] = "";
  assert_true(embps_cgroup_memory_limit(file, sizeof file) == limit);
  if (want) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", root, want);
    assert_string_equal(file, path);
  }
}

static void test_v2_nested(void **state) {
  (void)state;
  put("proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
  put("sys/fs/cgroup/cgroup.controllers", "cpu memory\n");
  put("sys/fs/cgroup/kubepods/memory.max", "max\n");
  put("sys/fs/cgroup/kubepods/pod1/memory.max", "2147483648\n");
  put("sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "max\n");
  /* a parent's limit binds the group */
  expect(2147483648u, "sys/fs/cgroup/kubepods/pod1/memory.max");
  /* the smallest on the way up wins */
  put("sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "1073741824\n");
  expect(1073741824u, "sys/fs/cgroup/kubepods/pod1/ctr/memory.max");
  put("sys/fs/cgroup/kubepods/memory.max", "536870912\n");
  expect(536870912u, "sys/fs/cgroup/kubepods/memory.max");
}

static void test_v2_none(void **state) {
  (void)state;
  put("proc/self/cgroup", "0::/user.slice/session-1.scope\n");
  put("sys/fs/cgroup/cgroup.controllers", "cpu memory\n");
  put("sys/fs/cgroup/user.slice/memory.max", "max\n");
  put("sys/fs/cgroup/user.slice/session-1.scope/memory.max", "max\n");
  expect(0, NULL);
  /* garbage is no limit */
  put("sys/fs/cgroup/user.slice/memory.max", "lots\n");
  expect(0, NULL);
}

/* A container with a cgroup namespace sees "0::/" and its own group at
 * the mount; one without sees the host's path, absent from its mount. */
static void test_v2_container(void **state) {
  (void)state;
  put("proc/self/cgroup", "0::/\n");
  put("sys/fs/cgroup/cgroup.controllers", "cpu memory\n");
  put("sys/fs/cgroup/memory.max", "805306368\n");
  expect(805306368u, "sys/fs/cgroup/memory.max");
  put("proc/self/cgroup", "0::/system.slice/docker-0123.scope\n");
  expect(805306368u, "sys/fs/cgroup/memory.max");
}

static void test_v1(void **state) {
  (void)state;
  put("proc/self/cgroup", "12:pids:/docker/abc\n4:memory:/docker/abc\n"
                          "3:cpu,cpuacct:/docker/abc\n0::/\n");
  put("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  put("sys/fs/cgroup/memory/docker/memory.limit_in_bytes",
      "9223372036854771712\n");
  put("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
      "1073741824\n");
  expect(1073741824u, "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes");
  /* unlimited everywhere: none */
  put("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
      "9223372036854771712\n");
  expect(0, NULL);
  /* memory among other controllers on one line; "memory_x" is not it */
  put("proc/self/cgroup", "5:memory_x:/nope\n4:cpuacct,memory:/docker/abc\n");
  put("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "268435456\n");
  expect(268435456u, "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes");
}

/* Hybrid: cgroup2 at /sys/fs/cgroup/unified, memory on v1 or not. */
static void test_hybrid(void **state) {
  (void)state;
  put("proc/self/cgroup", "1:name=systemd:/a\n0::/a\n");
  put("sys/fs/cgroup/unified/cgroup.controllers", "\n");
  put("sys/fs/cgroup/unified/a/memory.max", "314572800\n");
  expect(314572800u, "sys/fs/cgroup/unified/a/memory.max");
  put("proc/self/cgroup", "4:memory:/b\n0::/a\n");
  put("sys/fs/cgroup/memory/b/memory.limit_in_bytes", "104857600\n");
  expect(104857600u, "sys/fs/cgroup/memory/b/memory.limit_in_bytes");
}

static void test_no_cgroups(void **state) {
  (void)state;
  expect(0, NULL); /* no /proc/self/cgroup at all */
  put("proc/self/cgroup", "");
  expect(0, NULL);
}

static int parse(embps_server_config_t *cfg, const char *flag,
                 const char *v) {
  char *argv[] = {"embps-server", (char *)flag, (char *)v, NULL};
  char err[256];
  return embps_server_config_parse(cfg, flag ? 3 : 1, argv, err, sizeof err);
}

/* --max-buffer-bytes follows the limit: a quarter of it. */
static void test_budget(void **state) {
  (void)state;
  put("proc/self/cgroup", "0::/\n");
  put("sys/fs/cgroup/cgroup.controllers", "memory\n");
  put("sys/fs/cgroup/memory.max", "536870912\n");
  embps_server_config_t c;
  assert_int_equal(parse(&c, NULL, NULL), 0);
  assert_int_equal(c.max_buffer_from, EMBPS_BUDGET_CGROUP);
  assert_true(c.memory_limit == 536870912u);
  assert_true(c.max_buffer_bytes == 536870912u / 4);
  /* never below one connection's budget (2 x --max-frame-bytes) */
  put("sys/fs/cgroup/memory.max", "134217728\n");
  assert_int_equal(parse(&c, NULL, NULL), 0);
  assert_true(c.max_buffer_bytes == c.max_conn_buffer_bytes);
  /* the flag wins */
  assert_int_equal(parse(&c, "--max-buffer-bytes", "3G"), 0);
  assert_int_equal(c.max_buffer_from, EMBPS_BUDGET_FLAG);
  assert_true(c.max_buffer_bytes == 3ULL << 30);
  /* a limit above RAM is no limit: a quarter of RAM, at least 1G */
  put("sys/fs/cgroup/memory.max", "1152921504606846976\n");
  assert_int_equal(parse(&c, NULL, NULL), 0);
  assert_int_equal(c.max_buffer_from, EMBPS_BUDGET_RAM);
  assert_true(c.max_buffer_bytes >= 1ULL << 30);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_v2_nested, setup, teardown),
      cmocka_unit_test_setup_teardown(test_v2_none, setup, teardown),
      cmocka_unit_test_setup_teardown(test_v2_container, setup, teardown),
      cmocka_unit_test_setup_teardown(test_v1, setup, teardown),
      cmocka_unit_test_setup_teardown(test_hybrid, setup, teardown),
      cmocka_unit_test_setup_teardown(test_no_cgroups, setup, teardown),
      cmocka_unit_test_setup_teardown(test_budget, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
