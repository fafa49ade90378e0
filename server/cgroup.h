/* cgroup.h - the memory limit of the control group the process runs in (a
 * container's limit, a systemd unit's MemoryMax=), which buffer budgets
 * follow instead of the machine's RAM (README "Security", limits).
 *
 * /proc/self/cgroup names the group: with cgroup v1 the line whose
 * controllers include "memory" (its files under /sys/fs/cgroup/memory),
 * else the v2 line "0::PATH" (under /sys/fs/cgroup, or, when that is not
 * a cgroup2 mount (no cgroup.controllers), /sys/fs/cgroup/unified: a
 * hybrid host). The limit is the smallest of
 * memory.max (v2) or memory.limit_in_bytes (v1) in that group and every
 * group above it up to the mount: a parent's limit binds its children.
 * When the group's directory is not under the mount (a container without a
 * cgroup namespace sees the host's path but has its own group mounted at
 * the root), the mount's root is read instead. "max", and v1's unlimited
 * (a page-counter maximum, 2^63 rounded down to a page), are no limit.
 *
 * EMBPS_TEST_CGROUP_ROOT=DIR (tests only) reads DIR/proc/self/cgroup and
 * DIR/sys/fs/cgroup/... instead of the real files. */
#ifndef EMBPS_CGROUP_H
#define EMBPS_CGROUP_H
#include <stddef.h>
#include <stdint.h>

/* The limit in bytes (0: none, or no cgroup information); when a limit is
 * found, file (if not NULL) gets the path of the file that set it. Any
 * thread; reads the files each time (a limit may change while running). */
uint64_t embps_cgroup_memory_limit(char *file, size_t file_len);
#endif
