"""The endless stream (issue 12): one-off ids without end, plus a hot set
pushed again and again, through a table with --max-rows.

 - resident memory of the server is flat after warm-up (within 5%),
 - the hot set stays materialised and keeps training: its rows equal those
   of a reference table without any policy that got only the hot pushes,
 - no push is refused, on a server whose --max-memory the stream would
   pass many times over;
and the contrast: the same stream into a table without a capacity on the
same kind of server gets EMBPS_ELIMIT (what --max-memory alone does).

Default sizes fit a 2-core CI in well under a minute: 3M one-off ids, a hot
set of 20k, --max-rows 200k. EMBPS_LONG=1 runs the issue's sizes: 50M
one-off ids, a hot set of 100k, --max-rows 1M.
"""
import os
import unittest

import numpy as np

from harness import Server
import embps

LONG = os.environ.get("EMBPS_LONG") == "1"
ONE_OFF = 50_000_000 if LONG else 3_000_000
HOT = 100_000 if LONG else 20_000
MAX_ROWS = 1_000_000 if LONG else 200_000
BATCH_NEW = 100_000 if LONG else 20_000  # one-off ids per push
DIM = 16
MAX_MEMORY = (512 << 20) if LONG else (96 << 20)


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def stream(rng):
    """(ids, grads, hot ids of the batch, their grads): one-off ids are
    1..ONE_OFF in a shuffled order of blocks, the hot set the negative ids
    -1..-HOT, half of it in every push (so each hot id every other push)."""
    hot = -np.arange(1, HOT + 1, dtype=np.int64)
    half = HOT // 2
    for b, start in enumerate(range(1, ONE_OFF + 1, BATCH_NEW)):
        new = np.arange(start, min(start + BATCH_NEW, ONE_OFF + 1),
                        dtype=np.int64)
        h = hot[:half] if b % 2 == 0 else hot[half:]
        hg = rng.integers(-2, 3, size=(h.size, DIM)).astype(np.float32)
        ng = np.ones((new.size, DIM), np.float32)
        yield np.concatenate([new, h]), np.concatenate([ng, hg]), h, hg


class Stream(unittest.TestCase):

    def test_capacity_keeps_memory_flat(self):
        with Server("--max-memory", str(MAX_MEMORY)) as srv, \
                embps.Client(srv.address) as c:
            c.create_table("t", DIM, dynamic=True, lr=0.125,
                           init="uniform:0.05", seed=9, max_rows=MAX_ROWS)
            c.create_table("ref", DIM, dynamic=True, lr=0.125,
                           init="uniform:0.05", seed=9)
            rng = np.random.default_rng(1)
            warm_at = 3 * MAX_ROWS // BATCH_NEW
            rss = []
            for b, (ids, g, h, hg) in enumerate(stream(rng)):
                c.push("t", ids, g)   # raises on any refusal
                c.push("ref", h, hg)
                if b >= warm_at and b % 10 == 0:
                    rss.append(rss_bytes(srv.proc.pid))
            hot = -np.arange(1, HOT + 1, dtype=np.int64)
            self.assertTrue(np.array_equal(c.pull("t", hot),
                                           c.pull("ref", hot)))
            d = c.describe("t")
            self.assertLessEqual(d["rows_allocated"], MAX_ROWS)
            self.assertGreater(d["evicted_capacity"], ONE_OFF - MAX_ROWS)
            warm, top = rss[0], max(rss)
            self.assertLessEqual(top, warm * 1.05,
                                 "RSS grew from %d to %d bytes after "
                                 "warm-up" % (warm, top))
            print("stream: %d one-off ids, RSS after warm-up %.1f MiB, at "
                  "most %.1f MiB, longest eviction stall %d us"
                  % (ONE_OFF, warm / 2**20, top / 2**20,
                     d["evict_stall_max_us"]))

    def test_without_capacity_max_memory_refuses(self):
        with Server("--max-memory", str(MAX_MEMORY)) as srv, \
                embps.Client(srv.address) as c:
            c.create_table("t", DIM, dynamic=True, lr=0.125)
            rng = np.random.default_rng(1)
            with self.assertRaises(embps.EmbpsError) as e:
                for ids, g, _, _ in stream(rng):
                    c.push("t", ids, g)
            self.assertEqual(e.exception.name, "EMBPS_ELIMIT")
            self.assertLess(c.describe("t")["rows_allocated"], ONE_OFF)


if __name__ == "__main__":
    unittest.main()
