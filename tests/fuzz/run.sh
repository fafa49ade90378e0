#!/usr/bin/env bash
# Runs one libFuzzer target for a set time:
#   tests/fuzz/run.sh TARGET [SECONDS] [libFuzzer flags...]
# TARGET is frames, framer, msg, dispatch or json (default 60 s). Builds
# build-fuzz with clang (-DEMBPS_FUZZ=ON: fuzzer, address, undefined) when
# needed, starts from the committed corpus tests/fuzz/corpus/TARGET and
# keeps what it finds in build-fuzz/corpus/TARGET; a crash is written to
# build-fuzz/artifacts/ and replays with `build-fuzz/tests/fuzz/fuzz_TARGET
# FILE`. To keep an input as a regression test, copy it into
# tests/fuzz/corpus/TARGET/ (the `fuzz` ctest label replays that folder).
# BUILD_FUZZ overrides the build directory, JOBS the build parallelism.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
target="${1:?usage: tests/fuzz/run.sh frames|framer|msg|dispatch|json [SECONDS] [flags...]}"
seconds="${2:-60}"
shift $(( $# >= 2 ? 2 : 1 ))
case "$target" in
  frames|framer|msg|dispatch|json) ;;
  *) echo "unknown target $target (frames, framer, msg, dispatch, json)" >&2
     exit 2 ;;
esac
build="${BUILD_FUZZ:-$root/build-fuzz}"
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  CC=clang cmake -S "$root" -B "$build" -DEMBPS_FUZZ=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -j"${JOBS:-2}" --target "fuzz_$target" >/dev/null
mkdir -p "$build/corpus/$target" "$build/artifacts"
# libgomp/libomp threads are not what is being fuzzed: one is enough
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$build/tests/fuzz/fuzz_$target" \
  -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$build/artifacts/$target-" \
  "$@" "$build/corpus/$target" "$root/tests/fuzz/corpus/$target"
