/* notify.h - readiness and stopping notices to a service manager (systemd
 * Type=notify, sd_notify(3)'s protocol); nothing without $NOTIFY_SOCKET. */
#ifndef EMBPS_NOTIFY_H
#define EMBPS_NOTIFY_H

/* Sends state (newline-separated KEY=VALUE assignments, e.g. "READY=1") as
 * one datagram to the socket named by $NOTIFY_SOCKET: an absolute path, or
 * "@name" in the abstract namespace. Returns 1 when sent, 0 when the
 * variable is unset or empty, or -errno (a bad address, a socket that
 * refuses); a failure is logged once as a warning and the server goes on.
 * Safe from any thread; it does not keep the socket open. */
int embps_notify(const char *state);

/* embps_notify with "READY=1" and a STATUS= line naming host:port: the
 * server listens and has restored its data directory. */
int embps_notify_ready(const char *host, int port);

/* embps_notify("STOPPING=1" and a STATUS= line): the drain has begun. */
int embps_notify_stopping(void);
#endif
