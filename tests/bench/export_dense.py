"""The dense export's throughput against numpy writing the same bytes.

    /usr/bin/python3 tests/bench/export_dense.py BUILD [--rows N] [--dim D]
        [--reps R] [--dir DIR] [--json]

Starts BUILD/embps-server on a free loopback port, creates a fixed-size
table of N rows (default 1,000,000) of dim D (64), pushes every row once
(a trained table: every row stored), then R times (default 5), alternating:

  export   `BUILD/embps export t --dense --out DIR/export`: pulls every row
           and writes DIR/export/weights.npy ([N, D] float32, fsynced,
           renamed) and spec.json, the CLI process timed from start to exit;
  np.save  np.save of the same [N, D] float32 array to a new file in DIR,
           then fsync and close, timed in this process.

It prints the median of each, the rows/s and MB/s of the export, and the
ratio np.save time / export time (the export's throughput as a fraction of
numpy's: 1.0 = as fast). Each run writes a new file (the previous one is
removed first), so both pay for allocating the same pages. Then, for
information, the export of two tables never pushed (N rows, init zeros and
init normal:1), whose rows the server computes at each pull: a normal
init costs a log and a cosine per element on the server.

DIR defaults to a temporary directory under /tmp (the same file system for
both writers). --json prints one JSON object instead of text.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def timed_export(cli, servers, table, out):
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run([cli, "--servers", servers, "export", table, "--dense",
                    "--out", out], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def timed_save(array, path):
    if os.path.exists(path):
        os.unlink(path)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        np.save(f, array)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rows", type=int, default=1000000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    os.environ["EMBPS_SERVER_BIN"] = os.path.join(build, "embps-server")
    os.environ.setdefault("EMBPS_LIBRARY", os.path.join(build,
                                                        "libembps.so"))
    from harness import Server
    import embps

    work = tempfile.mkdtemp(prefix="embps-bench-export-", dir=a.dir)
    cli = os.path.join(build, "embps")
    rows, dim = a.rows, a.dim
    try:
        with Server() as server:
            c = embps.Client(server.address)
            c.create_table("t", dim, rows=rows, init="normal:1", seed=1)
            chunk = max(1, (8 << 20) // (4 * dim))
            rng = np.random.default_rng(0)
            for lo in range(0, rows, chunk):
                ids = np.arange(lo, min(rows, lo + chunk))
                c.push("t", ids, rng.standard_normal(
                    (ids.size, dim)).astype(np.float32))
            out = os.path.join(work, "export")
            timed_export(cli, server.address, "t", out)  # warm-up
            array = np.load(os.path.join(out, "weights.npy"))
            if not np.array_equal(array[:1000], c.pull("t", np.arange(
                    min(rows, 1000)))):
                raise SystemExit("the export does not equal the pulls")
            exports, saves = [], []
            for _ in range(a.reps):
                exports.append(timed_export(cli, server.address, "t", out))
                saves.append(timed_save(array, os.path.join(work,
                                                            "np.npy")))
            untouched = {}
            for init in ("zeros", "normal:1"):
                name = "fresh_" + init.split(":")[0]
                c.create_table(name, dim, rows=rows, init=init, seed=2)
                untouched[init] = timed_export(cli, server.address, name,
                                               os.path.join(work, name))
            c.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    e, s = statistics.median(exports), statistics.median(saves)
    mb = rows * dim * 4 / 1e6
    result = {"rows": rows, "dim": dim, "reps": a.reps, "mb": mb,
              "export_s": e, "np_save_fsync_s": s, "ratio": s / e,
              "export_rows_per_s": rows / e, "export_mb_per_s": mb / e,
              "exports_s": exports, "np_saves_s": saves,
              "untouched_export_s": untouched}
    if a.json:
        print(json.dumps(result))
        return
    print("dense export of %d x %d float32 (%.0f MB), %d runs, medians:"
          % (rows, dim, mb, a.reps))
    print("  embps export --dense   %.3f s  (%.2f M rows/s, %.0f MB/s)"
          % (e, rows / e / 1e6, mb / e))
    print("  np.save + fsync        %.3f s  (%.0f MB/s)" % (s, mb / s))
    print("ratio np.save / export: %.2f" % (s / e))
    for init, t in untouched.items():
        print("  never-pushed table, init %-8s export %.3f s (%.2f M rows/s)"
              % (init, t, rows / t / 1e6))


if __name__ == "__main__":
    main()
