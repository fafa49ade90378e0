"""The Python package's surface: one exception class per kind of failure
(builtins where they fit), constants generated from the C header's error
map (and kept current), type hints and docstrings on the public API,
dropped tickets that do not live until the client closes, and a server's
text in an exception escaped (a lying server's ESC, CR and LF as \\xNN).
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

import socket
import struct

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


def _varint(v):
    out = bytearray()
    while True:
        b = v & 0x7f
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _frame(kind, req_id, meta):
    """A frame as frame.h lays it out: body_len, meta_len, req_id, kind,
    magic "EP", then the meta padded to 8 bytes."""
    body = meta + b"\0" * (-len(meta) % 8)
    return struct.pack("<IIIH2s", len(body), len(meta), req_id, kind,
                       b"EP") + body


class LyingServer(threading.Thread):
    """Answers the hello (a cluster of one), then every request with an
    error whose text drives a terminal."""
    NASTY = "\x1b[2J\x1b]0;owned\x07\r\nall good"

    def __init__(self):
        super().__init__(daemon=True)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]

    def run(self):
        conn, _ = self.sock.accept()
        with conn:
            while True:
                head = conn.recv(16, socket.MSG_WAITALL)
                if len(head) < 16:
                    return
                body_len, _, req_id, kind, _ = struct.unpack("<IIIH2s", head)
                if body_len:
                    conn.recv(body_len, socket.MSG_WAITALL)
                if kind == 1:  # HELLO: version 1, cluster of 1, 64 MiB
                    meta = (b"\x08\x01\x10\x01\x18\x00\x28"
                            + _varint(1 << 26))
                    conn.sendall(_frame(0x81, req_id, meta))
                else:  # ERROR: code (zigzag), message
                    text = self.NASTY.encode()
                    meta = (b"\x08" + _varint(2 * 30002 - 1) + b"\x12"
                            + _varint(len(text)) + text)
                    conn.sendall(_frame(0xff, req_id, meta))


class EscapedText(unittest.TestCase):

    def test_server_text_is_escaped_in_exceptions(self):
        liar = LyingServer()
        liar.start()
        with embps.Client(liar.address, timeout_ms=5000, retry_ms=-1) as c:
            with self.assertRaises(embps.TableNotFound) as e:
                c.drop_table("t")
        msg = e.exception.message
        self.assertIn("\\x1b[2J\\x1b]0;owned\\x07\\x0d\\x0aall good", msg)
        self.assertFalse(any(ord(ch) < 0x20 for ch in str(e.exception)), msg)


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
