"""The exceptions of the embps package: EmbpsError and one subclass per
kind of failure, so callers catch what they mean instead of comparing
codes.

Every call that fails raises error_for(code, message): the class of the
code (an EMBPS_* code from embps.h, or a -errno value), carrying .code,
.name (the symbol, e.g. "EMBPS_ENOTABLE" or "ECONNREFUSED") and .message
(the server's or the library's own text). Where Python has a builtin
exception with the same meaning, the class derives from it too, so code
written for builtins catches embps errors as well:

    OutOfRange          IndexError       an id outside a table's rows
    InvalidArgument     ValueError       a bad argument (InvalidParameter,
                                         DimensionMismatch, CountMismatch,
                                         NonFinite, BadFile below it)
    TableNotFound       LookupError      no such table
    ConnectionFailed    ConnectionError  a server could not be reached or
                                         went away (ECONN, ESHUTDOWN,
                                         ECONNREFUSED, ECONNRESET, EPIPE)
    Timeout             TimeoutError     no answer in time
    AuthenticationFailed PermissionError the token was refused
    EmbpsOSError        OSError          any other -errno (.errno set)

Each EMBPS_* code has its class in _CLASS_OF; the python.errors test
checks that every code of the C header (embps/_codes.py, generated) has
one.
"""
import errno as _errno
from typing import Dict, Type

from . import _codes

__all__ = ["EmbpsError", "InvalidArgument", "InvalidParameter",
           "TableNotFound", "TableExists", "DimensionMismatch", "OutOfRange",
           "CountMismatch", "NonFinite", "BadFile", "ProtocolError",
           "AuthenticationFailed", "WrongServer", "ServerOutOfMemory",
           "Timeout", "ConnectionFailed", "LimitExceeded", "StepError",
           "InternalError", "DurabilityError", "PartialError", "NotPrimary",
           "NotEnoughReplicas", "ReplicationError", "EmbpsOSError",
           "error_for", "error_name"]


def error_name(code: int) -> str:
    """The symbol of a code: "EMBPS_ERANGE", "ECONNREFUSED", ... or
    "UNKNOWN"."""
    if code in _codes.CODES:
        return _codes.CODES[code][0]
    if code == 0:
        return "OK"
    return _errno.errorcode.get(-code, "UNKNOWN")


class EmbpsError(Exception):
    """A failed call: .code is the EMBPS_* or -errno code, .name its
    symbol, .message the text without the symbol."""

    code: int
    name: str
    message: str

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        self.name = error_name(code)
        self.message = message
        super().__init__("%s (%s)" % (message, self.name))

    def __reduce__(self):
        return (error_for, (self.code, self.message))


class InvalidArgument(EmbpsError, ValueError):
    """A bad argument (EMBPS_EINVAL)."""


class InvalidParameter(InvalidArgument):
    """A table parameter out of range (EMBPS_EPARAM)."""


class DimensionMismatch(InvalidArgument):
    """Rows of another dim than the table's (EMBPS_EDIM)."""


class CountMismatch(InvalidArgument):
    """Indices and values counts disagree (EMBPS_ECOUNT)."""


class NonFinite(InvalidArgument):
    """A NaN or infinite value in a push or import (EMBPS_ENONFINITE)."""


class BadFile(InvalidArgument):
    """An export/import file that is not what it must be (EMBPS_EBADFILE)."""


class TableNotFound(EmbpsError, LookupError):
    """No table of that name (EMBPS_ENOTABLE)."""


class TableExists(EmbpsError):
    """A table of that name exists already (EMBPS_EEXIST)."""


class OutOfRange(EmbpsError, IndexError):
    """An id outside [0, rows) of a fixed-size table (EMBPS_ERANGE)."""


class ProtocolError(EmbpsError):
    """A malformed or unsupported frame (EMBPS_EPROTO, EVERSION, EKIND,
    EFRAMESIZE)."""


class AuthenticationFailed(EmbpsError, PermissionError):
    """The server refused the token (EMBPS_EAUTH)."""


class WrongServer(EmbpsError):
    """An id sent to a server that does not own it: the server list is
    not the cluster's (EMBPS_EWRONGSERVER)."""


class ServerOutOfMemory(EmbpsError):
    """A server could not allocate (EMBPS_ENOMEM)."""


class Timeout(EmbpsError, TimeoutError):
    """No answer in time (EMBPS_ETIMEDOUT, -ETIMEDOUT)."""


class ConnectionFailed(EmbpsError, ConnectionError):
    """A server could not be reached, or went away (EMBPS_ECONN,
    EMBPS_ESHUTDOWN, -ECONNREFUSED, -ECONNRESET, -EPIPE)."""


class LimitExceeded(EmbpsError):
    """A server limit (frame, table count, capacity) was reached
    (EMBPS_ELIMIT)."""


class StepError(EmbpsError):
    """A synchronous step out of order (EMBPS_ESTEP)."""


class InternalError(EmbpsError):
    """A bug or an impossible state on a server (EMBPS_EINTERNAL)."""


class DurabilityError(EmbpsError):
    """The data dir failed or is missing (EMBPS_EIO, EMBPS_ENODATADIR)."""


class PartialError(EmbpsError):
    """Some servers have it and others do not (EMBPS_EPARTIAL): a table a
    member lost with its data (create_table refuses to refill it silently;
    complete_table does it explicitly), or a push that gave up on a member
    after being applied on the others."""


class NotPrimary(EmbpsError):
    """A write sent to a follower; the message names its primary
    (EMBPS_ENOTPRIMARY)."""


class NotEnoughReplicas(EmbpsError):
    """Too few followers in sync for --sync-followers (EMBPS_ENOREPLICAS):
    refused, nothing changed (push it again), or applied but not
    acknowledged in time, as the message says: the library then keeps it
    owed and sends it again itself, before anything else to that server or
    at resume_pushes() (do not push it again)."""


class ReplicationError(EmbpsError):
    """Between servers: a log that left its primary's history, or records
    the primary no longer holds (EMBPS_EDIVERGED, EMBPS_ESNAPSHOT)."""


class EmbpsOSError(EmbpsError, OSError):
    """A system error (-errno); .errno is set."""


_CLASS_OF: Dict[str, Type[EmbpsError]] = {
    "EMBPS_EINVAL": InvalidArgument,
    "EMBPS_ENOTABLE": TableNotFound,
    "EMBPS_EEXIST": TableExists,
    "EMBPS_EDIM": DimensionMismatch,
    "EMBPS_ERANGE": OutOfRange,
    "EMBPS_ECOUNT": CountMismatch,
    "EMBPS_ENONFINITE": NonFinite,
    "EMBPS_EFRAMESIZE": ProtocolError,
    "EMBPS_EPROTO": ProtocolError,
    "EMBPS_EVERSION": ProtocolError,
    "EMBPS_EAUTH": AuthenticationFailed,
    "EMBPS_EWRONGSERVER": WrongServer,
    "EMBPS_ENOMEM": ServerOutOfMemory,
    "EMBPS_ETIMEDOUT": Timeout,
    "EMBPS_ECONN": ConnectionFailed,
    "EMBPS_ESHUTDOWN": ConnectionFailed,
    "EMBPS_EKIND": ProtocolError,
    "EMBPS_EPARAM": InvalidParameter,
    "EMBPS_ELIMIT": LimitExceeded,
    "EMBPS_ESTEP": StepError,
    "EMBPS_EINTERNAL": InternalError,
    "EMBPS_EIO": DurabilityError,
    "EMBPS_ENODATADIR": DurabilityError,
    "EMBPS_EBADFILE": BadFile,
    "EMBPS_EPARTIAL": PartialError,
    "EMBPS_ENOTPRIMARY": NotPrimary,
    "EMBPS_ENOREPLICAS": NotEnoughReplicas,
    "EMBPS_EDIVERGED": ReplicationError,
    "EMBPS_ESNAPSHOT": ReplicationError,
}

_ERRNO_CLASS: Dict[int, Type[EmbpsError]] = {
    _errno.ECONNREFUSED: ConnectionFailed,
    _errno.ECONNRESET: ConnectionFailed,
    _errno.ECONNABORTED: ConnectionFailed,
    _errno.EPIPE: ConnectionFailed,
    _errno.EHOSTUNREACH: ConnectionFailed,
    _errno.ENETUNREACH: ConnectionFailed,
    _errno.ETIMEDOUT: Timeout,
    _errno.EINVAL: InvalidArgument,
}


def error_for(code: int, message: str) -> EmbpsError:
    """The exception for a failed call's code and message."""
    if code in _codes.CODES:
        cls = _CLASS_OF.get(_codes.CODES[code][0], EmbpsError)
    else:
        cls = _ERRNO_CLASS.get(-code, EmbpsOSError)
    e = cls(code, message)
    if isinstance(e, OSError) and code < 0 and code not in _codes.CODES:
        e.errno = -code
    return e
