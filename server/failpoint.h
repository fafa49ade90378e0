/* failpoint.h - test-only crash points. With EMBPS_FAILPOINT=<name> in the
 * environment the server SIGKILLs itself when it reaches the point of that
 * name (README, "Test-only environment switches": ckpt-before-write,
 * ckpt-mid-write, ckpt-before-rename, ckpt-after-rename,
 * ckpt-before-delete, log-after-write), so the crash tests can stop it at
 * exactly the steps a checkpoint or the log must survive. */
#ifndef EMBPS_FAILPOINT_H
#define EMBPS_FAILPOINT_H

/* Kills the process (SIGKILL, after a WARN) if name is the failpoint the
 * environment names; else returns. NULL only reads the environment: call
 * it once before any thread starts, as the variable is read once and kept
 * without a lock. */
void embps_failpoint(const char *name);
#endif
