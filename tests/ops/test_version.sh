#!/usr/bin/env bash
# test_version.sh SERVER CLI ROOT CMAKE - what --version says: the release,
# the source revision the binaries were built from (git describe of ROOT),
# the protocol, and the data directory formats the server writes and reads
# (those of server/ckpt.h and server/wal.h); and a source tree without .git
# (`git archive`, as a release tarball is made) still configures and builds,
# with the revision export-subst wrote into .revision, or "unknown"
# without it.
set -u
[ $# -eq 4 ] || { echo "usage: $0 SERVER CLI ROOT CMAKE" >&2; exit 2; }
SERVER=$1
CLI=$2
ROOT=$3
CMAKE=$4
TMP=$(mktemp -d /tmp/embps-version-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/tap.sh"

"$SERVER" --version >"$TMP/server" 2>&1
"$CLI" --version >"$TMP/cli" 2>&1
release=$(sed -n 's/^project(embps VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")
ckpt=$(sed -n 's/^#define EMBPS_CKPT_FORMAT \([0-9]*\)u/\1/p' "$ROOT/server/ckpt.h")
oldest=$(sed -n 's/^#define EMBPS_CKPT_FORMAT_OLDEST \([0-9]*\)u/\1/p' "$ROOT/server/ckpt.h")
wal=$(sed -n 's/^#define EMBPS_WAL_FORMAT \([0-9]*\)u/\1/p' "$ROOT/server/wal.h")
walold=$(sed -n 's/^#define EMBPS_WAL_FORMAT_OLDEST \([0-9]*\)u/\1/p' "$ROOT/server/wal.h")
grep -qx "embps-server $release (revision [0-9a-zA-Z._-]*)" "$TMP/server" &&
  ok "embps-server --version: release $release and a revision" ||
  bad "embps-server --version: release and revision" "$(cat "$TMP/server")"
grep -qx "data directory: checkpoint format $ckpt (reads $oldest-$ckpt), log format $wal (reads $walold-$wal)" "$TMP/server" &&
  ok "embps-server --version: checkpoint format $ckpt (reads $oldest-$ckpt), log format $wal (reads $walold-$wal)" ||
  bad "embps-server --version: the data directory formats" "$(cat "$TMP/server")"
grep -qx "protocol [0-9]*" "$TMP/server" && grep -qx "protocol [0-9]*" "$TMP/cli" &&
  ok "both say the protocol" || bad "both say the protocol" "$(cat "$TMP/server" "$TMP/cli")"
rev=$(sed -n 's/.*(revision \(.*\))$/\1/p' "$TMP/server" | head -1)
clirev=$(sed -n 's/.*(revision \(.*\))$/\1/p' "$TMP/cli" | head -1)
[ -n "$rev" ] && [ "$rev" = "$clirev" ] && ok "embps --version: the same revision ($rev)" ||
  bad "embps --version: the same revision" "server $rev, cli $clirev"

if [ -e "$ROOT/.git" ] && command -v git >/dev/null; then
  want=$(git -C "$ROOT" describe --always --abbrev=12 --match 'v[0-9]*')
  [ "${rev%-dirty}" = "$want" ] && ok "the revision is git describe's ($want)" ||
    bad "the revision is git describe's" "binary: $rev" "git describe: $want"

  # a release tarball: git archive, no .git
  mkdir "$TMP/src"
  git -C "$ROOT" archive --format=tar HEAD | tar -x -C "$TMP/src"
  head=$(git -C "$ROOT" rev-parse HEAD)
  arev=$(cat "$TMP/src/.revision")
  case $head in
    "$arev"*) ok "git archive writes the commit into .revision ($arev)" ;;
    *) bad "git archive writes the commit into .revision" "$arev, HEAD $head" ;;
  esac
  if "$CMAKE" -S "$TMP/src" -B "$TMP/b" -DCMAKE_BUILD_TYPE=Release \
       >"$TMP/out" 2>&1 &&
     "$CMAKE" --build "$TMP/b" --target embps -j2 >>"$TMP/out" 2>&1; then
    got=$("$TMP/b/embps" --version | sed -n 's/.*(revision \(.*\))$/\1/p')
    [ "$got" = "$arev" ] && ok "the archive builds; embps --version says $arev" ||
      bad "the archive's embps --version says its .revision" "$got"
  else
    bad "the archive (no .git) configures and builds" "$(tail -20 "$TMP/out")"
  fi
  rm "$TMP/src/.revision"
  "$CMAKE" -DSRC="$TMP/src" -DOUT="$TMP/rev.h" -P "$ROOT/cmake/revision.cmake"
  grep -q '"unknown"' "$TMP/rev.h" && ok "without .git or .revision: \"unknown\"" ||
    bad "without .git or .revision: \"unknown\"" "$(cat "$TMP/rev.h")"
else
  echo "# no git checkout at $ROOT: the git and archive checks are skipped"
fi
finish
