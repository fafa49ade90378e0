#!/usr/bin/env python3
"""test_readme.py ROOT BUILD - the README's shell and Python blocks, run as
a reader pastes them: in order, into one fresh bash (set -e), in an empty
directory that holds the sources (links to ROOT's) and `build` (BUILD),
with HOME there too and no EMBPS_* variable.

Every ```sh and ```python block of README.md and docker/README.md must be
preceded by a marker line saying whether it runs:
    <!-- readme-test: run -->
    <!-- readme-test: run python="$P/bin/python" -->   (a Python block)
    <!-- readme-test: skip: WHY -->
Two substitutions keep the run to this test's own files and ports:
127.0.0.1:7070 becomes a free port, /opt/embps a directory of the test.
Background jobs the blocks start are killed at the end. Prints
"N passed, N failed" last."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

ROOT, BUILD = sys.argv[1:3]
results = [0, 0]
MARK = re.compile(r"^<!-- readme-test: (run(?: python=\"([^\"]+)\")?|skip: (.+)) -->$")


def report(name, good, detail=""):
    results[0 if good else 1] += 1
    print(("ok - " if good else "FAIL - ") + name)
    if not good and detail:
        print("    " + detail.strip().replace("\n", "\n    "))


def blocks(path):
    """(line, lang, marker match or None, text) of each sh/python block."""
    lines = open(path).read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if lang in ("sh", "bash", "shell", "python"):
            prev = start - 1
            mark = MARK.match(lines[prev]) if prev >= 0 else None
            out.append((start + 1, lang, mark, "\n".join(lines[start + 1:j])))
        i = j + 1
    return out


def main():
    tmp = tempfile.mkdtemp(prefix="embps-readme-test.")
    work = os.path.join(tmp, "work")
    os.mkdir(work)
    for name in os.listdir(ROOT):
        if name in ("build", ".git") or name.startswith("build-"):
            continue
        if name == "client":  # pip builds client/python in place: a copy
            shutil.copytree(os.path.join(ROOT, name), os.path.join(work, name),
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            os.symlink(os.path.join(ROOT, name), os.path.join(work, name))
    os.symlink(os.path.abspath(BUILD), os.path.join(work, "build"))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    opt = os.path.join(tmp, "opt", "embps")

    # (the jobs a block leaves, e.g. the server, end with the shell)
    script = ["set -e -o pipefail", "trap 'kill $(jobs -p) 2>/dev/null' EXIT"]
    runs = skips = 0
    for doc in ("README.md", "docker/README.md"):
        for line, lang, mark, text in blocks(os.path.join(ROOT, doc)):
            where = "%s:%d" % (doc, line)
            if not mark:
                report("%s: a ```%s block says whether it runs" % (where, lang), False,
                       'precede it with <!-- readme-test: run --> or '
                       '<!-- readme-test: skip: WHY -->')
                continue
            if mark.group(3):
                skips += 1
                continue
            runs += 1
            text = text.replace("127.0.0.1:7070", "127.0.0.1:%d" % port)
            text = text.replace("/opt/embps", opt)
            script.append("echo '=== %s' >&2" % where)
            if lang == "python":
                py = mark.group(2) or "/usr/bin/python3"
                script.append('%s - <<\'__README_PY__\'\n%s\n__README_PY__' % (py, text))
            else:
                script.append(text)
    script.append("echo '=== all blocks ran' >&2")
    report("README.md, docker/README.md: every block marked (%d run, %d skipped, "
           "each with its reason)" % (runs, skips), results[1] == 0)
    path = os.path.join(tmp, "readme.sh")
    open(path, "w").write("\n".join(script) + "\n")
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOME": tmp, "LANG": "C.UTF-8", "TMPDIR": tmp,
           "PYTHONDONTWRITEBYTECODE": "1"}
    for k in ("OMP_NUM_THREADS", "TSAN_OPTIONS"):  # the sanitizer builds'
        if k in os.environ:
            env[k] = os.environ[k]
    p = subprocess.Popen(["bash", "--noprofile", "--norc", path], cwd=work, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
    finally:
        try:
            os.killpg(p.pid, signal.SIGTERM)  # the server the blocks started
        except ProcessLookupError:
            pass
    last = [l for l in out.splitlines() if l.startswith("=== ")]
    report("the runnable blocks run in order in a fresh shell",
           p.returncode == 0 and last and last[-1] == "=== all blocks ran",
           "stopped in %s (exit %s):\n%s" % (last[-1][4:] if last else "?",
                                             p.returncode, out[-3000:]))
    # what the blocks must have done
    for name, cond in (
            ("the server's tables after the blocks: emb, profiles, users, tags",
             all(re.search(r"^%s$" % t, out, re.M) for t in ("emb", "profiles", "users", "tags"))),
            ("the installed prefix has the library, pkg-config file and man pages",
             all(os.path.exists(os.path.join(opt, f)) for f in
                 ("lib/pkgconfig/embps.pc", "include/embps/embps.h",
                  "share/man/man1/embps-server.1")))):
        report(name, cond, out[-2000:])
    shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % tuple(results))
    return 0 if results[1] == 0 else 1


sys.exit(main())
