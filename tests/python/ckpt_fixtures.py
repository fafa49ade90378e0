"""Checkpoints of older formats, checked in under tests/fixtures/ckpt-vN
(see tests/fixtures/README.md): the tables and pushes that made them
(workload A, then a checkpoint), and the pushes after the restart whose
results the fixture records (workload B, then expected.npz: every row
pulled and the counters, as the server of that format left them).

Run as a script to make a fixture again with an old server binary:
  python3 ckpt_fixtures.py VERSION OLD_EMBPS_SERVER OUT_DIR
"""
import os
import shutil
import sys
import tempfile

import numpy as np

SHARDS = "4"
SPACE = np.arange(300, dtype=np.int64)
COUNTERS = ("rows_allocated", "rows_admitted", "evicted_ttl",
            "evicted_capacity", "evicted_l2")

# format 1: before checkpoints carried admission and eviction state
TABLES_V1 = {
    "dense": dict(dim=3, rows=64, optimizer="adam", dtype="f16", lr=0.1,
                  init="uniform:0.2", seed=5),
    "dyn": dict(dim=4, dynamic=True, optimizer="adagrad", lr=0.3,
                init="normal:0.1", seed=6),
    "ftrl": dict(dim=2, dynamic=True, optimizer="ftrl", dtype="bf16",
                 lr=0.2, init="uniform:0.1", seed=7),
}
# format 2: shard state (recency, pushes, the sketch's old layout)
TABLES_V2 = {
    "adm": dict(dim=2, dynamic=True, optimizer="sgd", lr=0.5,
                init="uniform:0.1", seed=3, admit_after=3, ttl_steps=30,
                max_rows=60, admit_sketch_bytes=4096),
    "lfu": dict(dim=2, dynamic=True, optimizer="adagrad", lr=0.5,
                init="uniform:0.1", seed=4, admit_after=2, max_rows=40,
                evict="lfu", admit_sketch_bytes=4096),
    "plain": dict(dim=2, rows=32, optimizer="adam", lr=0.1,
                  init="uniform:0.2", seed=8),
}
TABLES = {1: TABLES_V1, 2: TABLES_V2}


def ids_of(spec):
    return SPACE[:spec["rows"]] if "rows" in spec else SPACE


def create(c, version):
    for name, kw in TABLES[version].items():
        kw = dict(kw)
        c.create_table(name, kw.pop("dim"), **kw)


def workload(c, version, seed, n):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        raw = (rng.zipf(1.3, size=120) - 1) % SPACE.size
        for name, spec in TABLES[version].items():
            ids = np.unique(raw % ids_of(spec).size).astype(np.int64)
            g = rng.integers(-4, 5, size=(ids.size, spec["dim"]))
            c.push(name, ids, g.astype(np.float32) / 4)


def workload_a(c, version):
    create(c, version)
    workload(c, version, 1, 30)


def workload_b(c, version):
    workload(c, version, 2, 20)


def results(c, version):
    """Every row pulled and the counters, by table."""
    out = {}
    for name, spec in TABLES[version].items():
        out[name] = c.pull(name, ids_of(spec))
        d = c.describe(name)
        out[name + ".counters"] = np.array([d.get(k, 0) for k in COUNTERS],
                                           np.uint64)
    return out


def make(version, server_bin, out_dir):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import harness
    import embps
    harness.SERVER_BIN = server_bin
    with tempfile.TemporaryDirectory() as d:
        srv = harness.Server("--shards", SHARDS, "--data-dir", d).start()
        with embps.Client(srv.address) as c:
            workload_a(c, version)
            c.checkpoint()
        srv.proc.kill()  # no checkpoint at shutdown: the one above stays
        srv.proc.wait()
        srv.proc = None
        srv.log.close()
        (ckpt,) = [e for e in os.listdir(d) if e.startswith("ckpt-")]
        shutil.rmtree(out_dir, ignore_errors=True)
        shutil.copytree(os.path.join(d, ckpt), os.path.join(out_dir, ckpt))
        srv.start()  # the old server restores its own checkpoint
        with embps.Client(srv.address) as c:
            workload_b(c, version)
            np.savez(os.path.join(out_dir, "expected.npz"),
                     **results(c, version))
        srv.stop()


if __name__ == "__main__":
    make(int(sys.argv[1]), sys.argv[2], sys.argv[3])
