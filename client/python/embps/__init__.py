"""embps: Python binding of libembps, the embps parameter-server client.

A thin ctypes layer: numpy arrays go to the C library without copies
(int64 ids, float32 rows), errors come back as EmbpsError carrying the
server's own message. One Client per thread or process, as in C.

    import embps
    c = embps.Client("127.0.0.1:7070")
    c.create_table("emb", dim=16, rows=1000, optimizer="adagrad", lr=0.1)
    rows = c.pull("emb", [3, 1, 3])            # shape (3, 16)
    c.push("emb", [3, 1, 3], grads)            # IndexedSlices, duplicates summed

The shared library is found through $EMBPS_LIBRARY, then next to this
package in a source tree (build/libembps.so), then the system's library path.
"""
import ctypes
import ctypes.util
import os

import numpy as np

__all__ = ["Client", "EmbpsError", "Ticket", "load_library"]

OPTIMIZERS = {"sgd": 0, "adagrad": 1, "adam": 2, "ftrl": 3}
DTYPES = {"f32": 0, "f16": 1, "bf16": 2}  # storage type of the weights
_INITS = {"zeros": 0, "constant": 1, "uniform": 2, "normal": 3}
PUSH_MERGE = 1


class _Spec(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * 128),
        ("dim", ctypes.c_uint32),
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
    ]


class _Info(ctypes.Structure):
    _fields_ = [
        ("spec", _Spec),
        ("rows_allocated", ctypes.c_uint64),
        ("bytes_used", ctypes.c_uint64),
        ("pushes", ctypes.c_uint64),
        ("pulls", ctypes.c_uint64),
        ("step", ctypes.c_uint64),
    ]


class _Stats(ctypes.Structure):
    _fields_ = [
        ("address", ctypes.c_char * 64),
        ("version", ctypes.c_char * 32),
        ("cluster_size", ctypes.c_uint32),
        ("cluster_index", ctypes.c_uint32),
        ("io_threads", ctypes.c_uint32),
        ("shards", ctypes.c_uint32),
    ] + [(f, ctypes.c_uint64) for f in (
        "uptime_ms", "connections", "requests", "pulls", "pushes",
        "pull_rows", "push_rows", "errors", "bytes_in", "bytes_out")] + [
        ("n_tables", ctypes.c_size_t),
        ("tables", ctypes.POINTER(_Info)),
        ("data_dir", ctypes.c_char * 256),
        ("fsync", ctypes.c_char * 16),
    ] + [(f, ctypes.c_uint64) for f in (
        "checkpoint_unix_s", "checkpoint_bytes", "checkpoint_ms",
        "checkpoint_lsn", "log_bytes")] + [
        ("durability_failed", ctypes.c_char * 256),
    ]


class _CheckpointInfo(ctypes.Structure):
    _fields_ = [(f, ctypes.c_uint64)
                for f in ("lsn", "bytes", "duration_ms", "unix_s")]


class _Options(ctypes.Structure):
    _fields_ = [("servers", ctypes.c_char_p), ("token", ctypes.c_char_p),
                ("timeout_ms", ctypes.c_int), ("retry_ms", ctypes.c_int)]


class EmbpsError(Exception):
    """A failed call: .code is the embps or -errno code, .name its symbol."""

    def __init__(self, code, message):
        self.code = code
        self.name = _lib().embps_err_name(code).decode()
        super().__init__("%s (%s)" % (message, self.name))


_LIB = None


def load_library(path=None):
    """Loads libembps (once); returns the ctypes handle."""
    global _LIB
    if _LIB is not None and path is None:
        return _LIB
    candidates = [path, os.environ.get("EMBPS_LIBRARY")]
    here = os.path.dirname(os.path.abspath(__file__))
    candidates.append(os.path.join(here, "..", "..", "..", "build",
                                   "libembps.so"))
    candidates.append(ctypes.util.find_library("embps"))
    for cand in candidates:
        if cand and (os.path.exists(cand) or not os.path.isabs(cand)):
            try:
                lib = ctypes.CDLL(cand)
                break
            except OSError:
                continue
    else:
        raise OSError("libembps not found: set EMBPS_LIBRARY to its path")
    _declare(lib)
    _LIB = lib
    return lib


def _lib():
    return load_library()


def _declare(lib):
    P = ctypes.c_void_p
    i64p = ctypes.POINTER(ctypes.c_int64)
    f32p = ctypes.POINTER(ctypes.c_float)
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
        "embps_describe_table": (ctypes.c_int, [P, ctypes.c_char_p,
                                                ctypes.POINTER(_Info)]),
        "embps_list_tables": (ctypes.c_int, [P,
                                             ctypes.POINTER(ctypes.POINTER(_Info)),
                                             ctypes.POINTER(ctypes.c_size_t)]),
        "embps_stats": (ctypes.c_int, [P, ctypes.POINTER(ctypes.POINTER(_Stats)),
                                       ctypes.POINTER(ctypes.c_size_t)]),
        "embps_stats_free": (None, [ctypes.POINTER(_Stats), ctypes.c_size_t]),
        "embps_checkpoint": (ctypes.c_int, [P, ctypes.POINTER(_CheckpointInfo)]),
        "embps_client_n_servers": (ctypes.c_size_t, [P]),
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
        "embps_route": (ctypes.c_uint32, [ctypes.c_int64, ctypes.c_uint32]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    libc = ctypes.CDLL(None)
    lib._free = libc.free
    lib._free.argtypes = [ctypes.c_void_p]


def _ids(a):
    return np.ascontiguousarray(np.asarray(a, dtype=np.int64))


def _ptr(a, ctype):
    return a.ctypes.data_as(ctypes.POINTER(ctype))


def _spec_dict(s):
    d = {f: getattr(s, f) for f, _ in _Spec._fields_}
    d["name"] = s.name.decode()
    d["optimizer"] = {v: k for k, v in OPTIMIZERS.items()}[s.optimizer]
    d["dtype"] = {v: k for k, v in DTYPES.items()}.get(s.dtype, "unknown")
    d["dynamic"] = bool(s.dynamic)
    return d


def _info_dict(i):
    d = _spec_dict(i.spec)
    for f in ("rows_allocated", "bytes_used", "pushes", "pulls", "step"):
        d[f] = getattr(i, f)
    return d


def route(id_, n_servers):
    """The server (0..n_servers-1) that owns id_: the same hash as C."""
    return int(_lib().embps_route(int(id_), n_servers))


class Ticket:
    """An asynchronous call in flight; wait() returns its result."""

    def __init__(self, client, handle, keep, result=None):
        self._client, self._handle, self._keep = client, handle, keep
        self._result = result

    def wait(self):
        if self._handle is None:
            return self._result
        rc = _lib().embps_wait(self._client._c, self._handle)
        self._handle = None
        if rc:
            self._client._raise(rc)
        return self._result


class Client:
    """Connections to an embps cluster (server list in cluster order)."""

    def __init__(self, servers=None, token=None, timeout_ms=0, retry_ms=0):
        lib = _lib()
        if isinstance(servers, (list, tuple)):
            servers = ",".join(servers)
        opts = _Options(servers.encode() if servers else None,
                        token.encode() if token else None, int(timeout_ms),
                        int(retry_ms))
        handle = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        rc = lib.embps_client_create(ctypes.byref(opts), ctypes.byref(handle),
                                     err, len(err))
        if rc:
            raise EmbpsError(rc, err.value.decode())
        self._c = handle
        self._dims = {}

    def close(self):
        if getattr(self, "_c", None):
            _lib().embps_client_destroy(self._c)
            self._c = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def n_servers(self):
        return int(_lib().embps_client_n_servers(self._c))

    def _raise(self, rc):
        raise EmbpsError(rc, _lib().embps_client_last_error(self._c).decode())

    def _check(self, rc):
        if rc:
            self._raise(rc)

    # ---- tables ----
    def create_table(self, name, dim, rows=None, dynamic=False,
                     optimizer="sgd", init="zeros", init_value=0.0, seed=0,
                     padding_id=None, sync_workers=0, dtype="f32", **params):
        """Creates a table on every server. params: lr, eps, beta1, beta2,
        initial_accumulator, l1, l2, lr_power, weight_decay (defaults per
        optimizer as in DESIGN.md). init: zeros|constant|uniform|normal,
        with init_value the constant, bound or std. dtype: f32|f16|bf16,
        how the server stores the weights (pulls and pushes stay float32;
        optimizer state is float32)."""
        spec = _Spec()
        _lib().embps_table_spec_init(ctypes.byref(spec), name.encode(), dim,
                                     OPTIMIZERS[optimizer])
        spec.rows = rows or 0
        spec.dynamic = int(dynamic)
        spec.init = _INITS[init]
        spec.init_value = init_value
        spec.seed = seed
        if padding_id is not None:
            spec.has_padding, spec.padding_id = 1, padding_id
        spec.sync_workers = sync_workers
        if dtype not in DTYPES:
            raise ValueError("dtype must be one of %s, not %r"
                             % ("|".join(DTYPES), dtype))
        spec.dtype = DTYPES[dtype]
        for k, v in params.items():
            if k not in ("lr", "eps", "beta1", "beta2", "initial_accumulator",
                         "l1", "l2", "lr_power", "weight_decay"):
                raise TypeError("unknown table parameter %r" % k)
            setattr(spec, k, float(v))
        self._check(_lib().embps_create_table(self._c, ctypes.byref(spec)))
        self._dims[name] = dim

    def drop_table(self, name):
        self._dims.pop(name, None)
        self._check(_lib().embps_drop_table(self._c, name.encode()))

    def describe(self, name):
        info = _Info()
        self._check(_lib().embps_describe_table(self._c, name.encode(),
                                                ctypes.byref(info)))
        return _info_dict(info)

    def tables(self):
        p = ctypes.POINTER(_Info)()
        n = ctypes.c_size_t()
        self._check(_lib().embps_list_tables(self._c, ctypes.byref(p),
                                             ctypes.byref(n)))
        out = [_info_dict(p[i]) for i in range(n.value)]
        _lib()._free(p)
        return out

    def stats(self):
        p = ctypes.POINTER(_Stats)()
        n = ctypes.c_size_t()
        self._check(_lib().embps_stats(self._c, ctypes.byref(p),
                                       ctypes.byref(n)))
        out = []
        for i in range(n.value):
            s = p[i]
            text = ("address", "version", "data_dir", "fsync",
                    "durability_failed")
            d = {f: getattr(s, f) for f, _ in _Stats._fields_
                 if f not in ("tables", "n_tables") + text}
            for f in text:
                d[f] = getattr(s, f).decode()
            d["tables"] = [_info_dict(s.tables[t]) for t in range(s.n_tables)]
            out.append(d)
        _lib().embps_stats_free(p, n.value)
        return out

    def checkpoint(self):
        """Takes a checkpoint on every server (--data-dir); returns once each
        is durable, with one dict per server (lsn, bytes, duration_ms,
        unix_s)."""
        n = _lib().embps_client_n_servers(self._c)
        info = (_CheckpointInfo * max(n, 1))()
        self._check(_lib().embps_checkpoint(self._c, info))
        return [{f: getattr(info[i], f) for f, _ in _CheckpointInfo._fields_}
                for i in range(n)]

    def dim(self, name):
        if name not in self._dims:
            self._dims[name] = self.describe(name)["dim"]
        return self._dims[name]

    # ---- pull / push ----
    def pull_async(self, name, ids):
        ids = _ids(ids)
        dim = self.dim(name)
        out = np.empty(ids.shape + (dim,), dtype=np.float32)
        flat = ids.reshape(-1)
        h = ctypes.c_void_p()
        self._check(_lib().embps_pull_async(
            self._c, name.encode(), _ptr(flat, ctypes.c_int64), flat.size,
            _ptr(out, ctypes.c_float), dim, ctypes.byref(h)))
        return Ticket(self, h, (flat, out), out)

    def pull(self, name, ids):
        """Rows of ids (any shape): an array of shape ids.shape + (dim,)."""
        return self.pull_async(name, ids).wait()

    def _push_args(self, name, indices, values):
        idx = _ids(indices).reshape(-1)
        dim = self.dim(name)
        vals = np.ascontiguousarray(np.asarray(values, dtype=np.float32))
        if vals.size != idx.size * dim:
            raise EmbpsError(-30006, "push has %d indices but %d values "
                             "(expected %d x %d)" % (idx.size, vals.size,
                                                     idx.size, dim))
        return idx, vals, dim

    def push_async(self, name, indices, values, merge=False, step=None):
        """Starts a push; the ticket's wait() returns its result. indices
        and values must not change until then: they may be sent from
        where they are."""
        idx, vals, dim = self._push_args(name, indices, values)
        h = ctypes.c_void_p()
        self._check(_lib().embps_push_step_async(
            self._c, name.encode(), _ptr(idx, ctypes.c_int64), idx.size,
            _ptr(vals, ctypes.c_float), dim, PUSH_MERGE if merge else 0,
            int(step or 0), ctypes.byref(h)))
        return Ticket(self, h, (idx, vals))

    def push(self, name, indices, values, merge=False, step=None):
        """Pushes an IndexedSlices gradient (indices, values rows); with
        step, the push for that step of a synchronous table (it returns once
        the step, with every worker's push, is applied)."""
        return self.push_async(name, indices, values, merge, step).wait()
