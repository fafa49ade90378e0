/* test_dur_faults.c - adversarial tests of the durability contract
 * (/work/notes/DURABILITY.md, issue 8) against real embps-server processes:
 *   test_dur_faults kill          kill -9 loop during a push storm
 *   test_dur_faults kill-unsafe   negative control: must detect the loss
 *   test_dur_faults ckpt          crash at each checkpoint failpoint
 *   test_dur_faults corrupt       flipped bytes and truncations
 *   test_dur_faults diskfull SHIM ENOSPC on a small tmpfs (else the shim)
 *   test_dur_faults faultfs SHIM  ENOSPC and fsync EIO via an LD_PRELOAD shim
 *   test_dur_faults fsync SHIM    --fsync always|everysec|never, the syncs
 *                                 counted through the shim
 *   test_dur_faults fsync-lost SHIM  fsync EIO losing pages: the restart
 *   test_dur_faults frozen SHIM   fsync hanging: /readyz
 *   test_dur_faults retry         retry through a dropped connection
 *   test_dur_faults space         a push storm on a 64 MiB tmpfs with the
 *                                 default flags never fills it
 *   test_dur_faults space-full    short of the reserve, then full: the
 *                                 server recovers by itself
 * Randomness comes from a printed seed ($EMBPS_SEED to repeat a run);
 * EMBPS_LONG=1 runs the longer variants. Exit: 0 passed, 1 failed,
 * 77 skipped (the engine or the client retries are not in this build). */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "dur_scenarios.h"
#include "dur_util.h"

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "kill"))
    return dur_scenario_kill(0);
  if (!strcmp(mode, "kill-unsafe"))
    return dur_scenario_kill(1);
  if (!strcmp(mode, "ckpt"))
    return dur_scenario_ckpt();
  if (!strcmp(mode, "corrupt"))
    return dur_scenario_corrupt();
  if (!strcmp(mode, "diskfull") && argc > 2)
    return dur_scenario_diskfull(argv[2]);
  if (!strcmp(mode, "faultfs") && argc > 2)
    return dur_scenario_faultfs(argv[2]);
  if (!strcmp(mode, "fsync") && argc > 2)
    return dur_scenario_fsync(argv[2]);
  if (!strcmp(mode, "fsync-lost") && argc > 2)
    return dur_scenario_fsync_lost(argv[2]);
  if (!strcmp(mode, "frozen") && argc > 2)
    return dur_scenario_frozen(argv[2]);
  if (!strcmp(mode, "retry"))
    return dur_scenario_retry();
  if (!strcmp(mode, "space"))
    return dur_scenario_space();
  if (!strcmp(mode, "space-full"))
    return dur_scenario_space_full();
  fprintf(stderr, "usage: test_dur_faults kill|kill-unsafe|ckpt|corrupt|"
          "diskfull SHIM|faultfs SHIM|fsync SHIM|fsync-lost SHIM|"
          "frozen SHIM|retry|space|space-full\n");
  return 2;
}
