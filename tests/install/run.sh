#!/usr/bin/env bash
# run.sh CMAKE BUILD_DIR - installs the build into a temporary prefix, moves
# that prefix elsewhere (so nothing may depend on the path it was installed
# at), checks the installed headers (embps.h, nn.h, version.h) against the
# library (it exports exactly the functions they declare; version.h and
# embps.pc give one version), then builds consumer.c against it four ways:
# pkg-config shared and static, find_package(embps) shared and static, and
# once more find_package(embps) shared where pkg-config finds no
# libprotobuf-c (its static component then refused, naming the package).
# Each program runs against a real embps-server from the moved prefix.
# Prints "N passed, N failed" last.
set -u
if [ $# -ne 2 ]; then
  echo "usage: $0 CMAKE BUILD_DIR" >&2
  exit 2
fi
CMAKE=$1
BUILD=$2
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d /tmp/embps-install-test.XXXXXX)
SERVER_PID=
cleanup() {
  [ -n "$SERVER_PID" ] && kill -9 "$SERVER_PID" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
unset EMBPS_SERVERS EMBPS_TOKEN_FILE PKG_CONFIG_PATH

. "$HERE/../ops/tap.sh"

if "$CMAKE" --install "$BUILD" --prefix "$TMP/first" >"$TMP/out" 2>&1; then
  ok "cmake --install --prefix"
else
  bad "cmake --install --prefix" "$(cat "$TMP/out")"; finish
fi
mv "$TMP/first" "$TMP/moved"
P=$TMP/moved
if grep -rq "$TMP/first" "$P/lib"* 2>/dev/null; then
  bad "no file in the prefix names the install path" \
    "$(grep -rl "$TMP/first" "$P/lib"*)"
else
  ok "no file in the prefix names the install path"
fi
PC=$(dirname "$(find "$P" -name embps.pc | head -1)")
LIBDIR=$(dirname "$PC")

# The library exports exactly the functions its installed headers declare.
for h in embps.h nn.h version.h; do
  [ -f "$P/include/embps/$h" ] && ok "include/embps/$h installed" ||
    bad "include/embps/$h installed"
done
nm -D --defined-only "$LIBDIR/libembps.so" | awk '$2 == "T" {print $3}' |
  sort >"$TMP/exported"
# (a declaration starts its line, its name before the first parenthesis)
grep -h '^EMBPS_EXTERN ' "$P"/include/embps/*.h | sed 's/(.*//; s/.*[ *]//' |
  sort -u >"$TMP/declared"
if [ -s "$TMP/declared" ] && cmp -s "$TMP/exported" "$TMP/declared"; then
  ok "libembps.so exports the $(wc -l <"$TMP/declared") declared functions"
else
  bad "libembps.so exports exactly the declared functions" \
    "$(diff "$TMP/declared" "$TMP/exported")"
fi
V=$(sed -n 's/^#define EMBPS_VERSION_STRING "\(.*\)"$/\1/p' \
  "$P/include/embps/version.h")
PCV=$(PKG_CONFIG_PATH=$PC pkg-config --modversion embps)
[ -n "$V" ] && [ "$V" = "$PCV" ] && ok "version.h and embps.pc: $V" ||
  bad "version.h and embps.pc agree" "version.h '$V', embps.pc '$PCV'"

"$P/bin/embps-server" --listen 127.0.0.1:0 --port-file "$TMP/port" \
  >"$TMP/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 500); do
  [ -s "$TMP/port" ] && break
  sleep 0.02
done
if [ ! -s "$TMP/port" ]; then
  bad "installed embps-server starts" "$(cat "$TMP/server.log")"; finish
fi
ADDR=127.0.0.1:$(cat "$TMP/port")

# check NAME PROGRAM SHARED(1|0): runs PROGRAM against the server and checks
# whether it loads libembps.so
check() {
  local name=$1 prog=$2 shared=$3
  if ! "$prog" "$ADDR" "$name" >"$TMP/out" 2>&1; then
    bad "$name: runs against the server" "$(cat "$TMP/out")"; return
  fi
  if ldd "$prog" | grep -q 'libembps\.so'; then
    [ "$shared" = 1 ] && ok "$name" || bad "$name: static, yet loads libembps.so" "$(ldd "$prog")"
  else
    [ "$shared" = 0 ] && ok "$name" || bad "$name: does not load libembps.so" "$(ldd "$prog")"
  fi
}

export PKG_CONFIG_PATH=$PC
CC=${CC:-cc}
# shellcheck disable=SC2046
if $CC -o "$TMP/pc_shared" "$HERE/consumer.c" $(pkg-config --cflags --libs embps) \
     -Wl,-rpath,"$LIBDIR" >"$TMP/out" 2>&1; then
  check pc_shared "$TMP/pc_shared" 1
else
  bad "pkg-config shared: builds" "$(cat "$TMP/out")"
fi
# static: the archive by name, the rest of `pkg-config --static`
LIBS=$(pkg-config --static --libs embps | sed 's/-lembps\b/-l:libembps.a/')
# shellcheck disable=SC2086
if $CC -o "$TMP/pc_static" "$HERE/consumer.c" $(pkg-config --cflags embps) $LIBS \
     >"$TMP/out" 2>&1; then
  check pc_static "$TMP/pc_static" 0
else
  bad "pkg-config static: builds" "$(cat "$TMP/out")"
fi
unset PKG_CONFIG_PATH

if "$CMAKE" -S "$HERE" -B "$TMP/consumer" -DCMAKE_PREFIX_PATH="$P" \
     -DCMAKE_BUILD_RPATH="$LIBDIR" >"$TMP/out" 2>&1 &&
   "$CMAKE" --build "$TMP/consumer" >>"$TMP/out" 2>&1; then
  ok "find_package(embps): configures and builds"
  check cmake_shared "$TMP/consumer/consumer_shared" 1
  check cmake_static "$TMP/consumer/consumer_static" 0
else
  bad "find_package(embps): configures and builds" "$(tail -30 "$TMP/out")"
fi

# Without libprotobuf-c's development files (pkg-config searches an empty
# directory): the shared library is found, builds and runs; asking for the
# static one fails naming the package that brings them.
mkdir "$TMP/no-pc"
if PKG_CONFIG_LIBDIR=$TMP/no-pc "$CMAKE" -S "$HERE" -B "$TMP/consumer-no-pc" \
     -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_RPATH="$LIBDIR" \
     -DEMBPS_CONSUMER_SHARED_ONLY=ON >"$TMP/out" 2>&1 &&
   "$CMAKE" --build "$TMP/consumer-no-pc" >>"$TMP/out" 2>&1; then
  ok "find_package(embps) without libprotobuf-c-dev: configures and builds"
  check cmake_shared_no_pc "$TMP/consumer-no-pc/consumer_shared" 1
else
  bad "find_package(embps) without libprotobuf-c-dev: configures and builds" \
    "$(tail -30 "$TMP/out")"
fi
if PKG_CONFIG_LIBDIR=$TMP/no-pc "$CMAKE" -S "$HERE" -B "$TMP/consumer-no-pc-static" \
     -DCMAKE_PREFIX_PATH="$P" >"$TMP/out" 2>&1; then
  bad "find_package(embps COMPONENTS static) without libprotobuf-c-dev: refused"
elif grep -q "libprotobuf-c-dev" "$TMP/out"; then
  ok "find_package(embps COMPONENTS static) without libprotobuf-c-dev: refused, naming it"
else
  bad "find_package(embps COMPONENTS static) without libprotobuf-c-dev: refused, naming it" \
    "$(tail -30 "$TMP/out")"
fi
finish
