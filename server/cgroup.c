/* cgroup.c - see cgroup.h. */
#include "cgroup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* v1 writes no limit as this or more (PAGE_COUNTER_MAX pages) */
#define V1_UNLIMITED (1ULL << 62)

/* The test root ("" for the real files). */
static const char *root(void) {
  const char *r = getenv("EMBPS_TEST_CGROUP_ROOT");
  return r ? r : "";
}

static int is_dir(const char *path) {
  struct stat st;
  return !stat(path, &st) && S_ISDIR(st.st_mode);
}

/* The number in path: 0 for "max", a missing or unreadable file, or v1's
 * unlimited. */
static uint64_t read_limit(const char *path) {
  FILE *f = fopen(path, "r");
  char buf[64] = "";
  if (!f)
    return 0;
  if (!fgets(buf, sizeof buf, f))
    buf[0] = 0;
  fclose(f);
  char *end;
  unsigned long long v = strtoull(buf, &end, 10);
  if (end == buf || (*end && *end != '\n') || v >= V1_UNLIMITED)
    return 0;
  return v;
}

/* The group's path for memory in /proc/self/cgroup (v1 wins over v2 on a
 * hybrid host: the controller is where v1 lists it). 1 (v1), 2 (v2) with
 * path, or 0 when there is none. */
static int group_path(char *path, size_t len) {
  char file[1200], line[4096];
  snprintf(file, sizeof file, "%s/proc/self/cgroup", root());
  FILE *f = fopen(file, "r");
  int version = 0;
  if (!f)
    return 0;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2)
      continue;
    *c1 = *c2 = 0; /* line: the hierarchy's number */
    const char *controllers = c1 + 1, *p = c2 + 1;
    int v1 = 0;
    for (const char *c = controllers; *c;) {
      size_t n = strcspn(c, ",");
      v1 |= n == 6 && !strncmp(c, "memory", 6);
      c += n + (c[n] == ',');
    }
    if (v1 || (!version && !strcmp(line, "0") && !*controllers)) {
      snprintf(path, len, "%s", p);
      version = v1 ? 1 : 2;
      if (v1)
        break;
    }
  }
  fclose(f);
  return version;
}

uint64_t embps_cgroup_memory_limit(char *file, size_t file_len) {
  char group[2048];
  int version = group_path(group, sizeof group);
  if (!version)
    return 0;
  char mount[1200], dir[3300], at[3400];
  const char *name = version == 1 ? "memory.limit_in_bytes" : "memory.max";
  snprintf(mount, sizeof mount, "%s/sys/fs/cgroup/%s", root(),
           version == 1 ? "memory" : "");
  snprintf(at, sizeof at, "%s/cgroup.controllers", mount);
  struct stat st;
  if (version == 2 && stat(at, &st)) /* a hybrid host: v2 beside v1 */
    snprintf(mount, sizeof mount, "%s/sys/fs/cgroup/unified", root());
  size_t m = strlen(mount);
  while (m > 1 && mount[m - 1] == '/')
    mount[--m] = 0;
  snprintf(dir, sizeof dir, "%s%s", mount, group);
  for (size_t n = strlen(dir); n > m && dir[n - 1] == '/';)
    dir[--n] = 0;
  if (!is_dir(dir)) /* not this namespace's path: our group is the mount */
    snprintf(dir, sizeof dir, "%s", mount);
  uint64_t limit = 0;
  for (;;) {
    snprintf(at, sizeof at, "%s/%s", dir, name);
    uint64_t v = read_limit(at);
    if (v && (!limit || v < limit)) {
      limit = v;
      if (file)
        snprintf(file, file_len, "%s", at);
    }
    char *slash = strrchr(dir, '/');
    if (strlen(dir) <= m || !slash)
      break;
    *slash = 0;
  }
  return limit;
}
