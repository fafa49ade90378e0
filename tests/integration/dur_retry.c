/* dur_retry.c - exactly once through a broken connection. A client talks to
 * the server through the fault-injecting proxy (proxy.h): it forwards a
 * push, reads the server's reply (the push is applied) and cuts the
 * client's connection instead of forwarding it; the library's retry must be
 * acknowledged as a duplicate and the witness row must change exactly once.
 * Cases: (a) the cut alone (the exactly-once table in memory); (b) with the
 * server killed -9 and restarted on its data dir between the apply and the
 * cut; (c) the server dying at EMBPS_FAILPOINT=log-after-write (record
 * written, not applied or acknowledged) and restarted: the log replay
 * applies the push and the retry is a duplicate. (b) and (c) need the
 * durability engine. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dur_scenarios.h"
#include "dur_util.h"
#include "frame.h"
#include "proxy.h"

typedef struct {
  dur_server_t srv;
  dur_workload_t wl;
  it_proxy_t *proxy;
  embps_client_t *c; /* through the proxy */
  double expected;   /* pushes that must be in the witness row */
  const char *name;
} retry_case_t;

static double witness(retry_case_t *r) {
  embps_client_t *d = dur_connect(r->srv.addr, 10000, DUR_RETRY_DEFAULT,
                                  r->name);
  double wit[2] = {-1, -1};
  if (d)
    dur_pull_wit(d, &r->wl, wit);
  embps_client_destroy(d);
  return wit[0];
}

static void check_witness(retry_case_t *r, const char *when) {
  double v = witness(r);
  if (v == r->expected)
    return;
  if (v > r->expected)
    dur_fail("%s: %s: witness row = %.0f, want %.0f: the retried push was "
             "applied %.0f more time(s) (DOUBLED)", r->name, when, v,
             r->expected, v - r->expected);
  else
    dur_fail("%s: %s: witness row = %.0f, want %.0f: %.0f acknowledged "
             "push(es) LOST", r->name, when, v, r->expected,
             r->expected - v);
}

static void push_ok(retry_case_t *r, const char *when) {
  int rc = dur_push_wit(r->c, &r->wl, 0);
  if (rc)
    dur_fail("%s: %s: push through the proxy failed: %s (%s)", r->name,
             when, embps_client_last_error(r->c), embps_err_name(rc));
  else
    r->expected++;
}

/* kill -9 and restart on the same port and data dir. */
static void kill_restart(retry_case_t *r) {
  dur_server_kill(&r->srv);
  if (dur_server_start(&r->srv, 30000)) {
    dur_fail("%s: restart between the apply and the ack failed", r->name);
    dur_server_dump_log(&r->srv);
  }
}

static void *push_thread(void *arg) {
  retry_case_t *r = arg;
  intptr_t rc = dur_push_wit(r->c, &r->wl, 0);
  return (void *)rc;
}

/* mode: 'a' cut only, 'b' kill + restart in the cut, 'c' failpoint. */
static void run_case(char mode, int engine) {
  retry_case_t r;
  memset(&r, 0, sizeof r);
  r.wl = (dur_workload_t){.n_workers = 1, .rows_per_worker = 16, .seed = 1};
  r.name = mode == 'a'   ? "(a) connection cut after the apply"
           : mode == 'b' ? "(b) server killed and restarted before the ack"
                         : "(c) server died at log-after-write";
  char data[256] = "";
  if (engine)
    dur_mkdtemp(data, sizeof data, "retry-data");
  dur_server_init(&r.srv, engine ? data : NULL);
  if (engine)
    r.srv.fsync = "always";
  if (dur_server_start(&r.srv, 20000)) {
    dur_fail("%s: start failed", r.name);
    dur_server_dump_log(&r.srv);
    goto out;
  }
  embps_client_t *d = dur_connect(r.srv.addr, 10000, DUR_RETRY_DEFAULT,
                                  r.name);
  int rc = d ? dur_create_tables(d, &r.wl) : -1;
  embps_client_destroy(d);
  if (rc)
    goto out;
  if (it_proxy_start(&r.proxy, r.srv.addr)) {
    dur_fail("%s: cannot start the proxy", r.name);
    goto out;
  }
  r.c = dur_connect(it_proxy_addr(r.proxy), 5000, 30000, r.name);
  if (!r.c)
    goto out;
  for (int i = 0; i < 3; i++)
    push_ok(&r, "before the fault");
  check_witness(&r, "before the fault");

  it_proxy_counts_t st0, st;
  it_proxy_counts(r.proxy, &st0);
  if (mode == 'a') {
    it_proxy_arm(r.proxy, IT_PROXY_DROP_REPLY, EMBPS_KIND_PUSH, 1);
    push_ok(&r, "the push whose ack is cut");
  } else {
    /* (b): the ack is cut and, while the retries find no server (new
     * connections go to a closed port), the server is killed and
     * restarted. (c): the server dies at the failpoint and restarts. */
    static char env[] = "EMBPS_FAILPOINT=log-after-write";
    char server[32];
    snprintf(server, sizeof server, "%s", r.srv.addr);
    if (mode == 'b') {
      it_proxy_set_upstream(r.proxy, "127.0.0.1:1");
      it_proxy_arm(r.proxy, IT_PROXY_DROP_REPLY, EMBPS_KIND_PUSH, 1);
    } else {
      dur_server_kill(&r.srv);
      r.srv.env[0] = env;
      if (dur_server_start(&r.srv, 20000)) {
        dur_fail("%s: armed restart failed", r.name);
        goto out;
      }
    }
    pthread_t t;
    pthread_create(&t, NULL, push_thread, &r);
    if (mode == 'b') {
      double deadline = dur_now_ms() + 15000;
      do {
        dur_sleep_ms(2);
        it_proxy_counts(r.proxy, &st);
      } while (st.faults_fired == st0.faults_fired &&
               dur_now_ms() < deadline);
      kill_restart(&r);
      it_proxy_set_upstream(r.proxy, server);
    } else {
      int code = dur_server_wait(&r.srv, 15000);
      if (code != 128 + 9) {
        dur_fail("%s: the server did not die at log-after-write (status "
                 "%d)", r.name, code);
        dur_server_kill(&r.srv);
      }
      r.srv.env[0] = NULL;
      if (dur_server_start(&r.srv, 30000)) {
        dur_fail("%s: restart failed", r.name);
        dur_server_dump_log(&r.srv);
      }
    }
    void *res;
    pthread_join(t, &res);
    if ((intptr_t)res)
      dur_fail("%s: the push was not acknowledged after the restart: %s",
               r.name, embps_client_last_error(r.c));
    else
      r.expected++;
  }
  it_proxy_counts(r.proxy, &st);
  check_witness(&r, "after the retried push");
  if (mode != 'c' && st.faults_fired != st0.faults_fired + 1)
    dur_fail("%s: the proxy cut %u acks, want 1 (the fault did not "
             "happen)", r.name, st.faults_fired - st0.faults_fired);
  if (st.push_duplicates != st0.push_duplicates + 1)
    dur_fail("%s: %u replies flagged duplicate after the fault, want "
             "exactly 1 (the retry)", r.name,
             st.push_duplicates - st0.push_duplicates);
  if (st.connections < st0.connections + 1)
    dur_fail("%s: the client did not reconnect", r.name);
  for (int i = 0; i < 2; i++)
    push_ok(&r, "after the fault");
  check_witness(&r, "after two more pushes");
  it_proxy_counts(r.proxy, &st);
  if (st.push_duplicates != st0.push_duplicates + 1)
    dur_fail("%s: %u replies flagged duplicate since the fault, want 1 "
             "(the retry): later pushes were taken for retries", r.name,
             st.push_duplicates - st0.push_duplicates);
  dur_note("%s: %.0f pushes, each applied once; %u client connections",
           r.name, r.expected, st.connections);
out:
  embps_client_destroy(r.c);
  it_proxy_stop(r.proxy);
  if (dur_failures())
    dur_server_dump_log(&r.srv);
  dur_server_cleanup(&r.srv);
  if (data[0])
    dur_rm_rf(data);
}

int dur_scenario_retry(void) {
  if (!dur_client_retries()) {
    printf("SKIP: the client library has no push retries "
           "(embps_client_options_t.retry_ms) in this build\n");
    return DUR_SKIP;
  }
  int engine = dur_engine_present();
  run_case('a', engine);
  if (engine) {
    run_case('b', 1);
    run_case('c', 1);
  } else {
    printf("cases (b) and (c) skipped: embps-server has no --data-dir in "
           "this build\n");
  }
  return dur_failures() ? 1 : 0;
}
