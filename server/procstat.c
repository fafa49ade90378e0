/* procstat.c - see procstat.h. /proc/self/stat: "pid (comm) state ..."
 * where comm may hold spaces and parentheses, so fields are counted from
 * the last ')': starttime is field 22, vsize 23 (bytes), rss 24 (pages),
 * numbered from 1 as proc(5) does. */
#include "procstat.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double ts_s(const struct timespec *t) {
  return (double)t->tv_sec + (double)t->tv_nsec / 1e9;
}

/* Fields 22..24 of /proc/self/stat. 0 or -1. */
static int read_stat(embps_procstat_t *p) {
  char buf[4096];
  FILE *f = fopen("/proc/self/stat", "r");
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f)
    fclose(f);
  buf[n] = 0;
  char *s = strrchr(buf, ')');
  if (!s)
    return -1;
  s++;
  unsigned long long v[25] = {0};
  for (int field = 3; field <= 24; field++) {
    while (*s == ' ')
      s++;
    if (!*s)
      return -1;
    v[field] = strtoull(s, &s, 10); /* state (field 3) reads as 0 */
    while (*s && *s != ' ')
      s++;
  }
  long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
  struct timespec now, boot;
  clock_gettime(CLOCK_REALTIME, &now);
  clock_gettime(CLOCK_BOOTTIME, &boot);
  if (tick > 0)
    p->start_time_seconds = ts_s(&now) - ts_s(&boot) + (double)v[22] / tick;
  p->virtual_bytes = v[23];
  p->resident_bytes = page > 0 ? v[24] * (uint64_t)page : 0;
  return 0;
}

int embps_procstat_read(embps_procstat_t *p) {
  memset(p, 0, sizeof *p);
  struct rusage ru;
  if (!getrusage(RUSAGE_SELF, &ru))
    p->cpu_seconds = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
                     (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
  struct rlimit rl;
  if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY)
    p->max_fds = rl.rlim_cur;
  DIR *d = opendir("/proc/self/fd");
  if (d) {
    for (struct dirent *e; (e = readdir(d));)
      p->open_fds += e->d_name[0] != '.';
    closedir(d);
    if (p->open_fds)
      p->open_fds--; /* the directory being read */
  }
  return read_stat(p);
}
