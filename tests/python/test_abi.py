"""The Python package against the library it loads: every ctypes mirror has
the size the library gives its C struct (embps_abi_size) and the fields,
names, order and types, of the header's X-macro lists; a package whose
mirror disagrees is refused at load with a message naming the library, its
version, the struct and both sizes; and the version is one: CMakeLists.txt's
project(VERSION), the generated embps/version.h, the library's
embps_version_string() and embps.__version__.
"""
import ctypes
import os
import re
import unittest
from unittest import mock

from harness import ROOT, SERVER_BIN

import embps

HEADER = os.path.join(ROOT, "client", "include", "embps", "embps.h")
LIBRARY = os.environ.get("EMBPS_LIBRARY")

# C types of the X-macro lists -> the ctypes a mirror must use
CTYPES = {"uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64,
          "int64_t": ctypes.c_int64, "int": ctypes.c_int,
          "double": ctypes.c_double, "embps_optimizer_t": ctypes.c_int,
          "embps_init_t": ctypes.c_int, "embps_dtype_t": ctypes.c_int,
          "embps_evict_t": ctypes.c_int}


def x_macro(name):
    """The X(...) entries of `#define name(X)` in embps.h: lists of their
    arguments (the doc strings left out)."""
    with open(HEADER) as f:
        text = f.read()
    m = re.search(r"#define %s\(X\)((?:.*\\\n)*.*)" % name, text)
    if not m:
        raise AssertionError("embps.h has no %s(X)" % name)
    body = re.sub(r'"[^"]*"', "", m.group(1))
    return [[a.strip() for a in args.split(",") if a.strip()]
            for args in re.findall(r"X\(([^)]*)\)", body)]


def build_dir():
    d = os.path.dirname(os.path.abspath(SERVER_BIN))
    while d != "/" and not os.path.exists(os.path.join(d, "CMakeCache.txt")):
        d = os.path.dirname(d)
    return d


class Mirrors(unittest.TestCase):

    def setUp(self):
        self.lib = embps.load_library()

    def test_sizes_match_the_library(self):
        for attr in embps._MIRRORS:
            mirror = getattr(embps, attr)
            size = self.lib.embps_abi_size(mirror._c_name_.encode())
            self.assertEqual(ctypes.sizeof(mirror), size, mirror._c_name_)
            self.assertGreater(size, 0)
        self.assertEqual(self.lib.embps_abi_size(b"embps_no_such_t"), 0)

    def test_fields_match_the_header(self):
        def fields(mirror, skip=()):
            return [(f, t) for f, t in mirror._fields_
                    if f not in embps._PRIVATE + tuple(skip)]
        spec = [(n, CTYPES[t]) for t, n, kind in
                x_macro("EMBPS_TABLE_SPEC_FIELDS")]
        self.assertEqual(fields(embps._Spec, ("name", "dim")), spec)
        info = [(n, CTYPES[t]) for t, n, merge in
                x_macro("EMBPS_TABLE_INFO_FIELDS")]
        self.assertEqual(fields(embps._Info, ("spec",)), info)
        stats = [(n, CTYPES[t]) for t, n, source in
                 x_macro("EMBPS_SERVER_STATS_FIELDS")]
        stats += [(n, CTYPES[t]) for t, n in
                  x_macro("EMBPS_SERVER_REPL_FIELDS")]
        text = ("address", "version", "n_tables", "tables", "data_dir",
                "fsync", "durability_failed", "primary", "members_",
                "n_members", "sync_degraded")
        self.assertEqual(fields(embps._Stats, text), stats)
        self.assertEqual([f for f, _ in fields(embps._CheckpointInfo)],
                         [n for n, in x_macro("EMBPS_CHECKPOINT_INFO_FIELDS")])
        alter = x_macro("EMBPS_TABLE_ALTER_FIELDS")
        self.assertEqual(fields(embps._Alter, ("set",)),
                         [(n, ctypes.c_double) for n, bit in alter])
        self.assertEqual(list(embps._ALTER_FIELDS), [n for n, bit in alter])

    def test_sized_mirrors_carry_their_size(self):
        self.assertEqual(embps._Options().size, ctypes.sizeof(embps._Options))
        self.assertEqual(embps._Alter().size, ctypes.sizeof(embps._Alter))
        o = embps._Options(b"h:1", None, 5, -1)
        self.assertEqual((o.servers, o.timeout_ms, o.retry_ms),
                         (b"h:1", 5, -1))

    def test_a_wrong_mirror_is_refused_at_load(self):
        class Short(ctypes.Structure):  # a spec without its reserved words
            _c_name_ = "embps_table_spec_t"
            _fields_ = [f for f in embps._Spec._fields_ if f[0] != "reserved"]

        want = ctypes.sizeof(embps._Spec)
        with mock.patch.object(embps, "_Spec", Short):
            with self.assertRaises(OSError) as e:
                embps.load_library(LIBRARY)
        msg = str(e.exception)
        for part in ("libembps at %s" % LIBRARY,
                     "is version %s" % embps.__version__,
                     "its embps_table_spec_t is %d bytes" % want,
                     "expects %d bytes" % ctypes.sizeof(Short),
                     "rebuild and reinstall"):
            self.assertIn(part, msg)

        class Unknown(ctypes.Structure):
            _c_name_ = "embps_future_t"
            _fields_ = [("x", ctypes.c_int)]

        with mock.patch.object(embps, "_Slices", Unknown):
            with self.assertRaisesRegex(OSError, "embps_future_t is unknown"):
                embps.load_library(LIBRARY)
        # the right mirrors load again
        self.assertIsNotNone(embps.load_library(LIBRARY))


class Version(unittest.TestCase):

    def test_one_version(self):
        with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
            cmake = re.search(r"^project\(embps VERSION (\S+)", f.read(),
                              re.M).group(1)
        with open(os.path.join(build_dir(), "include", "embps",
                               "version.h")) as f:
            header = f.read()
        string = re.search(r'#define EMBPS_VERSION_STRING "([^"]+)"', header)
        parts = [int(re.search(r"#define EMBPS_VERSION_%s (\d+)" % p,
                               header).group(1))
                 for p in ("MAJOR", "MINOR", "PATCH")]
        lib = embps.load_library()
        self.assertEqual(string.group(1), cmake)
        self.assertEqual(".".join(map(str, parts)), cmake)
        self.assertEqual(lib.embps_version_string().decode(), cmake)
        lib.embps_version.restype = ctypes.c_uint
        self.assertEqual(lib.embps_version(),
                         (parts[0] << 16) | (parts[1] << 8) | parts[2])
        self.assertEqual(embps.__version__, cmake)


if __name__ == "__main__":
    unittest.main()
