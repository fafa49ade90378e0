"""The Python package's surface: one exception class per kind of failure
(builtins where they fit), constants generated from the C header's error
map (and kept current), type hints and docstrings on the public API, and
dropped tickets that do not live until the client closes.
"""
import errno
import gc
import inspect
import os
import subprocess
import sys
import threading
import typing
import unittest
import warnings

import numpy as np

from harness import ROOT, Server
import embps
import embps.errors
import embps.torch as et

GEN = os.path.join(ROOT, "client", "python", "tools", "gen_codes.py")


class ErrorMap(unittest.TestCase):

    def test_constants_are_the_headers(self):
        r = subprocess.run([sys.executable, GEN, "--check"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        lib = embps.load_library()
        for code, (name, msg) in embps._codes.CODES.items():
            self.assertEqual(getattr(embps, name), code)
            self.assertEqual(lib.embps_err_name(code).decode(), name)
            self.assertEqual(lib.embps_strerror(code).decode(), msg)

    def test_every_code_has_its_class(self):
        for code, (name, _) in embps._codes.CODES.items():
            e = embps.error_for(code, "x")
            self.assertIsNot(type(e), embps.EmbpsError, name)
            self.assertIsInstance(e, embps.EmbpsError)
            self.assertEqual((e.code, e.name, e.message), (code, name, "x"))
            self.assertEqual(str(e), "x (%s)" % name)
        for code, base in ((embps.EMBPS_ERANGE, IndexError),
                           (embps.EMBPS_EINVAL, ValueError),
                           (embps.EMBPS_EPARAM, ValueError),
                           (embps.EMBPS_ENOTABLE, LookupError),
                           (embps.EMBPS_ECONN, ConnectionError),
                           (-errno.ECONNREFUSED, ConnectionError),
                           (-errno.ETIMEDOUT, TimeoutError),
                           (-errno.EACCES, OSError)):
            self.assertIsInstance(embps.error_for(code, "x"), base)
        e = embps.error_for(-errno.ENOENT, "gone")
        self.assertEqual((e.errno, e.name), (errno.ENOENT, "ENOENT"))
        import pickle
        again = pickle.loads(pickle.dumps(embps.error_for(
            embps.EMBPS_ERANGE, "index 9")))
        self.assertIsInstance(again, embps.OutOfRange)
        self.assertEqual(again.message, "index 9")


class FromTheServer(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.server = Server().start()
        cls.c = embps.Client(cls.server.address)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        assert cls.server.stop() == 0

    def test_each_kind_raises_its_class(self):
        c = self.c
        c.create_table("k", 4, rows=10)
        cases = [
            (embps.TableNotFound, lambda: c.describe("nope")),
            (embps.TableExists, lambda: c.create_table("k", 4, rows=10)),
            (embps.OutOfRange, lambda: c.pull("k", [10])),
            (embps.InvalidParameter, lambda: c.set_lr("k", -1)),
            (embps.NonFinite, lambda: c.push("k", [1], [[np.nan] * 4])),
            (embps.CountMismatch, lambda: c.push("k", [1, 2], [[0] * 4])),
            (embps.InvalidArgument, lambda: c.pull("k", [1.5])),
            (embps.DurabilityError, lambda: c.checkpoint()),
        ]
        for cls, call in cases:
            with self.assertRaises(cls) as e:
                call()
            self.assertTrue(e.exception.message, cls)
        with self.assertRaises(IndexError):  # code written for builtins
            c.pull("k", [-1])
        with self.assertRaises(ConnectionError):
            embps.Client("127.0.0.1:1", timeout_ms=200, retry_ms=-1)

    def test_dropped_tickets_are_waited_for(self):
        c = self.c
        c.create_table("d", 2, rows=10)
        for _ in range(20):  # pushes whose tickets nobody waits for
            c.push_async("d", [1], np.ones((1, 2), np.float32))
        gc.collect()
        self.assertEqual(c._dropped, [])
        self.assertEqual(c.describe("d")["pushes"], 20)
        # dropped while another thread holds the client: at the next call
        held, release = threading.Event(), threading.Event()

        def hold():
            with c._lock:
                held.set()
                release.wait()
        ticket = c.pull_async("d", [1, 2])
        t = threading.Thread(target=hold)
        t.start()
        held.wait()
        del ticket  # collected at once (refcount) while the lock is busy
        self.assertEqual(len(c._dropped), 1)
        release.set()
        t.join()
        self.assertTrue(np.allclose(c.pull("d", [1]), -0.2))
        self.assertEqual(c._dropped, [])
        # a dropped ticket's error is not lost silently
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            c.push_async("d", [1], [[np.inf, 0.0]])  # refused by the server
            gc.collect()
        self.assertTrue(any(issubclass(x.category, RuntimeWarning) and
                            "dropped" in str(x.message) for x in w))


class Annotations(unittest.TestCase):

    def public(self):
        for obj in (embps.Client, embps.Ticket, et.RemoteEmbedding,
                    et.RemoteEmbeddingBag, et.RemoteOptimizer,
                    et.RemoteTable, et.RemoteWeight):
            for name, fn in vars(obj).items():
                if (name.startswith("_") and name != "__init__") or \
                        not inspect.isfunction(getattr(fn, "__func__", fn)):
                    continue
                yield "%s.%s" % (obj.__name__, name), getattr(fn, "__func__",
                                                              fn)
        for mod in (embps, et):
            for name in mod.__all__:
                f = getattr(mod, name)
                if inspect.isfunction(f):
                    yield "%s.%s" % (mod.__name__, name), f

    def test_public_api_has_hints_and_docstrings(self):
        missing = []
        for name, f in self.public():
            sig = inspect.signature(f)
            hints = typing.get_type_hints(f)
            for p in sig.parameters.values():
                if p.name not in ("self", "cls") and p.name not in hints \
                        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                    missing.append("%s(%s): no type" % (name, p.name))
            if "return" not in hints:
                missing.append("%s: no return type" % name)
            if not f.__name__.startswith("__") and not inspect.getdoc(f):
                missing.append("%s: no docstring" % name)
        self.assertEqual(missing, [])
        here = os.path.dirname(embps.__file__)
        self.assertTrue(os.path.exists(os.path.join(here, "py.typed")))


if __name__ == "__main__":
    unittest.main(verbosity=2)
