/* signals.h - the daemon's signals before its server's loop takes them
 * (server.c installs SIGTERM, SIGINT and SIGHUP handlers on its loop once
 * it has restored its data dir and started its threads).
 *
 * Until then a signal's default action would apply: SIGTERM and SIGHUP
 * would kill the process, and as PID 1 in a container (which the kernel
 * gives no default action) SIGTERM would be ignored until the restore
 * ends, so the orchestrator's grace period runs out and it is SIGKILLed.
 * The guard takes them over for that time: SIGTERM or SIGINT ends the
 * process at once, exit status 0, with a log line: nothing has been
 * served, so there is nothing to drain or checkpoint, and a restore
 * writes nothing a kill -9 would not leave consistent (the next start
 * repairs a torn log tail or a leftover ckpt-*.tmp the same way). SIGHUP
 * is noted and the reload done once the server serves.
 *
 * The handler only writes the signal's number to a pipe; a thread of the
 * guard reads it and logs and exits from an ordinary context. */
#ifndef EMBPS_SIGNALS_H
#define EMBPS_SIGNALS_H

/* Installs the guard (main.c, before embps_server_create). 0 or -errno
 * (then the signals keep their default actions). */
int embps_signals_guard(void);
/* The server's loop has its own handlers now: stops the guard. Returns 1
 * when a SIGHUP came while it stood (reload now), else 0. */
int embps_signals_serving(void);
#endif
