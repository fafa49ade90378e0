"""Client.stats()'s "members" (issue 22) against real coordinated servers
and a real etcd on loopback: every server of a two-member cluster names
the primary of both members with its epoch, the same list `embps stats
--json` prints; after a kill -9 of member 0's primary, its follower,
elected, is named with a higher epoch by the other member's server too;
a server without --coordinator has none. stats()'s "sync_degraded": a
member of two servers whose follower is killed says 1 once its pushes are
acknowledged again (--sync-degrade-ms).

etcd is /usr/bin/etcd (EMBPS_ETCD_BIN) on two loopback ports found by
binding port 0 and releasing them (etcd cannot take port 0); started again
on new ports if another process took one meanwhile.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.request

from harness import SERVER_BIN, Server
import embps
import numpy as np

ETCD_BIN = os.environ.get("EMBPS_ETCD_BIN", "/usr/bin/etcd")
CLI_BIN = os.environ.get("EMBPS_CLI_BIN") or os.path.join(
    os.path.dirname(os.path.abspath(SERVER_BIN)), "embps")
LEASE_MS = "2000"


def free_ports(n):
    """n loopback ports nobody listens on now (bound, then released)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Etcd:
    """One etcd member on loopback, its data in a directory of its own."""

    def start(self):
        self.dir = tempfile.mkdtemp(prefix="embps-etcd-")
        no_proxy = urllib.request.build_opener(
            urllib.request.ProxyHandler({}))
        for _ in range(3):
            client, peer = free_ports(2)
            self.url = "etcd://127.0.0.1:%d" % client
            c, p = ("http://127.0.0.1:%d" % x for x in (client, peer))
            self.log = open(os.path.join(self.dir, "etcd.log"), "wb")
            self.proc = subprocess.Popen(
                [ETCD_BIN, "--name", "py", "--data-dir",
                 os.path.join(self.dir, "data"), "--listen-client-urls", c,
                 "--advertise-client-urls", c, "--listen-peer-urls", p,
                 "--initial-advertise-peer-urls", p, "--initial-cluster",
                 "py=" + p, "--log-level", "warn"],
                stdout=subprocess.DEVNULL, stderr=self.log)
            deadline = time.time() + 30
            while time.time() < deadline and self.proc.poll() is None:
                try:
                    with no_proxy.open(c + "/health", timeout=1) as r:
                        if b'"health":"true"' in r.read():
                            return self
                except OSError:
                    pass
                time.sleep(0.05)
            self.stop()  # a port taken meanwhile: new ones
        raise RuntimeError("etcd did not start (%s)" % ETCD_BIN)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def destroy(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def poll(what, fn, timeout=30):
    """fn() until it returns something true (returned), for timeout s."""
    deadline = time.time() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.time() > deadline:
            raise AssertionError("%s: not within %d s" % (what, timeout))
        time.sleep(0.02)


@unittest.skipUnless(os.access(ETCD_BIN, os.X_OK),
                     "%s missing (apt-get install etcd-server)" % ETCD_BIN)
class Members(unittest.TestCase):

    def setUp(self):
        self.etcd = Etcd().start()
        self.servers = []

    def tearDown(self):
        result = self._outcome.result
        failed = any(t is self for t, _ in result.failures + result.errors)
        for s in self.servers:
            if failed and s.proc:  # what the servers said
                s.log.seek(0)
                print("---- %s ----\n%s" % (s.address, s.log.read().decode()))
            s.stop()
        self.etcd.destroy()

    def member(self, i, *more):
        s = Server("--coordinator", self.etcd.url, "--cluster-name", "py",
                   "--cluster-size", "2", "--cluster-index", str(i),
                   "--lease-ms", LEASE_MS, *more).start()
        self.servers.append(s)
        return s

    @staticmethod
    def members_of(client, want):
        """stats() once every server's members name want's primaries
        (a list of addresses by member), else None."""
        try:
            st = client.stats()
        except embps.EmbpsError:
            return None
        for s in st:
            if [m["primary"] for m in s["members"]] != want:
                return None
        return st

    def test_every_server_names_every_primary(self):
        # member 0 acknowledges a write once its follower has it: that
        # follower, in epoch 1, may then be elected
        sync = ("--sync-followers", "1", "--sync-timeout-ms", "30000")
        a0, a1 = self.member(0, *sync), self.member(1)
        with embps.Client([a0.address, a1.address], retry_ms=30000) as c:
            st = poll("both servers naming both primaries",
                      lambda: self.members_of(c, [a0.address, a1.address]))
            epochs = [s["epoch"] for s in st]
            self.assertTrue(all(e >= 1 for e in epochs), epochs)
            want = [{"member": i, "primary": a, "epoch": e}
                    for i, (a, e) in enumerate(zip((a0.address, a1.address),
                                                   epochs))]
            for s in st:
                self.assertEqual(s["members"], want, s["address"])
                self.assertEqual(s["role"], 0)
            # the same list as the CLI's stats --json
            out = subprocess.run(
                [CLI_BIN, "--servers", "%s,%s" % (a0.address, a1.address),
                 "stats", "--json"], capture_output=True, check=True,
                timeout=30).stdout
            self.assertEqual([s["members"] for s in json.loads(out)],
                             [want, want])

            # member 0 gets a follower, which has the table (a record of
            # epoch 1); its primary killed, it is elected
            f0 = self.member(0, *sync)
            c.create_table("t", 4, rows=16)
            a0.proc.kill()
            self.assertEqual(a0.stop(), -signal.SIGKILL)
            self.servers.remove(a0)

        def connect():  # refused while f0 still follows a0 (its lease on)
            try:
                return embps.Client([f0.address, a1.address])
            except embps.EmbpsError:
                return None
        with poll("a client of f0 and a1", connect) as c:
            st = poll("both servers naming member 0's new primary",
                      lambda: self.members_of(c, [f0.address, a1.address]))
            for s in st:
                m = s["members"]
                self.assertGreater(m[0]["epoch"], epochs[0], s["address"])
                self.assertEqual(m[1], want[1], s["address"])
            self.assertEqual(st[0]["epoch"], st[0]["members"][0]["epoch"])

    def test_sync_degraded(self):
        # a member of two servers whose follower is lost: once etcd
        # records the epoch degraded (--sync-degrade-ms), pushes are
        # acknowledged again and stats() says so
        args = ("--coordinator", self.etcd.url, "--cluster-name", "deg",
                "--lease-ms", LEASE_MS, "--sync-followers", "1",
                "--sync-timeout-ms", "30000", "--sync-degrade-ms", "500")
        p = Server(*args).start()
        self.servers.append(p)
        with embps.Client(p.address, retry_ms=30000) as c:
            poll("%s elected" % p.address,
                 lambda: c.stats()[0]["members"][:1] ==
                 [{"member": 0, "primary": p.address, "epoch": 1}])
            f = Server(*args).start()
            self.servers.append(f)
            poll("its follower in sync",
                 lambda: c.stats()[0]["followers_in_sync"] == 1)
            c.create_table("t", 4, rows=16)
            c.push("t", [3], np.ones((1, 4), dtype=np.float32))
            self.assertEqual(c.stats()[0]["sync_degraded"], 0)
            f.proc.kill()
            self.assertEqual(f.stop(), -signal.SIGKILL)
            self.servers.remove(f)
            c.push("t", [3], np.ones((1, 4), dtype=np.float32))
            st = c.stats()[0]
            self.assertEqual(st["sync_degraded"], 1)
            self.assertEqual(st["followers_in_sync"], 0)

    def test_none_without_coordinator(self):
        s = Server().start()
        self.servers.append(s)
        with embps.Client(s.address) as c:
            self.assertEqual(c.stats()[0]["members"], [])


if __name__ == "__main__":
    unittest.main()
