"""Admission and eviction (issue 12) on small tables, exact semantics.

Servers run with --shards 1: capacity is per shard (ceil(max_rows /
servers / shards)), so one shard makes LRU and LFU exact over the table.
Every table uses SGD with lr 1 and a constant initial value, so a row's
value says exactly which gradients reached it.
"""
import unittest

import numpy as np

from harness import Server
import embps

INIT = 0.5
COUNTERS = ("rows_allocated", "rows_admitted", "rows_pending", "evicted_ttl",
            "evicted_capacity", "evicted_l2")
M64 = (1 << 64) - 1


def mix64(x):
    """common/route.h's embps_mix64."""
    x &= M64
    x ^= x >> 30
    x = (x * 0xbf58476d1ce4e5b9) & M64
    x ^= x >> 27
    x = (x * 0x94d049bb133111eb) & M64
    x ^= x >> 31
    return x


def admitted_by_hash(seed, id_, p):
    """server/admit.c's embps_admit_by_hash, written again from its text."""
    h = mix64((id_ & M64) ^ mix64(seed ^ 0xd6e8feb86659fd93))
    return (h >> 11) * 2.0 ** -53 < p


class Dynamic(unittest.TestCase):

    def setUp(self):
        self.server = Server("--shards", "1").start()
        self.c = embps.Client(self.server.address)

    def tearDown(self):
        self.c.close()
        self.assertEqual(self.server.stop(), 0)

    def table(self, name="t", dim=2, optimizer="sgd", **kw):
        self.c.create_table(name, dim, dynamic=True, optimizer=optimizer,
                            lr=1.0, init="constant:%g" % INIT, **kw)
        return name

    def push(self, ids, g=1.0, name="t", dim=2):
        ids = np.asarray(ids, np.int64)
        self.c.push(name, ids, np.full((ids.size, dim), g, np.float32))

    def row(self, id_, name="t"):
        return float(self.c.pull(name, np.array([id_], np.int64))[0, 0])

    def test_admission_after_n(self):
        self.table(admit_after=3)
        self.push([7], 1.0)
        self.push([7], 2.0)
        self.assertEqual(self.row(7), INIT)  # N-1 pushes: no row
        d = self.c.describe("t")
        self.assertEqual((d["rows_allocated"], d["rows_pending"],
                          d["rows_admitted"]), (0, 1, 0))
        self.push([7], 4.0)  # the Nth push makes the row, applies only it
        self.assertEqual(self.row(7), INIT - 4.0)
        d = self.c.describe("t")
        self.assertEqual((d["rows_allocated"], d["rows_pending"],
                          d["rows_admitted"]), (1, 0, 1))
        self.assertEqual(d["admit_after"], 3)
        self.push([7], 1.0)
        self.assertEqual(self.row(7), INIT - 5.0)

    def test_admission_probability_is_the_hash(self):
        seed, p = 11, 0.3
        self.table(admit_probability=p, seed=seed)
        ids = np.arange(-500, 1500, dtype=np.int64)
        self.push(ids)
        self.push(ids)  # a refused id stays refused
        got = self.c.pull("t", ids)[:, 0]
        want = np.array([INIT - 2.0 if admitted_by_hash(seed, int(i), p)
                         else INIT for i in ids], np.float32)
        self.assertTrue(np.array_equal(got, want))
        share = np.mean(got != INIT)
        self.assertTrue(0.25 < share < 0.35, share)

    def test_ttl(self):
        self.table(ttl_steps=2)
        self.push([1], 1.0)  # step 1
        self.push([2], 1.0)  # step 2
        self.assertEqual(self.row(1), INIT - 1.0)  # pushed 1 step ago
        self.push([3], 1.0)  # step 3: row 1 is 2 steps old
        self.assertEqual(self.row(1), INIT)
        self.assertEqual(self.row(2), INIT - 1.0)
        self.push([1], 4.0)  # back from its initial value
        self.assertEqual(self.row(1), INIT - 4.0)
        self.assertEqual(self.row(2), INIT)
        self.assertEqual(self.row(3), INIT - 1.0)
        d = self.c.describe("t")
        self.assertEqual(d["evicted_ttl"], 2)  # 1 (re-admitted) and 2
        self.assertEqual(d["rows_allocated"], 2)

    def import_rows(self, ids, value, name="t", dim=2):
        import os
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            np.save(os.path.join(d, "ids.npy"), np.asarray(ids, np.int64))
            np.save(os.path.join(d, "weights.npy"),
                    np.full((len(ids), dim), value, np.float32))
            self.assertEqual(self.c.import_(name, d), len(ids))

    def test_import_refreshes_ttl_and_lru(self):
        self.table(ttl_steps=2)
        self.push(range(30), 1.0)  # step 1
        self.push([100], 1.0)  # step 2
        self.push([101], 1.0)  # step 3: rows 0..29 expired, 10 reclaimed
        self.assertEqual(self.row(29), INIT)  # expired, still held
        self.assertEqual(self.c.describe("t")["rows_allocated"], 22)
        self.import_rows([29], 9.0)  # written now: fresh again
        self.assertEqual(self.row(29), 9.0)
        self.push([102], 1.0)  # step 4: 1 step old
        self.assertEqual(self.row(29), 9.0)
        self.push([103], 1.0)  # step 5: 2 steps old, expired
        self.assertEqual(self.row(29), INIT)
        self.table("lru", max_rows=2)
        self.push([1], 1.0, "lru")
        self.push([2], 1.0, "lru")
        self.import_rows([1], 9.0, "lru")  # the most recently written
        self.push([3], 1.0, "lru")  # evicts 2, the least recent
        self.assertEqual((self.row(1, "lru"), self.row(2, "lru"),
                          self.row(3, "lru")), (9.0, INIT, INIT - 1.0))

    def test_lru(self):
        self.table(max_rows=3)
        for i in (1, 2, 3):
            self.push([i])
        self.push([1])     # 2 is now the least recently pushed
        self.push([4])     # over capacity: 2 goes
        self.assertEqual(self.row(2), INIT)
        self.assertEqual([self.row(i) for i in (1, 3, 4)],
                         [INIT - 2.0, INIT - 1.0, INIT - 1.0])
        self.push([5, 2])  # two new rows: 3 and 1 go (3 is older)
        self.assertEqual([self.row(i) for i in (1, 2, 3, 4, 5)],
                         [INIT, INIT - 1.0, INIT, INIT - 1.0, INIT - 1.0])
        d = self.c.describe("t")
        self.assertEqual((d["evicted_capacity"], d["rows_allocated"],
                          d["capacity"]), (3, 3, 3))

    def test_lfu(self):
        self.table(max_rows=3, evict="lfu")
        for ids in ([1], [1], [1], [2], [2], [3], [4]):
            self.push(ids)
        # 3 (one push) goes for 4, not 2 (two) nor 1 (three)
        self.assertEqual([self.row(i) for i in (1, 2, 3, 4)],
                         [INIT - 3.0, INIT - 2.0, INIT, INIT - 1.0])
        self.push([5])     # 4 and 5 have one push each: the older, 4, goes
        self.assertEqual([self.row(i) for i in (1, 2, 4, 5)],
                         [INIT - 3.0, INIT - 2.0, INIT, INIT - 1.0])
        self.assertEqual(self.c.describe("t")["evicted_capacity"], 2)

    def test_evicted_row_readmitted_from_initial_state(self):
        # adagrad: the optimizer state must start again too
        self.table(optimizer="adagrad", max_rows=1, dim=1)
        self.push([1], 1.0, dim=1)
        self.push([1], 1.0, dim=1)
        self.push([2], 1.0, dim=1)  # evicts 1
        self.assertEqual(self.row(1), INIT)
        self.push([1], 3.0, dim=1)  # evicts 2; 1 starts from scratch
        self.table("ref", optimizer="adagrad", dim=1)
        self.push([1], 3.0, name="ref", dim=1)
        self.assertEqual(self.row(1), self.row(1, "ref"))

    def test_memory_reused(self):
        self.table(max_rows=1000, dim=8)
        rng = np.random.default_rng(3)
        used = []
        for b in range(60):
            ids = rng.integers(-2**62, 2**62, size=200)
            self.push(ids, dim=8)
            used.append(self.c.describe("t")["bytes_used"])
        d = self.c.describe("t")
        self.assertEqual(d["rows_allocated"], 1000)
        self.assertEqual(d["evicted_capacity"], 60 * 200 - 1000)
        self.assertEqual(used[20], used[-1])  # free slots are reused

    def test_admission_counts_in_sketch_bytes(self):
        self.table(admit_after=2, admit_sketch_bytes=1 << 20)
        before = self.c.describe("t")["bytes_used"]
        rng = np.random.default_rng(5)
        for _ in range(20):
            self.push(rng.integers(0, 2**62, size=500))
        d = self.c.describe("t")
        self.assertEqual(d["bytes_used"], before)  # one-off ids cost nothing
        self.assertEqual(d["rows_allocated"], d["rows_admitted"])
        self.assertLess(d["rows_admitted"], 10000 * 0.01)  # false admissions

    def test_l2_eviction_on_demand(self):
        self.table(evict_l2_below=0.9, dim=1)   # initial value 0.5
        self.push([1, 2, 3], 1.0, dim=1)        # -0.5
        self.push([2], -2.0, dim=1)             # 1.5
        self.push([3], 0.6, dim=1)              # -1.1
        self.assertEqual(self.c.evict("t"), 1)  # row 1: |-0.5| < 0.9
        self.assertEqual([self.row(i) for i in (1, 2, 3)],
                         [INIT, INIT + 1.0, np.float32(-1.1)])
        d = self.c.describe("t")
        self.assertEqual((d["evicted_l2"], d["rows_allocated"]), (1, 2))
        self.assertEqual(self.c.evict("t"), 0)
        with self.assertRaises(embps.EmbpsError) as e:
            self.c.evict("nope")
        self.assertEqual(e.exception.name, "EMBPS_ENOTABLE")

    def test_cli(self):
        import json
        import os
        import subprocess
        import harness
        cli = os.path.join(os.path.dirname(harness.SERVER_BIN), "embps")

        def run(*args):
            return subprocess.run([cli, "--servers", self.server.address]
                                  + list(args), capture_output=True,
                                  text=True, check=True).stdout
        run("create-table", "c", "--dim", "1", "--dynamic", "--admit-after",
            "2", "--admit-sketch-bytes", "65536", "--ttl-steps", "9",
            "--max-rows", "100", "--evict", "lfu", "--evict-l2-below", "0.5",
            "--admit-probability", "1", "--lr", "1")
        (t,) = json.loads(run("tables", "--json"))
        self.assertEqual((t["admit_after"], t["admit_sketch_bytes"],
                          t["ttl_steps"], t["max_rows"], t["evict"],
                          t["evict_l2_below"], t["admit_probability"],
                          t["capacity"]), (2, 65536, 9, 100, "lfu", 0.5, 1, 100))
        for _ in range(2):
            run("push", "c", "--indices", "4", "--values", "0.25")
        self.assertEqual(self.c.describe("c")["rows_admitted"], 1)
        self.assertIn("evicted 1 rows", run("evict", "c"))  # |-0.25| < 0.5
        self.assertIn("admitted 1", run("stats"))
        bad = subprocess.run([cli, "--servers", self.server.address,
                              "create-table", "d", "--dim", "1", "--dynamic",
                              "--evict", "mru"], capture_output=True)
        self.assertEqual(bad.returncode, 2)

    def test_refused_on_dense_table(self):
        with self.assertRaises(embps.EmbpsError) as e:
            self.c.create_table("d", 2, rows=10, max_rows=5)
        self.assertEqual(e.exception.name, "EMBPS_EPARAM")


class Model:
    """The semantics of table.c's admission and eviction, one shard, written
    again from the README: exact counts (a sketch this small in load does
    not collide), SGD with lr 1."""

    def __init__(self, admit_after=0, ttl=0, cap=0, lfu=False):
        self.n, self.ttl, self.cap, self.lfu = admit_after, ttl, cap, lfu
        self.rows = {}    # id -> [value, last_step, freq], recency order
        self.count = {}
        self.step = 0

    def expired(self, last, now):
        return self.ttl and now - last >= self.ttl

    def admits(self, id_):
        return self.n <= 1 or self.count.get(id_, 0) + 1 >= self.n

    def push(self, ids, grads):
        self.step += 1
        now = self.step
        for id_, g in zip(ids, grads):
            r = self.rows.get(id_)
            if r is not None and self.expired(r[1], now - 1):
                del self.rows[id_]
                if not self.admits(id_):
                    self.count[id_] = self.count.get(id_, 0) + 1
                    continue
                r = None
            if r is None:
                if not self.admits(id_):
                    self.count[id_] = self.count.get(id_, 0) + 1
                    continue
                r = [INIT, now, 0]
            else:
                del self.rows[id_]
            r[0] -= g
            r[1] = now
            r[2] += 1
            self.rows[id_] = r  # to the recent end
        budget = 8 + 2 * len(ids)
        while self.ttl and self.rows and budget:
            head = next(iter(self.rows))
            if not self.expired(self.rows[head][1], now):
                break
            del self.rows[head]
            budget -= 1
        while self.cap and len(self.rows) > self.cap:
            old = [(v[2], v[1], k) for k, v in self.rows.items()
                   if v[1] != now]
            if not old:
                break
            victim = min(old)[2] if self.lfu else next(iter(self.rows))
            if self.rows[victim][1] == now:
                break
            del self.rows[victim]

    def value(self, id_):
        r = self.rows.get(id_)
        if r is None or self.expired(r[1], self.step):
            return INIT
        return r[0]


class DynamicModel(unittest.TestCase):
    """Random pushes against the model: every row after every push."""

    def run_model(self, seed, **kw):
        lfu = kw.pop("evict", "lru") == "lfu"
        m = Model(kw.get("admit_after", 0), kw.get("ttl_steps", 0),
                  kw.get("max_rows", 0), lfu)
        rng = np.random.default_rng(seed)
        space = np.arange(-20, 20, dtype=np.int64)
        with Server("--shards", "1") as srv, embps.Client(srv.address) as c:
            c.create_table("t", 1, dynamic=True, lr=1.0,
                           init="constant:%g" % INIT,
                           evict="lfu" if lfu else "lru", **kw)
            for _ in range(250):
                ids = rng.choice(space, size=rng.integers(1, 7),
                                 replace=False)
                g = rng.integers(-3, 4, size=ids.size).astype(np.float32)
                c.push("t", ids, g.reshape(-1, 1))
                m.push([int(i) for i in ids], [float(x) for x in g])
                got = c.pull("t", space)[:, 0]
                want = np.array([m.value(int(i)) for i in space], np.float32)
                self.assertTrue(np.array_equal(got, want),
                                "step %d: %s != %s" % (m.step, got, want))
            self.assertEqual(c.describe("t")["rows_allocated"], len(m.rows))

    def test_lru_ttl_admission(self):
        self.run_model(1, admit_after=2, ttl_steps=6, max_rows=8)

    def test_lfu(self):
        self.run_model(2, max_rows=8, evict="lfu")

    def test_lfu_ttl_admission(self):
        self.run_model(3, admit_after=3, ttl_steps=9, max_rows=6, evict="lfu")

    def test_ttl_only(self):
        self.run_model(4, ttl_steps=3)


class DynamicRestart(unittest.TestCase):
    """A server with --data-dir restarted (kill -9 or SIGTERM) goes on
    exactly like a reference server that never stopped: the checkpoint
    carries recency, pushes and the sketch, the log replays the rest."""

    SPACE = np.arange(0, 3000, dtype=np.int64)
    TABLES = {"lru": dict(admit_after=3, ttl_steps=25, max_rows=400),
              "lfu": dict(admit_after=2, max_rows=300, evict="lfu",
                          optimizer="adagrad")}

    def pushes(self, rng, n):
        for _ in range(n):
            ids = np.unique((rng.zipf(1.3, size=300) - 1) % self.SPACE.size)
            g = rng.integers(-4, 5, size=(ids.size, 4)).astype(np.float32)
            yield ids.astype(np.int64), g

    def both(self, clients, batches):
        for ids, g in batches:
            for c in clients:
                for name in self.TABLES:
                    c.push(name, ids, g)

    def same(self, a, b):
        for name in self.TABLES:
            self.assertTrue(np.array_equal(a.pull(name, self.SPACE),
                                           b.pull(name, self.SPACE)), name)
            da, db = a.describe(name), b.describe(name)
            for k in COUNTERS:  # counters carried by checkpoint and log
                self.assertEqual(da[k], db[k], (name, k))

    def restart(self, kill):
        import tempfile
        rng = np.random.default_rng(7)
        with tempfile.TemporaryDirectory() as d, \
                Server("--shards", "4") as ref:
            srv = Server("--shards", "4", "--data-dir", d, "--fsync",
                         "always").start()
            try:
                cr = embps.Client(ref.address)
                cd = embps.Client(srv.address)
                for c in (cr, cd):
                    for name, kw in self.TABLES.items():
                        kw = dict(kw)
                        c.create_table(name, 4, dynamic=True, lr=0.5,
                                       optimizer=kw.pop("optimizer", "sgd"),
                                       init="uniform:0.1", seed=3, **kw)
                self.both((cr, cd), self.pushes(rng, 40))
                cd.checkpoint()
                self.both((cr, cd), self.pushes(rng, 30))
                cd.close()
                if kill:
                    srv.proc.kill()
                    srv.proc.wait()
                    srv.proc = None
                    srv.log.close()
                    srv.start()
                else:
                    self.assertEqual(srv.stop(), 0)
                    srv.start()
                cd = embps.Client(srv.address)
                self.same(cr, cd)
                self.both((cr, cd), self.pushes(rng, 40))
                self.same(cr, cd)
                d_ = cd.describe("lru")
                self.assertGreater(d_["evicted_capacity"] + d_["evicted_ttl"],
                                   0)
                cr.close()
                cd.close()
            finally:
                srv.stop()

    def test_kill_9(self):
        self.restart(True)

    def test_l2_eviction_at_checkpoint_and_replayed(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            srv = Server("--data-dir", d).start()
            try:
                with embps.Client(srv.address) as c:
                    c.create_table("t", 1, dynamic=True, lr=1.0,
                                   init="constant:0.5", evict_l2_below=0.9)
                    ids = np.arange(10, dtype=np.int64)
                    c.push("t", ids, np.ones((10, 1), np.float32))
                    c.checkpoint()  # every row is at -0.5: all go
                    self.assertEqual(c.describe("t")["evicted_l2"], 10)
                    c.push("t", ids[:4], np.full((4, 1), -1, np.float32))
                    c.push("t", ids[4:], np.ones((6, 1), np.float32))
                    self.assertEqual(c.evict("t"), 6)  # logged, replayed
                    c.push("t", ids[8:], np.ones((2, 1), np.float32))
                    want = c.pull("t", ids)
                srv.proc.kill()
                srv.proc.wait()
                srv.proc = None
                srv.log.close()
                srv.start()
                with embps.Client(srv.address) as c:
                    self.assertTrue(np.array_equal(c.pull("t", ids), want))
                    self.assertEqual(c.describe("t")["rows_allocated"], 6)
                    self.assertEqual(c.describe("t")["evicted_l2"], 16)
            finally:
                srv.stop()

    def test_sigterm(self):
        self.restart(False)


class DynamicRestartBlocks(unittest.TestCase):
    """Tables whose shards span several checkpoint blocks (1 MiB: 7,281
    rows of dim 16 with Adagrad) restart from their checkpoint (SIGTERM)
    like a server that never stopped: every row's last step and pushes are
    carried, after a shard's first block too, so TTL, LRU and LFU go on
    expiring and evicting the same rows."""

    TABLES = {"lru": dict(ttl_steps=7, max_rows=44000),
              "lfu": dict(ttl_steps=7, max_rows=44000, evict="lfu")}
    IDS = 48000  # about 18,500 rows a shard stay: 3 blocks

    def push(self, clients, s, n):
        """Push s: ids i % s == 0 of the first n, reversed for even s."""
        i = np.arange(n, dtype=np.int64)
        i = i[i % s == 0]
        if s % 2 == 0:
            i = i[::-1]
        ids = (i * 2654435761) % (1 << 40)
        g = (((i[:, None] + s + np.arange(16)) % 7 - 3) / 8).astype(
            np.float32)
        for c in clients:
            for name in self.TABLES:
                c.push(name, ids, g)

    def same(self, a, b, n):
        ids = (np.arange(n, dtype=np.int64) * 2654435761) % (1 << 40)
        for name in self.TABLES:
            self.assertTrue(np.array_equal(a.pull(name, ids),
                                           b.pull(name, ids)), name)
            da, db = a.describe(name), b.describe(name)
            for k in COUNTERS:
                self.assertEqual(da[k], db[k], (name, k))

    def test_sigterm(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d, \
                Server("--shards", "2") as ref:
            srv = Server("--shards", "2", "--data-dir", d).start()
            try:
                cr = embps.Client(ref.address)
                cd = embps.Client(srv.address)
                for c in (cr, cd):
                    for name, kw in self.TABLES.items():
                        c.create_table(name, 16, dynamic=True, lr=0.5,
                                       optimizer="adagrad",
                                       init="uniform:0.1", seed=3, **kw)
                for s in range(1, 9):
                    self.push((cr, cd), s, self.IDS)
                cd.close()
                self.assertEqual(srv.stop(), 0)  # checkpoints all of it
                srv.start()
                cd = embps.Client(srv.address)
                self.same(cr, cd, self.IDS)
                for s in range(9, 15):  # expire and evict from here on
                    self.push((cr, cd), s, self.IDS + 4000 * (s - 8))
                    self.same(cr, cd, self.IDS + 4000 * (s - 8))
                for name in self.TABLES:
                    d_ = cd.describe(name)
                    self.assertGreater(d_["evicted_ttl"], 0)
                    self.assertGreater(d_["evicted_capacity"], 0)
                cr.close()
                cd.close()
            finally:
                srv.stop()


class DynamicReshard(unittest.TestCase):
    """A restore into another --shards count keeps the admission counts:
    every shard's sketch holds groups of one sketch of the server
    (admit.h), so ids pushed N-1 times before are admitted by their Nth
    push after, and ids pushed fewer times are not beyond the sketch's
    false-admission rate."""

    N = 3

    def test_pending_counts_survive_other_shard_counts(self):
        import tempfile
        rng = np.random.default_rng(5)
        ids = rng.permutation(np.unique(rng.integers(0, 1 << 40, 61000)))
        ids = ids[:60000].astype(np.int64)
        hot, once, fresh = ids[:3000], ids[3000:30000], ids[30000:]
        with tempfile.TemporaryDirectory() as d:
            srv = Server("--shards", "4", "--data-dir", d).start()
            try:
                c = embps.Client(srv.address)
                c.create_table("t", 1, dynamic=True, lr=1.0,
                               init="constant:%g" % INIT,
                               admit_after=self.N, seed=9)
                for shards, part in (("7", hot[:1500]), ("2", hot[1500:])):
                    for _ in range(self.N - 1):
                        c.push("t", part, np.ones((part.size, 1), np.float32))
                    c.push("t", once, np.ones((once.size, 1), np.float32))
                    pending = c.describe("t")["rows_pending"]
                    c.checkpoint()
                    c.close()
                    self.assertEqual(srv.stop(), 0)
                    srv.args[1] = shards
                    srv.start()
                    c = embps.Client(srv.address)
                    d_ = c.describe("t")
                    self.assertEqual(d_["rows_pending"], pending)
                    self.assertEqual(d_["rows_allocated"], 0)
                    c.push("t", part, np.ones((part.size, 1), np.float32))
                    got = c.pull("t", part)[:, 0]
                    self.assertTrue(np.all(got == INIT - 1), shards)
                    # one-off ids pushed a second time (count 2 < N), and
                    # ids never seen: admitted only by false admission, at
                    # most (1 - e^(-L/W))^4 of them (admit.h) with L the
                    # pushes counted, W = 2^17 counters a row (1 MiB)
                    counted = (self.N - 1) * part.size + once.size
                    for ones in (once, fresh):
                        c.push("t", ones, np.ones((ones.size, 1), np.float32))
                        counted += ones.size
                        false = int(np.sum(c.pull("t", ones)[:, 0] != INIT))
                        rate = (1 - np.exp(-counted / (1 << 17))) ** 4
                        self.assertLessEqual(false, rate * ones.size,
                                             (shards, false))
                    c.drop_table("t")
                    c.create_table("t", 1, dynamic=True, lr=1.0,
                                   init="constant:%g" % INIT,
                                   admit_after=self.N, seed=9)
                c.close()
            finally:
                srv.stop()


if __name__ == "__main__":
    unittest.main()
