#!/usr/bin/env bash
# Installs the Debian packages embps needs to build, test and demo, if any
# is missing. Safe to run again: it does nothing when all are present.
set -euo pipefail

# build: compiler, cmake, libraries (libmicrohttpd: the metrics endpoint;
# libcurl: the etcd client of --coordinator); etcd-server: the failover
# tests start a real etcd on loopback;
# tests: cmocka, python3 + numpy + torch (the framework comparison suite),
# promtool (Debian prometheus) and yamllint for the operations tests, redis
# for the benchmark comparison; strace (the unit's system call audit);
# python3-pip and python3-venv (the README's install block, ops.readme);
# `make test-tsan`: clang, its sanitizer runtimes (libclang-rt-dev, only a
# Recommends of clang) and LLVM's OpenMP runtime with its Archer tool
# (libomp-dev), with which ThreadSanitizer sees the parallel apply.
PACKAGES=(gcc make cmake pkg-config libuv1-dev libprotobuf-c-dev
          protobuf-c-compiler libcmocka-dev libmicrohttpd-dev python3
          python3-numpy python3-torch python3-pip python3-venv prometheus
          yamllint strace clang libclang-rt-dev libomp-dev
          libcurl4-openssl-dev etcd-server)
# optional extras: `scripts/install-deps.sh --bench` adds these
if [[ "${1:-}" == "--bench" ]]; then
  PACKAGES+=(redis-server gnuplot-nox)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "installing: ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
