#!/bin/sh
# mkroot.sh ROOT PROGRAM... - the image's whole root filesystem, built in
# the Dockerfile's build stage and copied into an empty (scratch) image:
#   - each PROGRAM into /usr/bin (a library, *.so*, into /usr/lib),
#   - every shared library they load, as ldd resolves it, with the dynamic
#     loader, at the paths the loader looks for them (merged /usr: /bin,
#     /lib, /lib64 and /sbin are links into /usr, as in Debian 12),
#   - /bin/sh (dash), which runs the health check and the Kubernetes start
#     script with its builtins alone,
#   - /etc/passwd and /etc/group (root, and embps 10001:10001), an
#     nsswitch.conf (files, then DNS: the cluster's names), /tmp,
#   - /var/lib/embps (the data volume) owned by 10001, mode 0750,
#   - the Debian copyright file of each package a library comes from
#     (/usr/share/doc/PACKAGE/copyright: the licenses travel with them).
# Nothing else: no package manager, no coreutils, no setuid program, no
# compiler. Run as root (it sets owners).
set -eu
[ $# -ge 2 ] || { echo "usage: $0 ROOT PROGRAM..." >&2; exit 2; }
root=$1
shift
for d in usr/bin usr/lib usr/lib64 etc tmp var/lib/embps usr/share/doc/embps; do
  mkdir -p "$root/$d"
done
for d in bin lib lib64 sbin; do
  [ -e "$root/$d" ] || ln -s "usr/$d" "$root/$d"
done
mkdir -p "$root/usr/sbin"

# copyright FILE: the copyright file of the Debian package that has FILE
copyright() {
  pkg=$(dpkg -S "$1" 2>/dev/null || dpkg -S "$(readlink -f "$1")" 2>/dev/null ||
        dpkg -S "/usr$1" 2>/dev/null || dpkg -S "${1#/usr}" 2>/dev/null) || return 0
  pkg=${pkg%%:*}
  if [ -f "/usr/share/doc/$pkg/copyright" ] && [ ! -e "$root/usr/share/doc/$pkg" ]; then
    mkdir -p "$root/usr/share/doc/$pkg"
    cp "/usr/share/doc/$pkg/copyright" "$root/usr/share/doc/$pkg/"
  fi
}

# put FILE: FILE's content at its real path under ROOT, and FILE's own
# path (when a link on this system) as a link to it
put() {
  copyright "$1"
  real=$(readlink -f "$1")
  if [ ! -e "$root$real" ]; then
    mkdir -p "$root$(dirname "$real")"
    cp -L "$real" "$root$real"
  fi
  if [ "$1" != "$real" ] && [ ! -e "$root$1" ] && [ ! -L "$root$1" ]; then
    mkdir -p "$root$(dirname "$1")"
    ln -s "$real" "$root$1"
  fi
}

# libraries PROGRAM: every absolute path ldd prints (libraries, loader)
libraries() {
  ldd "$1" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }'
}

copyright /bin/dash
for p in "$@" /bin/dash; do
  case $p in
    *.so*) cp -P "$p" "$root/usr/lib/" ;; # the soname links too
    *) install -m 0755 "$p" "$root/usr/bin/" ;;
  esac
  for lib in $(libraries "$p"); do
    put "$lib"
  done
done
ln -sf dash "$root/usr/bin/sh"
# the loader finds /usr/lib (libembps.so) through its cache
printf '/usr/lib\n' >"$root/etc/ld.so.conf"
ldconfig -r "$root"

cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/usr/sbin/nologin
embps:x:10001:10001:embps-server:/nonexistent:/usr/sbin/nologin
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
embps:x:10001:
EOF
cat >"$root/etc/nsswitch.conf" <<'EOF'
passwd: files
group: files
hosts: files dns
EOF
chmod 1777 "$root/tmp"
chown 10001:10001 "$root/var/lib/embps"
chmod 0750 "$root/var/lib/embps"
