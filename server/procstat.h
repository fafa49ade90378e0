/* procstat.h - the process's own figures for /metrics, as Prometheus's
 * client libraries name them (process_*): resident and virtual memory
 * (/proc/self/stat), CPU time (getrusage), open descriptors (the entries
 * of /proc/self/fd) and their limit (RLIMIT_NOFILE), and the start time
 * (the process's start in clock ticks after boot, placed on the wall
 * clock with CLOCK_BOOTTIME, so no file outside /proc/self is read: the
 * systemd unit's ProcSubset=pid allows no other). */
#ifndef EMBPS_PROCSTAT_H
#define EMBPS_PROCSTAT_H
#include <stdint.h>

typedef struct {
  uint64_t resident_bytes, virtual_bytes;
  uint64_t open_fds, max_fds; /* max_fds 0: no limit */
  double cpu_seconds;         /* user + system */
  double start_time_seconds;  /* Unix time */
} embps_procstat_t;

/* Fills p; a figure that cannot be read is 0. Returns 0, or -1 when
 * /proc/self/stat could not be read (memory and start time are 0). */
int embps_procstat_read(embps_procstat_t *p);
#endif
