/* dur_scenarios.h - the scenarios of test_dur_faults (one ctest each). Each
 * returns 0 (passed), 1 (failed: the reasons were printed) or DUR_SKIP. */
#ifndef EMBPS_DUR_SCENARIOS_H
#define EMBPS_DUR_SCENARIOS_H
int dur_scenario_kill(int unsafe);
int dur_scenario_ckpt(void);
int dur_scenario_corrupt(void);
int dur_scenario_diskfull(const char *shim);
int dur_scenario_faultfs(const char *shim);
int dur_scenario_fsync(const char *shim);
int dur_scenario_fsync_lost(const char *shim);
int dur_scenario_frozen(const char *shim);
int dur_scenario_retry(void);
int dur_scenario_space(void);
int dur_scenario_space_full(void);
#endif
