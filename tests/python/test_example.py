"""client/examples/click_model.py end to end: 2 worker processes (DDP over
gloo for the dense part, synchronous embps tables for the sparse features)
reach a held-out AUC within 0.005 of the same model trained in one process
with nn.Embedding(sparse=True)/nn.EmbeddingBag(sparse=True) and the same
Adagrad, from the same initial rows and the same global batches.
EMBPS_LONG=1 trains on more data for longer.
"""
import json
import os
import subprocess
import sys
import unittest

from harness import ROOT, Server

EXAMPLE = os.path.join(ROOT, "client", "examples", "click_model.py")


class ClickModel(unittest.TestCase):

    def test_auc_matches_local_training(self):
        size = ["--train", "200000", "--epochs", "5"] \
            if os.environ.get("EMBPS_LONG") else []
        with Server() as s:
            env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client",
                                                           "python"))
            out = subprocess.run(
                [sys.executable, EXAMPLE, "--servers", s.address,
                 "--compare-local", "--json", "--quiet"] + size, env=env,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                timeout=500)
            self.assertEqual(out.returncode, 0, out.stderr)
            with __import__("embps").Client(s.address) as c:
                stats = {t["name"]: t for t in c.tables()}
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(r)
        self.assertLessEqual(abs(r["auc_embps"] - r["auc_local"]), 0.005, r)
        self.assertGreater(r["auc_embps"], 0.7, r)  # it learned something
        self.assertGreater(r["auc_embps"], r["auc_oracle"] - 0.08, r)
        # both workers pushed every table, once per step
        self.assertGreater(stats["click.item"]["rows_allocated"], 100)
        self.assertEqual(stats["click.user"]["pushes"],
                         stats["click.tags"]["pushes"])


if __name__ == "__main__":
    unittest.main()
