"""embps: Python binding of libembps, the embps parameter-server client.

A thin ctypes layer: numpy arrays go to the C library without copies
(int64 ids, float32 rows), errors come back as EmbpsError subclasses
carrying the server's own message (embps.errors: TableNotFound,
OutOfRange, which is also an IndexError, ConnectionFailed, also a
ConnectionError, ...), and the codes of embps.h are constants here
(embps.EMBPS_ENOTABLE, ...). One Client per thread or process, as in C.

    import embps
    c = embps.Client("127.0.0.1:7070")
    c.create_table("emb", dim=16, rows=1000, optimizer="adagrad", lr=0.1)
    rows = c.pull("emb", [3, 1, 3])            # shape (3, 16)
    c.push("emb", [3, 1, 3], grads)            # IndexedSlices, duplicates summed

The shared library is found through $EMBPS_LIBRARY, then next to this
package (a libembps.so copied into it), then in a source tree
(build/libembps.so), then in the lib directory of the install prefix this
package sits under (what `cmake --install --prefix P` fills, whether pip put
the package in P or in a virtual environment made in P), then sys.prefix's
lib, then the system's loader path.

A Client may be shared by threads (its calls are serialised by a lock) but
not across fork(): a child that uses its parent's Client gets ForkError (it
would read replies meant for the parent); create a new Client in the child.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import sysconfig
import threading
import warnings
from typing import (Any, Dict, List, Optional, Sequence, Tuple, Union)

import numpy as np

from ._version import __version__
from . import errors
from ._codes import *  # noqa: F401,F403 (EMBPS_* constants)
from ._codes import __all__ as _CODE_NAMES
from .errors import *  # noqa: F401,F403
from .errors import EmbpsError, InvalidArgument, TableExists, error_for

__all__ = ["Client", "ForkError", "Ticket", "load_library", "parse_init",
           "route", "bag_forward", "bag_backward", "spec_differences",
           "errors"] + list(errors.__all__) + list(_CODE_NAMES)

#: ids (any integer array-like, any shape) and rows (float32 array-like)
IdsLike = Union[np.ndarray, Sequence[int], Sequence[Sequence[int]]]
RowsLike = Union[np.ndarray, Sequence[Sequence[float]]]

OPTIMIZERS = {"sgd": 0, "adagrad": 1, "adam": 2, "ftrl": 3}
DTYPES = {"f32": 0, "f16": 1, "bf16": 2}  # storage type of the weights
_INITS = {"zeros": 0, "constant": 1, "uniform": 2, "normal": 3}
PUSH_MERGE = 1
EXPORT_STATE = 1  # embps.h: EMBPS_EXPORT_STATE
EXPORT_DENSE = 2  # EMBPS_EXPORT_DENSE
IMPORT_STATE = 1  # EMBPS_IMPORT_STATE
IMPORT_CREATE = 2  # EMBPS_IMPORT_CREATE


# ---- ctypes mirrors of embps.h's structs ----
# Each follows the C struct field by field (the X-macro lists of embps.h:
# EMBPS_TABLE_SPEC_FIELDS, EMBPS_TABLE_INFO_FIELDS, ...); load_library()
# checks every mirror's size against the library's embps_abi_size(), so a
# package and a library that disagree fail at load with a clear message
# instead of corrupting memory. "size" and "reserved" (embps.h, "Structs
# and the ABI") are not fields a caller sees.
_PRIVATE = ("size", "reserved")


def _names(mirror):
    """The public field names of a mirror, in C order."""
    return [f for f, _ in mirror._fields_ if f not in _PRIVATE]


class _Sized(ctypes.Structure):
    """A struct that begins with size_t size: set to the mirror's size."""

    def __init__(self, *args, **kw):
        super().__init__(ctypes.sizeof(self), *args, **kw)


# EMBPS_TABLE_SPEC_FIELDS, after name and dim
_SPEC_FIELDS = [
    ("rows", ctypes.c_uint64),
    ("dynamic", ctypes.c_int),
    ("optimizer", ctypes.c_int),
    ("lr", ctypes.c_double),
    ("eps", ctypes.c_double),
    ("beta1", ctypes.c_double),
    ("beta2", ctypes.c_double),
    ("initial_accumulator", ctypes.c_double),
    ("l1", ctypes.c_double),
    ("l2", ctypes.c_double),
    ("lr_power", ctypes.c_double),
    ("weight_decay", ctypes.c_double),
    ("init", ctypes.c_int),
    ("init_value", ctypes.c_double),
    ("seed", ctypes.c_uint64),
    ("has_padding", ctypes.c_int),
    ("padding_id", ctypes.c_int64),
    ("dtype", ctypes.c_int),
    ("sync_workers", ctypes.c_uint32),
    # admission and eviction (dynamic tables)
    ("admit_after", ctypes.c_uint32),
    ("admit_probability", ctypes.c_double),
    ("admit_sketch_bytes", ctypes.c_uint64),
    ("ttl_steps", ctypes.c_uint64),
    ("max_rows", ctypes.c_uint64),
    ("evict", ctypes.c_int),
    ("evict_l2_below", ctypes.c_double),
]


class _Spec(ctypes.Structure):
    _c_name_ = "embps_table_spec_t"
    _fields_ = [("name", ctypes.c_char * 128), ("dim", ctypes.c_uint32)] + \
        _SPEC_FIELDS + [("reserved", ctypes.c_uint64 * 16)]


EVICT = {"lru": 0, "lfu": 1}  # embps_evict_t
# create_table keyword arguments of admission and eviction
_DYN_KEYS = ("admit_after", "admit_probability", "admit_sketch_bytes",
             "ttl_steps", "max_rows", "evict", "evict_l2_below")
# EMBPS_TABLE_INFO_FIELDS: the counters of a table (all uint64)
_INFO_COUNTERS = ("rows_allocated", "bytes_used", "pushes", "pulls", "step",
                  "rows_admitted", "rows_pending", "evicted_ttl",
                  "evicted_capacity", "evicted_l2", "capacity",
                  "evict_stall_max_us")
_DYN_COUNTERS = _INFO_COUNTERS[5:]  # those of admission and eviction


class _Info(ctypes.Structure):
    _c_name_ = "embps_table_info_t"
    _fields_ = [("spec", _Spec)] + \
        [(f, ctypes.c_uint64) for f in _INFO_COUNTERS] + \
        [("reserved", ctypes.c_uint64 * 8)]


# EMBPS_SERVER_STATS_FIELDS: four uint32, then uint64
_STATS_FIGURES = ("cluster_index", "cluster_size", "io_threads", "shards",
                  "uptime_ms", "connections", "requests", "pulls", "pushes",
                  "pull_rows", "push_rows", "errors", "bytes_in", "bytes_out",
                  "checkpoint_unix_s", "checkpoint_bytes", "checkpoint_ms",
                  "checkpoint_lsn", "log_bytes")


class _MemberPrimary(ctypes.Structure):
    _c_name_ = "embps_member_primary_t"
    _fields_ = [("member", ctypes.c_uint32), ("epoch", ctypes.c_uint32),
                ("primary", ctypes.c_char * 128)]


class _MembersWord(ctypes.Union):
    # the union that keeps embps_server_stats_t's size on 32-bit targets
    _fields_ = [("members", ctypes.POINTER(_MemberPrimary)),
                ("members_word_", ctypes.c_uint64)]


class _Stats(ctypes.Structure):
    _c_name_ = "embps_server_stats_t"
    _fields_ = [
        ("address", ctypes.c_char * 64),
        ("version", ctypes.c_char * 32),
    ] + [(f, ctypes.c_uint32 if i < 4 else ctypes.c_uint64)
         for i, f in enumerate(_STATS_FIGURES)] + [
        ("n_tables", ctypes.c_size_t),
        ("tables", ctypes.POINTER(_Info)),
        ("data_dir", ctypes.c_char * 256),
        ("fsync", ctypes.c_char * 16),
        ("durability_failed", ctypes.c_char * 256),
        # EMBPS_SERVER_REPL_FIELDS (issue 21), then the primary
        ("role", ctypes.c_uint32),
        ("epoch", ctypes.c_uint32),
        ("applied_lsn", ctypes.c_uint64),
        ("followers", ctypes.c_uint32),
        ("followers_in_sync", ctypes.c_uint32),
        ("lag_records", ctypes.c_uint64),
        ("lag_ms", ctypes.c_uint64),
        ("bytes_shipped", ctypes.c_uint64),
        ("primary", ctypes.c_char * 64),
        # coordinated (issue 22): the primary of every member slot
        ("members_", _MembersWord),
        ("n_members", ctypes.c_uint32),
        ("sync_degraded", ctypes.c_uint32),  # --sync-degrade-ms: 1 degraded
    ]


class _CheckpointInfo(ctypes.Structure):
    _c_name_ = "embps_checkpoint_info_t"
    _fields_ = [(f, ctypes.c_uint64)
                for f in ("lsn", "bytes", "duration_ms", "unix_s")] + \
        [("reserved", ctypes.c_uint64 * 4)]


# embps_table_alter_t (EMBPS_TABLE_ALTER_FIELDS): the fields ALTER may
# change, in the order of their EMBPS_ALTER_* bits.
_ALTER_FIELDS = ("lr", "eps", "beta1", "beta2", "l1", "l2", "lr_power",
                 "weight_decay")


class _Alter(_Sized):
    _c_name_ = "embps_table_alter_t"
    _fields_ = [("size", ctypes.c_size_t), ("set", ctypes.c_uint)] + \
        [(f, ctypes.c_double) for f in _ALTER_FIELDS]


# Client(read_from=...): EMBPS_READ_PRIMARY, EMBPS_READ_FOLLOWER
_READ_FROM = {"primary": 0, "follower": 1}


class _Options(_Sized):
    _c_name_ = "embps_client_options_t"
    _fields_ = [("size", ctypes.c_size_t),
                ("servers", ctypes.c_char_p), ("token", ctypes.c_char_p),
                ("timeout_ms", ctypes.c_int), ("retry_ms", ctypes.c_int),
                ("read_from", ctypes.c_int),
                ("servers_as_listed", ctypes.c_int)]


class _Slices(ctypes.Structure):
    _c_name_ = "embps_slices_t"
    _fields_ = [("indices", ctypes.POINTER(ctypes.c_int64)),
                ("values", ctypes.POINTER(ctypes.c_float)),
                ("n", ctypes.c_size_t), ("cap", ctypes.c_size_t),
                ("dim", ctypes.c_uint32),
                ("reserved", ctypes.c_uint64 * 2)]


# every mirror, checked at load (looked up by name, so a test can swap one)
_MIRRORS = ("_Spec", "_Info", "_Stats", "_MemberPrimary", "_CheckpointInfo",
            "_Alter", "_Options", "_Slices")


def _check_abi(lib):
    """Raises OSError unless every mirror has the size the library gives
    its C struct (embps_abi_size): a library and a package of versions
    whose structs differ would otherwise corrupt memory."""
    where = "libembps at %s" % lib._name
    try:
        lib.embps_abi_size.restype = ctypes.c_size_t
        lib.embps_abi_size.argtypes = [ctypes.c_char_p]
        lib.embps_version_string.restype = ctypes.c_char_p
        lib.embps_version_string.argtypes = []
    except AttributeError:
        raise OSError("%s has no embps_abi_size(): it is older than this "
                      "embps package (%s); rebuild and reinstall the library "
                      "and the package from one source tree"
                      % (where, __version__))
    version = lib.embps_version_string().decode()
    for attr in _MIRRORS:
        mirror = globals()[attr]
        want = ctypes.sizeof(mirror)
        have = lib.embps_abi_size(mirror._c_name_.encode())
        if have != want:
            raise OSError(
                "%s is version %s, its %s is %s, this embps package (%s) "
                "expects %d bytes: rebuild and reinstall the package and the "
                "library from one source tree"
                % (where, version, mirror._c_name_,
                   "%d bytes" % have if have else "unknown to it", __version__,
                   want))


class ForkError(RuntimeError):
    """A Client used in a process other than the one that created it."""


_LIB: Optional[ctypes.CDLL] = None


def _library_candidates(path: Optional[str]) -> List[Optional[str]]:
    """Where libembps.so may be, in the order load_library tries them."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = [path, os.environ.get("EMBPS_LIBRARY"),
           os.path.join(here, "libembps.so"),
           os.path.join(here, "..", "..", "..", "build", "libembps.so")]
    libdirs = ["lib", "lib64"]
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if multiarch:
        libdirs.append(os.path.join("lib", multiarch))
    # the package lives under PREFIX/lib/pythonX.Y/site-packages (or Debian's
    # PREFIX/local/lib/python3/dist-packages): try each ancestor as PREFIX
    d = here
    for _ in range(6):
        d = os.path.dirname(d)
        out += [os.path.join(d, ld, "libembps.so") for ld in libdirs]
    out += [os.path.join(sys.prefix, ld, "libembps.so") for ld in libdirs]
    out += [ctypes.util.find_library("embps"), "libembps.so.0"]
    return out


def load_library(path: Optional[str] = None) -> ctypes.CDLL:
    """Loads libembps (once); returns the ctypes handle."""
    global _LIB
    if _LIB is not None and path is None:
        return _LIB
    tried = []
    for cand in _library_candidates(path):
        if not cand or cand in tried:
            continue
        tried.append(cand)
        if os.path.isabs(cand) and not os.path.exists(cand):
            continue
        try:
            lib = ctypes.CDLL(cand)
            break
        except OSError:
            continue
    else:
        raise OSError("libembps not found (tried $EMBPS_LIBRARY, %s): set "
                      "EMBPS_LIBRARY to its path" % ", ".join(tried[:-1]))
    _check_abi(lib)
    _declare(lib)
    _LIB = lib
    return lib


def _lib() -> ctypes.CDLL:
    return load_library()


def _declare(lib: ctypes.CDLL) -> None:
    P = ctypes.c_void_p
    i64p = ctypes.POINTER(ctypes.c_int64)
    f32p = ctypes.POINTER(ctypes.c_float)
    szp = ctypes.POINTER(ctypes.c_size_t)
    sig = {
        "embps_client_create": (ctypes.c_int, [ctypes.POINTER(_Options),
                                               ctypes.POINTER(P),
                                               ctypes.c_char_p,
                                               ctypes.c_size_t]),
        "embps_client_destroy": (None, [P]),
        "embps_client_last_error": (ctypes.c_char_p, [P]),
        "embps_strerror": (ctypes.c_char_p, [ctypes.c_int]),
        "embps_err_name": (ctypes.c_char_p, [ctypes.c_int]),
        "embps_table_spec_init": (None, [ctypes.POINTER(_Spec),
                                         ctypes.c_char_p, ctypes.c_uint32,
                                         ctypes.c_int]),
        "embps_create_table": (ctypes.c_int, [P, ctypes.POINTER(_Spec)]),
        "embps_drop_table": (ctypes.c_int, [P, ctypes.c_char_p]),
        "embps_complete_table": (ctypes.c_int, [P, ctypes.c_char_p,
                                                ctypes.POINTER(ctypes.c_uint32)]),
        "embps_describe_table": (ctypes.c_int, [P, ctypes.c_char_p,
                                                ctypes.POINTER(_Info)]),
        "embps_list_tables": (ctypes.c_int, [P,
                                             ctypes.POINTER(ctypes.POINTER(_Info)),
                                             ctypes.POINTER(ctypes.c_size_t)]),
        "embps_stats": (ctypes.c_int, [P, ctypes.POINTER(ctypes.POINTER(_Stats)),
                                       ctypes.POINTER(ctypes.c_size_t)]),
        "embps_stats_free": (None, [ctypes.POINTER(_Stats), ctypes.c_size_t]),
        "embps_checkpoint": (ctypes.c_int, [P, ctypes.POINTER(_CheckpointInfo)]),
        "embps_alter_table": (ctypes.c_int, [P, ctypes.c_char_p,
                                             ctypes.POINTER(_Alter),
                                             ctypes.POINTER(_Info)]),
        "embps_evict": (ctypes.c_int, [P, ctypes.c_char_p,
                                       ctypes.POINTER(ctypes.c_uint64)]),
        "embps_client_n_servers": (ctypes.c_size_t, [P]),
        "embps_client_read_lsn": (ctypes.c_uint64, [P, ctypes.c_size_t]),
        "embps_client_read_address": (ctypes.c_char_p, [P, ctypes.c_size_t]),
        "embps_client_server_address": (ctypes.c_char_p,
                                        [P, ctypes.c_size_t]),
        "embps_pull": (ctypes.c_int, [P, ctypes.c_char_p, i64p,
                                      ctypes.c_size_t, f32p, ctypes.c_uint32]),
        "embps_push": (ctypes.c_int, [P, ctypes.c_char_p, i64p,
                                      ctypes.c_size_t, f32p, ctypes.c_uint32,
                                      ctypes.c_uint]),
        "embps_push_step_async": (ctypes.c_int, [P, ctypes.c_char_p, i64p,
                                                 ctypes.c_size_t, f32p,
                                                 ctypes.c_uint32, ctypes.c_uint,
                                                 ctypes.c_uint64,
                                                 ctypes.POINTER(P)]),
        "embps_pull_async": (ctypes.c_int, [P, ctypes.c_char_p, i64p,
                                            ctypes.c_size_t, f32p,
                                            ctypes.c_uint32, ctypes.POINTER(P)]),
        "embps_push_async": (ctypes.c_int, [P, ctypes.c_char_p, i64p,
                                            ctypes.c_size_t, f32p,
                                            ctypes.c_uint32, ctypes.c_uint,
                                            ctypes.POINTER(P)]),
        "embps_wait": (ctypes.c_int, [P, P]),
        "embps_push_resume": (ctypes.c_int, [P]),
        "embps_push_owed": (ctypes.c_size_t, [P]),
        "embps_export_table": (ctypes.c_int, [P, ctypes.c_char_p,
                                              ctypes.c_char_p, ctypes.c_uint,
                                              ctypes.POINTER(ctypes.c_uint64)]),
        "embps_import_table": (ctypes.c_int, [P, ctypes.c_char_p,
                                              ctypes.c_char_p, ctypes.c_uint,
                                              ctypes.POINTER(ctypes.c_uint64)]),
        "embps_write_rows": (ctypes.c_int, [P, ctypes.c_char_p, i64p,
                                            ctypes.c_size_t, f32p,
                                            ctypes.c_uint32, f32p,
                                            ctypes.c_int, ctypes.c_uint64]),
        "embps_route": (ctypes.c_uint32, [ctypes.c_int64, ctypes.c_uint32]),
        "embps_slices_init": (None, [ctypes.POINTER(_Slices), ctypes.c_uint32]),
        "embps_slices_free": (None, [ctypes.POINTER(_Slices)]),
        "embps_bag_forward": (None, [f32p, ctypes.c_uint32, i64p, szp,
                                     ctypes.c_size_t, f32p, ctypes.c_int,
                                     ctypes.c_int, ctypes.c_int64, f32p]),
        "embps_bag_backward": (ctypes.c_int, [f32p, ctypes.c_uint32, i64p, szp,
                                              ctypes.c_size_t, f32p,
                                              ctypes.c_int, ctypes.c_int,
                                              ctypes.c_int64,
                                              ctypes.POINTER(_Slices)]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    libc = ctypes.CDLL(None)
    lib._free = libc.free
    lib._free.argtypes = [ctypes.c_void_p]


def _ids(a: IdsLike) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind not in "iu" and a.size:
        raise InvalidArgument(EMBPS_EINVAL, "ids must be integers, not %s"
                              % a.dtype)
    return np.ascontiguousarray(a, dtype=np.int64)


def _ptr(a: np.ndarray, ctype: Any) -> Any:
    return a.ctypes.data_as(ctypes.POINTER(ctype))


def _spec_dict(s: _Spec) -> Dict[str, Any]:
    d = {f: getattr(s, f) for f in _names(_Spec)}
    d["name"] = s.name.decode()
    d["optimizer"] = {v: k for k, v in OPTIMIZERS.items()}[s.optimizer]
    d["dtype"] = {v: k for k, v in DTYPES.items()}.get(s.dtype, "unknown")
    d["dynamic"] = bool(s.dynamic)
    d["init"] = {v: k for k, v in _INITS.items()}.get(s.init, "unknown")
    d["evict"] = {v: k for k, v in EVICT.items()}.get(s.evict, "unknown")
    return d


def _info_dict(i: _Info) -> Dict[str, Any]:
    d = _spec_dict(i.spec)
    for f in _INFO_COUNTERS:
        d[f] = getattr(i, f)
    return d


def route(id_: int, n_servers: int) -> int:
    """The server (0..n_servers-1) that owns id_: the same hash as C."""
    return int(_lib().embps_route(int(id_), n_servers))


COMBINERS = {"sum": 0, "mean": 1, "sqrtn": 2}  # embps_combiner_t


def _bag_args(ids: IdsLike, offsets: Any,
              weights: Optional[Any]) -> Tuple[np.ndarray, np.ndarray,
                                               Optional[np.ndarray]]:
    ids = _ids(ids).reshape(-1)
    offs = np.ascontiguousarray(np.asarray(offsets, dtype=np.uintp))
    if (offs.ndim != 1 or offs.size < 1 or offs[0] != 0
            or offs[-1] != ids.size or np.any(offs[1:] < offs[:-1])):
        raise ValueError("offsets must have n_bags + 1 non-decreasing "
                         "entries from 0 to the number of ids (%d)" % ids.size)
    if weights is not None:
        weights = np.ascontiguousarray(np.asarray(weights, dtype=np.float32))
        if weights.shape != ids.shape:
            raise ValueError("weights must have one entry per id")
    return ids, offs, weights


def _fptr(a: Optional[np.ndarray]) -> Any:
    return None if a is None else _ptr(a, ctypes.c_float)


def bag_forward(rows: RowsLike, ids: IdsLike, offsets: Any,
                weights: Optional[Any] = None, combiner: str = "sum",
                padding_id: Optional[int] = None) -> np.ndarray:
    """embps_bag_forward: rows (one per id position, n x dim), bag b covers
    ids[offsets[b]:offsets[b+1]]; returns the n_bags x dim combined rows."""
    ids, offs, weights = _bag_args(ids, offsets, weights)
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    if rows.ndim != 2 or rows.shape[0] != ids.size:
        raise ValueError("rows must be (number of ids) x dim")
    out = np.empty((offs.size - 1, rows.shape[1]), np.float32)
    _lib().embps_bag_forward(
        _ptr(rows, ctypes.c_float), rows.shape[1], _ptr(ids, ctypes.c_int64),
        _ptr(offs, ctypes.c_size_t), offs.size - 1, _fptr(weights),
        COMBINERS[combiner], padding_id is not None,
        int(padding_id or 0), _ptr(out, ctypes.c_float))
    return out


def bag_backward(grad_out: RowsLike, ids: IdsLike, offsets: Any,
                 weights: Optional[Any] = None, combiner: str = "sum",
                 padding_id: Optional[int] = None
                 ) -> Tuple[np.ndarray, np.ndarray]:
    """embps_bag_backward: the IndexedSlices (indices, values) of the rows
    given d loss / d out (n_bags x dim): one row per non-padding id
    position, not merged."""
    ids, offs, weights = _bag_args(ids, offsets, weights)
    grad_out = np.ascontiguousarray(grad_out, dtype=np.float32)
    dim = grad_out.shape[1]
    if grad_out.shape[0] != offs.size - 1:
        raise ValueError("grad_out must be n_bags x dim")
    lib = _lib()
    s = _Slices()
    lib.embps_slices_init(ctypes.byref(s), dim)
    try:
        rc = lib.embps_bag_backward(
            _ptr(grad_out, ctypes.c_float), dim, _ptr(ids, ctypes.c_int64),
            _ptr(offs, ctypes.c_size_t), offs.size - 1, _fptr(weights),
            COMBINERS[combiner], padding_id is not None, int(padding_id or 0),
            ctypes.byref(s))
        if rc:
            raise error_for(rc, "bag backward failed")
        idx = np.ctypeslib.as_array(s.indices, (s.n,)).copy() if s.n else \
            np.empty(0, np.int64)
        vals = np.ctypeslib.as_array(s.values, (s.n, dim)).copy() if s.n \
            else np.empty((0, dim), np.float32)
    finally:
        lib.embps_slices_free(ctypes.byref(s))
    return idx, vals


def parse_init(init: str, init_value: Optional[float] = None
               ) -> Tuple[str, float]:
    """(kind, value) of an init spec: the CLI's spellings `zeros`,
    `constant:V`, `uniform:A` (U(-A, A)), `normal:STD`, or a bare kind with
    init_value. A value given both ways must agree."""
    kind, sep, text = str(init).partition(":")
    if kind not in _INITS:
        raise ValueError("init %r is not zeros|constant:V|uniform:A|normal:STD"
                         % (init,))
    value = None
    if sep:
        try:
            value = float(text)
        except ValueError:
            raise ValueError("init %r: %r is not a number" % (init, text))
        if init_value is not None and float(init_value) != value:
            raise ValueError("init %r disagrees with init_value=%r"
                             % (init, init_value))
    elif init_value is not None:
        value = float(init_value)
    return kind, 0.0 if value is None else value


# spec fields compared when a table already exists (create_table exist_ok)
_SPEC_KEYS = ("dim", "rows", "dynamic", "optimizer", "lr", "eps", "beta1",
              "beta2", "initial_accumulator", "l1", "l2", "lr_power",
              "weight_decay", "init", "init_value", "seed", "has_padding",
              "padding_id", "dtype", "sync_workers") + _DYN_KEYS


def spec_differences(want: Dict[str, Any], have: Dict[str, Any]
                     ) -> List[str]:
    """The fields in which two spec dicts differ, as 'field X, not Y'
    strings (padding_id only when padding is on)."""
    out = []
    for k in _SPEC_KEYS:
        if k not in want or k not in have:
            continue
        if k == "padding_id" and not (want.get("has_padding")
                                      or have.get("has_padding")):
            continue
        a, b = want[k], have[k]
        same = (abs(a - b) <= 1e-12 * max(abs(a), abs(b))
                if isinstance(a, float) or isinstance(b, float) else a == b)
        if not same:
            out.append("%s %r, not %r" % (k, b, a))
    return out


class Ticket:
    """An asynchronous call in flight; wait() returns its result.

    A ticket dropped without wait() is waited for when it is collected
    (or at the client's next call, if another thread holds the client
    then): its C ticket and buffers do not live until close(). An error
    of a dropped ticket is reported as a RuntimeWarning."""

    def __init__(self, client: "Client", handle: Any, keep: Any,
                 result: Any = None) -> None:
        self._client, self._handle, self._keep = client, handle, keep
        self._result = result

    def wait(self) -> Any:
        """Waits for every server's reply; returns the call's result (a
        pull's rows, None for a push) or raises its EmbpsError."""
        if self._handle is None:
            return self._result
        with self._client._lock:
            handle, self._handle = self._handle, None
            rc = _lib().embps_wait(self._client._h(), handle)
            if rc:
                self._client._raise(rc)
        return self._result

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self._client._drop_ticket(self._handle, self._keep)
            self._handle = None


class Client:
    """Connections to an embps cluster (server list in cluster order).

    Thread-safe: every call takes the client's lock. Not fork-safe: a
    Client belongs to the process that created it (ForkError elsewhere).
    """

    def __init__(self, servers: Union[str, Sequence[str], None] = None,
                 token: Optional[str] = None, timeout_ms: int = 0,
                 retry_ms: int = 0, read_from: str = "primary",
                 servers_as_listed: bool = False) -> None:
        """servers: "a:7070,b:7070" or a list of members in cluster order;
        a member may list its primary and followers separated by "|"
        ("a:7070|a2:7070"), and writes find its primary; a follower listed
        alone sends the client to the primary it names, unless
        servers_as_listed (that server's own answers: its stats, its
        refusals). read_from "follower": pulls (and scans) of a member
        listing several servers go to a follower, whose rows may be behind
        the primary's (read_lsn says at which LSN each member read)."""
        lib = _lib()
        if isinstance(servers, (list, tuple)):
            servers = ",".join(servers)
        self.servers = servers or os.environ.get("EMBPS_SERVERS",
                                                 "127.0.0.1:7070")
        if read_from not in _READ_FROM:
            raise InvalidArgument(EMBPS_EINVAL, "read_from must be \"primary\""
                                  " or \"follower\", not %r" % (read_from,))
        opts = _Options(servers.encode() if servers else None,
                        token.encode() if token else None, int(timeout_ms),
                        int(retry_ms), _READ_FROM[read_from],
                        int(bool(servers_as_listed)))
        handle = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        self._c = None
        rc = lib.embps_client_create(ctypes.byref(opts), ctypes.byref(handle),
                                     err, len(err))
        if rc:
            raise error_for(rc, err.value.decode())
        self._c = handle
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._dims: Dict[str, int] = {}
        self._dropped: List[Tuple[Any, Any]] = []

    def _h(self) -> Any:
        """The C handle, checked to belong to this process and be open;
        waits first for the tickets dropped since the last call. Called
        with the lock held."""
        if self._pid != os.getpid():
            raise ForkError(
                "embps.Client for %s was created in process %d and cannot be "
                "used in process %d (a fork() child would take the parent's "
                "replies): create a new Client in the child"
                % (self.servers, self._pid, os.getpid()))
        if not self._c:
            raise ValueError("embps.Client for %s is closed" % self.servers)
        if self._dropped:
            self._reap()
        return self._c

    def _drop_ticket(self, handle: Any, keep: Any) -> None:
        """A Ticket collected before wait(): its buffers (keep) stay alive
        until embps_wait returns, now if the lock is free, else at the
        next call."""
        self._dropped.append((handle, keep))
        if self._lock.acquire(blocking=False):
            try:
                self._reap()
            finally:
                self._lock.release()

    def _reap(self) -> None:
        while self._dropped:
            handle, _ = self._dropped.pop()
            if not self._c or self._pid != os.getpid():
                continue  # freed by close(), or the parent's
            rc = _lib().embps_wait(self._c, handle)
            if rc:
                warnings.warn("embps: a call whose ticket was dropped "
                              "without wait() failed: %s"
                              % _lib().embps_client_last_error(
                                  self._c).decode(), RuntimeWarning)

    def close(self) -> None:
        """Closes the connections (pending tickets are freed). In a fork()
        child, releases the child's copy only (the parent's connections are
        untouched)."""
        if getattr(self, "_c", None):
            owed = (_lib().embps_push_owed(self._c)
                    if self._pid == os.getpid() else 0)
            if owed:
                warnings.warn("embps: a client closed with %d push(es) owed "
                              "to servers that stopped answering: they stay "
                              "applied on the other servers only "
                              "(resume_pushes() completes them)" % owed,
                              RuntimeWarning)
            _lib().embps_client_destroy(self._c)
            self._c = None
            self._dropped = []

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __reduce__(self) -> Any:
        raise TypeError("an embps.Client holds open connections and cannot be "
                        "pickled; create one in each process")

    @property
    def n_servers(self) -> int:
        """The number of servers of the cluster."""
        with self._lock:
            return int(_lib().embps_client_n_servers(self._h()))

    def read_lsn(self, member: int = 0) -> int:
        """The LSN member `member`'s latest pull (or scan) reply read at:
        every row it returned was the primary's at that LSN (0: none yet)."""
        with self._lock:
            return int(_lib().embps_client_read_lsn(self._h(), int(member)))

    def server_address(self, member: int = 0) -> str:
        """Where member `member`'s writes go now (its primary)."""
        with self._lock:
            a = _lib().embps_client_server_address(self._h(), int(member))
        if a is None:
            raise IndexError("member %d of %d" % (member, self.n_servers))
        return a.decode()

    def read_address(self, member: int = 0) -> str:
        """Where member `member`'s pulls go now (a follower with
        read_from="follower")."""
        with self._lock:
            a = _lib().embps_client_read_address(self._h(), int(member))
        if a is None:
            raise IndexError("member %d of %d" % (member, self.n_servers))
        return a.decode()

    def _raise(self, rc: int) -> None:
        raise error_for(rc, _lib().embps_client_last_error(self._c).decode())

    def _check(self, rc: int) -> None:
        if rc:
            self._raise(rc)

    # ---- tables ----
    def create_table(self, name: str, dim: int, rows: Optional[int] = None,
                     dynamic: bool = False, optimizer: str = "sgd",
                     init: str = "zeros", init_value: Optional[float] = None,
                     seed: int = 0, padding_id: Optional[int] = None,
                     sync_workers: int = 0, dtype: str = "f32",
                     exist_ok: bool = False, **params: Any) -> None:
        """Creates a table on every server. params: lr, eps, beta1, beta2,
        initial_accumulator, l1, l2, lr_power, weight_decay (defaults per
        optimizer as in DESIGN.md). init: the CLI's spellings zeros,
        constant:V, uniform:A, normal:STD, or zeros|constant|uniform|normal
        with init_value the constant, bound or std. dtype: f32|f16|bf16,
        how the server stores the weights (pulls and pushes stay float32;
        optimizer state is float32). exist_ok: an existing table with the
        same spec is fine; one with a different spec raises TableExists
        (EMBPS_EEXIST) naming every difference. A table some servers hold
        and others lack (a member that lost its data) raises PartialError
        naming them, exist_ok or not, and is created nowhere: completing
        those servers resets their rows, an explicit act (complete_table).
        Dynamic tables also take
        admit_after, admit_probability, admit_sketch_bytes, ttl_steps,
        max_rows, evict ("lru"|"lfu") and evict_l2_below (README,
        "Admission and eviction")."""
        spec = _Spec()
        if optimizer not in OPTIMIZERS:
            raise ValueError("optimizer must be one of %s, not %r"
                             % ("|".join(OPTIMIZERS), optimizer))
        _lib().embps_table_spec_init(ctypes.byref(spec), name.encode(), dim,
                                     OPTIMIZERS[optimizer])
        spec.rows = rows or 0
        spec.dynamic = int(dynamic)
        kind, spec.init_value = parse_init(init, init_value)
        spec.init = _INITS[kind]
        spec.seed = seed
        if padding_id is not None:
            spec.has_padding, spec.padding_id = 1, padding_id
        spec.sync_workers = sync_workers
        if dtype not in DTYPES:
            raise ValueError("dtype must be one of %s, not %r"
                             % ("|".join(DTYPES), dtype))
        spec.dtype = DTYPES[dtype]
        for k in _DYN_KEYS:
            if k in params:
                v = params.pop(k)
                if k == "evict":
                    if v not in EVICT:
                        raise ValueError("evict must be lru|lfu, not %r" % v)
                    v = EVICT[v]
                setattr(spec, k, v)
        for k, v in params.items():
            if k not in ("lr", "eps", "beta1", "beta2", "initial_accumulator",
                         "l1", "l2", "lr_power", "weight_decay"):
                raise TypeError("unknown table parameter %r" % k)
            setattr(spec, k, float(v))
        with self._lock:
            rc = _lib().embps_create_table(self._h(), ctypes.byref(spec))
            if rc == EMBPS_EEXIST and exist_ok:
                diff = spec_differences(_spec_dict(spec), self.describe(name))
                if diff:
                    raise TableExists(rc, "table \"%s\" exists with a "
                                      "different spec: %s"
                                      % (name, "; ".join(diff)))
                rc = 0
            self._check(rc)
        self._dims[name] = dim

    def complete_table(self, name: str) -> int:
        """Creates table `name` on the servers that lack it while others
        hold it (a member that came back without its data), with the spec
        the others hold, and returns how many servers it was created on.
        The rows there start again from the table's initializer: what that
        member held is lost. This is the explicit act create_table
        (exist_ok or not) refuses to do silently (PartialError)."""
        created = ctypes.c_uint32(0)
        with self._lock:
            self._check(_lib().embps_complete_table(
                self._h(), name.encode(), ctypes.byref(created)))
        return created.value

    def drop_table(self, name: str) -> None:
        """Drops table `name` on every server (TableNotFound if none holds
        it)."""
        self._dims.pop(name, None)
        with self._lock:
            self._check(_lib().embps_drop_table(self._h(), name.encode()))

    def describe(self, name: str) -> Dict[str, Any]:
        """The spec and counters of table `name` (counters summed over the
        servers): the keys of create_table, and rows_allocated,
        bytes_used, pushes, pulls, step and the admission counters."""
        info = _Info()
        with self._lock:
            self._check(_lib().embps_describe_table(self._h(), name.encode(),
                                                    ctypes.byref(info)))
        return _info_dict(info)

    def alter(self, name: str, **params: float) -> Dict[str, Any]:
        """Changes hyperparameters of table `name` on every server during
        training: any of lr, eps, beta1, beta2, l1, l2, lr_power,
        weight_decay (the others would change the rows' layout or meaning).
        In order with pushes: a push sent after this returns uses the new
        values. Checked like create_table (InvalidParameter, EMBPS_EPARAM,
        naming the field; nothing changes). Returns the table's new
        describe()."""
        a = _Alter()
        for k, v in params.items():
            if k not in _ALTER_FIELDS:
                raise ValueError("alter: %r cannot change during training "
                                 "(only %s)" % (k, ", ".join(_ALTER_FIELDS)))
            setattr(a, k, float(v))
            a.set |= 1 << _ALTER_FIELDS.index(k)
        info = _Info()
        with self._lock:
            self._check(_lib().embps_alter_table(self._h(), name.encode(),
                                                 ctypes.byref(a),
                                                 ctypes.byref(info)))
        return _info_dict(info)

    def set_lr(self, name: str, lr: float) -> Dict[str, Any]:
        """alter(name, lr=lr)."""
        return self.alter(name, lr=lr)

    def tables(self) -> List[Dict[str, Any]]:
        """describe() of every table any server holds."""
        p = ctypes.POINTER(_Info)()
        n = ctypes.c_size_t()
        with self._lock:
            self._check(_lib().embps_list_tables(self._h(), ctypes.byref(p),
                                                 ctypes.byref(n)))
        out = [_info_dict(p[i]) for i in range(n.value)]
        _lib()._free(p)
        return out

    def stats(self) -> List[Dict[str, Any]]:
        """One dict per server (cluster order): its address, version,
        counters, durability state, replication figures ("sync_degraded":
        1 while a primary with --sync-degrade-ms acknowledges without its
        followers), describe() of each of its tables, and "members": with
        --coordinator, the primary
        of every member slot of its cluster as that server last read etcd,
        in slot order, each {"member": I, "primary": "HOST:PORT",
        "epoch": E} (None and 0 while the slot elects), as `embps stats
        --json` prints them; [] without."""
        p = ctypes.POINTER(_Stats)()
        n = ctypes.c_size_t()
        with self._lock:
            self._check(_lib().embps_stats(self._h(), ctypes.byref(p),
                                           ctypes.byref(n)))
        out = []
        for i in range(n.value):
            s = p[i]
            text = ("address", "version", "data_dir", "fsync",
                    "durability_failed", "primary")
            d = {f: getattr(s, f) for f in _names(_Stats)
                 if f not in ("tables", "n_tables", "members_",
                              "n_members") + text}
            for f in text:
                d[f] = getattr(s, f).decode()
            d["tables"] = [_info_dict(s.tables[t]) for t in range(s.n_tables)]
            d["members"] = [{"member": m.member,
                             "primary": m.primary.decode() or None,
                             "epoch": m.epoch}
                            for m in (s.members_.members[k]
                                      for k in range(s.n_members))]
            out.append(d)
        _lib().embps_stats_free(p, n.value)
        return out

    def checkpoint(self) -> List[Dict[str, int]]:
        """Takes a checkpoint on every server (--data-dir); returns once each
        is durable, with one dict per server (lsn, bytes, duration_ms,
        unix_s)."""
        with self._lock:
            h = self._h()
            n = _lib().embps_client_n_servers(h)
            info = (_CheckpointInfo * max(n, 1))()
            self._check(_lib().embps_checkpoint(h, info))
        return [{f: getattr(info[i], f) for f in _names(_CheckpointInfo)}
                for i in range(n)]

    def evict(self, name: str) -> int:
        """Evicts now, on every server, the table's expired rows and those
        of L2 norm below its evict_l2_below; returns the rows evicted."""
        n = ctypes.c_uint64()
        with self._lock:
            self._check(_lib().embps_evict(self._h(), name.encode(),
                                           ctypes.byref(n)))
        return n.value

    def dim(self, name: str) -> int:
        """The dim of table `name` (asked once, then remembered)."""
        if name not in self._dims:
            self._dims[name] = self.describe(name)["dim"]
        return self._dims[name]

    # ---- pull / push ----
    def pull_async(self, name: str, ids: IdsLike,
                   out: Optional[np.ndarray] = None) -> Ticket:
        """Starts a pull of the rows of ids (any shape); the ticket's wait()
        returns them, shape ids.shape + (dim,). out: a C-contiguous
        float32 array of that shape to fill (not read until then)."""
        ids = _ids(ids)
        dim = self.dim(name)
        shape = ids.shape + (dim,)
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        elif (not isinstance(out, np.ndarray) or out.dtype != np.float32
              or out.shape != shape or not out.flags.c_contiguous
              or not out.flags.writeable):
            raise InvalidArgument(EMBPS_EINVAL, "out must be a writable "
                                  "C-contiguous float32 array of shape %s"
                                  % (shape,))
        flat = ids.reshape(-1)
        h = ctypes.c_void_p()
        with self._lock:
            self._check(_lib().embps_pull_async(
                self._h(), name.encode(), _ptr(flat, ctypes.c_int64),
                flat.size, _ptr(out, ctypes.c_float), dim, ctypes.byref(h)))
        return Ticket(self, h, (flat, out), out)

    def pull(self, name: str, ids: IdsLike,
             out: Optional[np.ndarray] = None) -> np.ndarray:
        """Rows of ids (any shape): an array of shape ids.shape + (dim,)
        (out, if given). A row never pushed reads as its initial value."""
        return self.pull_async(name, ids, out).wait()

    def _push_args(self, name: str, indices: IdsLike, values: RowsLike
                   ) -> Tuple[np.ndarray, np.ndarray, int]:
        idx = _ids(indices).reshape(-1)
        dim = self.dim(name)
        vals = np.ascontiguousarray(np.asarray(values, dtype=np.float32))
        if vals.size != idx.size * dim:
            raise error_for(EMBPS_ECOUNT, "push has %d indices but %d values "
                            "(expected %d x %d)" % (idx.size, vals.size,
                                                    idx.size, dim))
        return idx, vals, dim

    def push_async(self, name: str, indices: IdsLike, values: RowsLike,
                   merge: bool = False, step: Optional[int] = None) -> Ticket:
        """Starts a push; the ticket's wait() returns its result. indices
        and values must not change until then: they may be sent from
        where they are."""
        idx, vals, dim = self._push_args(name, indices, values)
        h = ctypes.c_void_p()
        with self._lock:
            self._check(_lib().embps_push_step_async(
                self._h(), name.encode(), _ptr(idx, ctypes.c_int64), idx.size,
                _ptr(vals, ctypes.c_float), dim, PUSH_MERGE if merge else 0,
                int(step or 0), ctypes.byref(h)))
        return Ticket(self, h, (idx, vals))

    def push(self, name: str, indices: IdsLike, values: RowsLike,
             merge: bool = False, step: Optional[int] = None) -> None:
        """Pushes an IndexedSlices gradient (indices, values rows); with
        step, the push for that step of a synchronous table (it returns once
        the step, with every worker's push, is applied).

        A server that stops answering for longer than retry_ms makes a push
        to a cluster fail after the others applied it: PartialError names
        the servers that applied it and those it is owed to. Do not push it
        again (the others would apply it twice): the client sends it again
        to those servers alone, under the same sequence, before anything
        else it sends there, or at resume_pushes(); each applies it once."""
        return self.push_async(name, indices, values, merge, step).wait()

    def resume_pushes(self) -> None:
        """Completes now the pushes owed to servers that stopped answering
        (see push), retrying for retry_ms; raises the error of a server
        still unreachable (they stay owed), or PartialError if a server
        refused one (it stays applied on the others only)."""
        with self._lock:
            self._check(_lib().embps_push_resume(self._h()))

    @property
    def pushes_owed(self) -> int:
        """Pushes owed to servers that stopped answering (see push)."""
        with self._lock:
            return int(_lib().embps_push_owed(self._h()))

    def write_rows(self, name: str, ids: IdsLike, weights: RowsLike) -> int:
        """Sets the rows of distinct ids to weights ([n, dim], rounded to
        float32 and to the table's dtype); their optimizer state starts
        again from its initial value, as after an import without state.
        Each server checks and applies its rows as one mutation, in order
        with pushes, in chunks of about 1 MiB (a failure leaves the chunks
        before it written). Returns n."""
        idx = _ids(ids).reshape(-1)
        dim = self.dim(name)
        w = np.ascontiguousarray(np.asarray(weights, dtype=np.float32))
        if w.shape != (idx.size, dim):
            raise error_for(EMBPS_ECOUNT, "write_rows: weights of shape %s "
                            "for %d ids of dim %d" % (w.shape, idx.size, dim))
        chunk = max(1, (1 << 20) // (8 + 4 * dim))
        with self._lock:
            h = self._h()
            for a in range(0, idx.size, chunk):
                i, r = idx[a:a + chunk], w[a:a + chunk]
                self._check(_lib().embps_write_rows(
                    h, name.encode(), _ptr(i, ctypes.c_int64), i.size,
                    _ptr(r, ctypes.c_float), dim, None, 0, 0))
        return int(idx.size)

    # ---- export / import ----
    def export(self, table: str, dir: Union[str, os.PathLike],
               with_state: bool = False, dense: bool = False) -> int:
        """Writes the rows of table into directory dir as numpy .npy files
        and spec.json; returns the number of rows. Read them with
        numpy.load.

        By default: every row the cluster holds (those a push or import
        made), ids.npy [n] and weights.npy [n, dim] in no particular order;
        with_state also one file per optimizer slot (adam_m.npy, ...).
        dense=True (not with with_state), for a table of fixed size:
        weights.npy [rows, dim] with row i the row of id i for every id,
        pushed or not (as a pull returns it), and no ids.npy: what
        torch.nn.Embedding.from_pretrained(torch.from_numpy(np.load(...)))
        serves with no server. A dynamic table has no row count: dense=True
        writes ids.npy and weights.npy as the default does (README, "Export
        and import", for the lookup)."""
        flags = (EXPORT_STATE if with_state else 0) | \
            (EXPORT_DENSE if dense else 0)
        n = ctypes.c_uint64()
        with self._lock:
            self._check(_lib().embps_export_table(
                self._h(), table.encode(), os.fsencode(dir), flags,
                ctypes.byref(n)))
        return n.value

    def import_(self, table: str, dir: Union[str, os.PathLike],
                with_state: bool = False, create: bool = False) -> int:
        """Writes the rows of directory dir (as export() wrote it, or
        weights.npy [n, dim] and optional ids.npy [n] saved by numpy) into
        table; with_state sets the optimizer state and step too (otherwise
        the rows get their initial state); create makes the table from
        dir/spec.json if it is missing. Returns the number of rows."""
        flags = (IMPORT_STATE if with_state else 0) | \
            (IMPORT_CREATE if create else 0)
        n = ctypes.c_uint64()
        with self._lock:
            self._check(_lib().embps_import_table(
                self._h(), table.encode(), os.fsencode(dir), flags,
                ctypes.byref(n)))
        self._dims.pop(table, None)
        return n.value
