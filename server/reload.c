/* reload.c - embps_server_reload (server.h), the daemon's SIGHUP: the
 * settings that can change while serving are read again from their files,
 * each on its own, and the outcome is one log line.
 *   --auth-token-file   the tokens hellos are checked against (auth.h):
 *     the file's first line is the current token, a second one is also
 *     accepted during a rotation (README "Security"). Connections that
 *     said hello before keep working; the member client of
 *     --cluster-servers presents the current token from its next
 *     connection on.
 *   --log-level-file    the log level, process-wide.
 * The rest (addresses, limits, the data dir, the cluster) needs a
 * restart. */
#include <stdio.h>
#include <string.h>

#include "server.h"

int embps_server_reload(embps_server_t *srv, const char *why) {
  const embps_server_config_t *cfg = &srv->cfg;
  char said[2200] = "", err[1100];
  size_t at = 0;
  int refused = 0;
  if (cfg->token_file[0]) {
    embps_tokens_t t;
    if (embps_tokens_read(cfg->token_file, &t, err, sizeof err)) {
      refused = 1;
      at += (size_t)snprintf(said + at, sizeof said - at, "%s; the tokens "
                             "in use stay", err);
    } else {
      embps_auth_set(&srv->auth, &t);
      at += (size_t)snprintf(said + at, sizeof said - at,
                             "--auth-token-file %s: %s", cfg->token_file,
                             t.n > 1 ? "2 tokens accepted, the first "
                                       "presented to peers"
                                     : "1 token");
    }
  }
  if (cfg->log_level_file[0] && at < sizeof said) {
    embps_log_level_t level;
    const char *sep = at ? "; " : "";
    if (embps_log_read_level(cfg->log_level_file, &level, err, sizeof err)) {
      refused = 1;
      snprintf(said + at, sizeof said - at, "%s%s; the log level stays",
               sep, err);
    } else {
      embps_log_set_level(level);
      snprintf(said + at, sizeof said - at, "%s--log-level-file %s: %s", sep,
               cfg->log_level_file, embps_log_level_name(level));
    }
  }
  const char *lead = refused ? "reload refused in part: " : "reloaded ";
  if (!cfg->token_file[0] && !cfg->log_level_file[0]) {
    lead = "";
    snprintf(said, sizeof said, "nothing to reload (no --auth-token-file "
             "or --log-level-file; other settings need a restart)");
  }
  embps_log_always(refused ? EMBPS_LOG_ERROR : EMBPS_LOG_INFO, "%s: %s%s",
                   why, lead, said);
  return refused ? -1 : 0;
}
