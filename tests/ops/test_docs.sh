#!/usr/bin/env bash
# test_docs.sh SERVER CLI BUILD CMAKE - the man pages and bash completions
# made from --help at build time (packaging/): every flag and command of
# each program's --help is in its man page and its completion, the pages
# format without a groff warning, the completions complete what a user
# types (flags, commands, a command's flags, choices, files), and
# `cmake --install` puts pages, completions, README, LICENSE and CHANGELOG
# where man, bash-completion and the unit's Documentation= look.
set -u
[ $# -eq 4 ] || { echo "usage: $0 SERVER CLI BUILD CMAKE" >&2; exit 2; }
SERVER=$1
CLI=$2
BUILD=$3
CMAKE=$4
TMP=$(mktemp -d /tmp/embps-docs-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/tap.sh"
P=$BUILD/packaging

for prog in embps-server embps; do
  bin=$([ $prog = embps ] && echo "$CLI" || echo "$SERVER")
  "$bin" --help >"$TMP/help" 2>&1
  flags=$(grep -o -- '--[a-z0-9][a-z0-9-]*' "$TMP/help" | sort -u)
  missing=
  for f in $flags; do
    grep -qF -- "${f//-/\\-}" "$P/$prog.1" || missing="$missing $f"
  done
  [ -z "$missing" ] && ok "$prog.1 has all $(echo "$flags" | wc -l) flags of --help" ||
    bad "$prog.1 has every flag of --help" "missing:$missing"
  # the flags the page gives as syntax (synopsis, item heads), not those
  # a description mentions, are what the program takes: all complete
  flags=$(sed -n '/^\.nf/,/^\.fi/p; /^\.B /p' "$P/$prog.1" | sed 's/\\-/-/g' |
          grep -o -- '--[a-z0-9][a-z0-9-]*' | sort -u)
  missing=
  for f in $flags; do
    grep -qE -- "(^|[ \"|(])$f([ \"|)]|$)" "$P/$prog.bash" || missing="$missing $f"
  done
  [ -z "$missing" ] && ok "$prog completion has all $(echo "$flags" | wc -l) flags of its syntax" ||
    bad "$prog completion has every flag of its syntax" "missing:$missing"
  if command -v groff >/dev/null; then
    check "$prog.1: groff -man -ww without a warning" \
      sh -c "groff -man -ww -z '$P/$prog.1' 2>&1 | (! grep .)"
  fi
  grep -q "^\.TH EMBPS" "$P/$prog.1" && grep -q '^\.SH SYNOPSIS' "$P/$prog.1" &&
    ok "$prog.1 has .TH, NAME, SYNOPSIS" || bad "$prog.1 has .TH, NAME, SYNOPSIS"
done
cmds=$("$CLI" --help | awk 'NR > 2 && /^  [a-z]/ {print $1}')
missing=
for c in $cmds; do
  grep -q "^\.B ${c//-/\\\\-}" "$P/embps.1" || missing="$missing $c"
done
[ -n "$cmds" ] && [ -z "$missing" ] && ok "embps.1 describes its $(echo $cmds | wc -w) commands" ||
  bad "embps.1 describes every command" "missing:$missing"

# complete PROG WORD...: what bash completion offers for the command line
# PROG WORD... (the last word being completed), one per line, sorted
complete_line() {
  bash -c '
    source "$1"; shift
    COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
    fn=$(complete -p "$1" | sed "s/.*-F \([^ ]*\) .*/\1/")
    cd "$TMPD" && "$fn" && printf "%s\n" "${COMPREPLY[@]}" | sort' \
    _ "$P/$2.bash" "${@:2}"
}
export TMPD=$TMP/cwd
mkdir -p "$TMPD/dumps" && touch "$TMPD/token.txt"
# expect NAME WANT PROG WORD...: the offers are exactly WANT (space-separated)
expect() {
  local name=$1 want=$2
  shift 2
  local got
  got=$(complete_line "$@" | tr '\n' ' ' | sed 's/ $//')
  [ "$got" = "$want" ] && ok "completion: $name" ||
    bad "completion: $name" "want: $want" "got:  $got"
}
expect "embps-server --log<TAB>" "--log-format --log-level --log-level-file" x embps-server --log
expect "embps-server --log-level <TAB>" "debug error info warn" x embps-server --log-level ""
expect "embps-server --fsync e<TAB>" "everysec" x embps-server --fsync e
expect "embps-server --data-dir <TAB> (directories)" "dumps" x embps-server --data-dir ""
expect "embps-server --listen <TAB> (a value: nothing)" "" x embps-server --listen ""
expect "embps c<TAB>: commands" "checkpoint complete-table create-table" x embps c
expect "embps --<TAB>: global flags" "--help --member --read-from --retry-ms --servers --timeout-ms --token-file --version" x embps --
expect "embps --servers H:P cre<TAB>: past a global value" "create-table" x embps --servers h:1 cre
expect "embps create-table t --opt<TAB>" "--optimizer" x embps create-table t --opt
expect "embps create-table t --optimizer a<TAB>" "adagrad adam" x embps create-table t --optimizer a
expect "embps --token-file <TAB> (files)" "dumps token.txt" x embps --token-file ""
expect "embps tables --<TAB>" "--json" x embps tables --
expect "embps import t --<TAB>: that command's flags" "--create --from --state --with-state" x embps import t --
expect "embps bench --mode <TAB>" "both pull push" x embps bench --mode ""
expect "embps --read-from <TAB>" "follower primary" x embps --read-from ""

# the install tree
if "$CMAKE" --install "$BUILD" --prefix "$TMP/prefix" >"$TMP/out" 2>&1; then
  missing=
  for f in share/man/man1/embps-server.1 share/man/man1/embps.1 \
           share/bash-completion/completions/embps-server \
           share/bash-completion/completions/embps \
           share/doc/embps/README.md share/doc/embps/LICENSE \
           share/doc/embps/CHANGELOG.md; do
    [ -s "$TMP/prefix/$f" ] || missing="$missing $f"
  done
  [ -z "$missing" ] && ok "cmake --install: man pages, completions, README, LICENSE, CHANGELOG" ||
    bad "cmake --install: man pages, completions, README, LICENSE, CHANGELOG" "missing:$missing"
  if command -v man >/dev/null; then
    MANPATH=$TMP/prefix/share/man man -w embps-server >/dev/null 2>&1 &&
      ok "man finds embps-server(1) under the prefix" ||
      bad "man finds embps-server(1) under the prefix"
  fi
else
  bad "cmake --install" "$(tail -5 "$TMP/out")"
fi
finish
