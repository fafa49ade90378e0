#!/usr/bin/env bash
# Rewrites the seed files (seed-*) of tests/fuzz/corpus/ from gen_corpus.c:
#   tests/fuzz/gen-corpus.sh [BUILD_DIR]      (default: build)
# Files the fuzzers found (named by their hash) are left as they are.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build}"
cmake --build "$build" --target fuzz_gen_corpus >/dev/null
rm -f "$root"/tests/fuzz/corpus/*/seed-*
mkdir -p "$root/tests/fuzz/corpus"
"$build/tests/fuzz/fuzz_gen_corpus" "$root/tests/fuzz/corpus"
ls "$root"/tests/fuzz/corpus/* | grep -c seed- | sed 's/$/ seed files/'
