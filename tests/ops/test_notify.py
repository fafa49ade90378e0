#!/usr/bin/env python3
"""test_notify.py SERVER CLI - the server's sd_notify messages (systemd
Type=notify) as a service manager receives them: a unix datagram socket
bound here, its name in NOTIFY_SOCKET.

- A server restoring a data dir (a table pushed and checkpointed by a first
  run) sends READY=1 once, and only after its ready line is in its log,
  after the restore's log lines, and when its tables answer; STATUS names
  the address. SIGTERM sends STOPPING=1 before the server exits 0; nothing
  else is sent.
- An abstract-namespace socket ("@name") works the same.
- A NOTIFY_SOCKET nobody listens on costs one warning, the server serves.
Prints "N passed, N failed" last."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SERVER, CLI = sys.argv[1:3]
TMP = tempfile.mkdtemp(prefix="embps-notify-test.")
results = [0, 0]


def check(name, cond, detail=""):
    results[0 if cond else 1] += 1
    print(("ok - " if cond else "FAIL - ") + name)
    if not cond and detail:
        print("    " + str(detail).replace("\n", "\n    "))


def start(log, args, env_extra):
    """The server on 127.0.0.1 port 0, its stderr in log; (proc, port file)."""
    pf = os.path.join(TMP, os.path.basename(log) + ".port")
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    env.update(env_extra)
    f = open(log, "w")
    p = subprocess.Popen([SERVER, "--listen", "127.0.0.1:0", "--port-file", pf]
                         + args, stdout=f, stderr=subprocess.STDOUT, env=env)
    return p, pf


def wait_port(p, pf, timeout=15):
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(pf) and os.path.getsize(pf):
            return "127.0.0.1:" + open(pf).read().strip()
        if p.poll() is not None:
            return None
        time.sleep(0.01)
    return None


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        return p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        return p.wait()


def cli(addr, *args):
    return subprocess.run([CLI, "--servers", addr] + list(args),
                          capture_output=True, text=True, timeout=30)


def listener(name):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(name)
    s.settimeout(20)
    return s


def recv(s, timeout=20):
    s.settimeout(timeout)
    try:
        return s.recv(4096).decode()
    except socket.timeout:
        return None


def main():
    data = os.path.join(TMP, "data")
    # a first run fills the data dir: a table, pushed, checkpointed at stop
    p, pf = start(os.path.join(TMP, "fill.log"), ["--data-dir", data], {})
    addr = wait_port(p, pf)
    ok = addr is not None
    if ok:
        ok = cli(addr, "create-table", "emb", "--dim", "4", "--rows", "100000",
                 "--optimizer", "sgd", "--lr", "1", "--init", "zeros"
                 ).returncode == 0
        ids = ",".join(str(i) for i in range(0, 3000, 7))
        vals = ",".join("-1" for _ in range(0, 3000, 7) for _ in range(4))
        ok = ok and cli(addr, "push", "emb", "--indices", ids,
                        "--values", vals).returncode == 0
    check("a first server fills a data dir", ok and stop(p) == 0,
          open(os.path.join(TMP, "fill.log")).read())

    # the restore, watched by a service manager's socket
    path = os.path.join(TMP, "notify.sock")
    s = listener(path)
    log = os.path.join(TMP, "restore.log")
    p, pf = start(log, ["--data-dir", data], {"NOTIFY_SOCKET": path})
    msg = recv(s)
    text = open(log).read()  # read the moment READY=1 came
    check("READY=1 arrives", msg is not None and "READY=1" in msg.split("\n"),
          msg)
    ready_at = text.find(" ready on 127.0.0.1:")
    restored_at = text.find("restored checkpoint")
    check("READY=1 comes after the ready line is logged", ready_at >= 0, text)
    check("... and after the restore (its log line comes first)",
          0 <= restored_at < ready_at, text)
    addr = wait_port(p, pf, 1)
    check("STATUS names the address it serves",
          msg is not None and addr is not None
          and "STATUS=serving on " + addr in msg, (msg, addr))
    r = cli(addr, "pull", "emb", "--ids", "7,14") if addr else None
    check("the restored table answers at once (rows pushed -1 at lr 1 are 1)",
          r is not None and r.returncode == 0
          and r.stdout.split() == ["7"] + ["1"] * 4 + ["14"] + ["1"] * 4,
          r and (r.stdout + r.stderr))
    check("nothing more is sent while it serves", recv(s, 0.5) is None)
    p.send_signal(signal.SIGTERM)
    msg = recv(s)
    check("SIGTERM: STOPPING=1", msg is not None
          and "STOPPING=1" in msg.split("\n"), msg)
    stop_rc = p.wait(20)
    check("then it exits 0", stop_rc == 0, open(log).read())
    check("and sends nothing else", recv(s, 0.2) is None)
    s.close()

    # the abstract namespace
    name = "embps-notify-test-%d" % os.getpid()
    s = listener("\0" + name)
    p, pf = start(os.path.join(TMP, "abstract.log"), [],
                  {"NOTIFY_SOCKET": "@" + name})
    msg = recv(s)
    check("abstract socket @%s: READY=1" % name,
          msg is not None and "READY=1" in msg.split("\n"), msg)
    check("abstract socket: STOPPING=1, exit 0",
          stop(p) == 0 and "STOPPING=1" in (recv(s) or ""))
    s.close()

    # nobody listening: a warning, and the server serves
    log = os.path.join(TMP, "nobody.log")
    p, pf = start(log, [], {"NOTIFY_SOCKET": os.path.join(TMP, "gone.sock")})
    addr = wait_port(p, pf)
    served = addr is not None and cli(addr, "tables").returncode == 0
    rc = stop(p)
    text = open(log).read()
    check("NOTIFY_SOCKET nobody listens on: the server serves, exits 0",
          served and rc == 0, text)
    check("... with one warning naming the socket",
          text.count("cannot notify the service manager") == 1
          and "gone.sock" in text, text)

    print("%d passed, %d failed" % tuple(results))
    return 0 if results[1] == 0 else 1


try:
    rc = main()
finally:
    shutil.rmtree(TMP, ignore_errors=True)
sys.exit(rc)
