"""_lib.py - libnwc-client through ctypes: finding the library, its structs and prototypes.

Design: the structs below mirror client/nwc_client.h field by field (ctypes lays them out with
the C compiler's rules, so the padding follows); tests/python/test_abi.py compares every size
and offset with a C program compiled against the header.  Every prototype is declared once here
(argtypes and restype), so a call from the package passes exactly the C types.  The library is
looked for, in order:

1. ``$NWC_CLIENT_LIBRARY``: a path to ``libnwc-client.so`` (or ``.so.0``);
2. ``_paths.LIBDIR``: written by CMake into the copy of the package in the build tree (the
   build's ``client/`` folder) and into the installed copy (the installed libdir);
3. the soname ``libnwc-client.so.0`` through the dynamic loader (``ctypes.util.find_library``
   first, then the bare soname: ldconfig's cache, ``LD_LIBRARY_PATH``).

ctypes, not cffi: it is in the standard library (Debian's python3 has it, nothing to install),
nothing is compiled when the package is installed, and the C API is small and stable.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_char, c_char_p, c_float, c_int, c_int64, c_size_t,
                    c_uint, c_uint64, c_void_p)
from typing import Any, Optional, TypeVar

SONAME = "libnwc-client.so.0"


class nwc_client_model(Structure):
    _fields_ = [("name", c_char * 1024), ("tensors", c_uint64), ("raw_bytes", c_uint64),
                ("nwc_bytes", c_uint64), ("resident_bytes", c_uint64), ("created", c_int64),
                ("verified", c_int64)]


class nwc_client_tensor(Structure):
    _fields_ = [("name", c_char * 1024), ("ndim", c_uint), ("shape", c_uint64 * 8),
                ("dtype", c_char * 12), ("elem", c_uint), ("rows", c_uint64), ("cols", c_uint64),
                ("raw_bytes", c_uint64), ("nwc_bytes", c_uint64), ("state", c_int),
                ("pinned", c_int), ("refs", c_uint), ("last_used_ms", c_int64)]


class nwc_client_tensor_info(Structure):
    _fields_ = [("t", nwc_client_tensor), ("conversion", c_char * 64), ("path", c_char * 1024),
                ("offset", c_uint64), ("length", c_uint64), ("nchunks", c_uint64),
                ("nblocks", c_uint64), ("data_bytes", c_uint64), ("format_version", c_uint)]


class nwc_client_resident(Structure):
    _fields_ = [("model", c_char * 1024), ("tensor", c_char * 1024), ("bytes", c_uint64),
                ("pinned", c_int), ("locked", c_int), ("direct", c_int), ("refs", c_uint),
                ("last_used_ms", c_int64), ("maps", c_uint), ("device", c_int)]


class nwc_client_result(Structure):
    _fields_ = [(f, c_uint64) for f in ("tensors", "bytes", "skipped", "micros", "direct",
                                        "buffered", "raw_bytes", "chunks", "problems")]


COUNTER_FIELDS = (
    "uptime_ms", "connections", "conn_total", "requests", "errors", "budget", "resident_bytes",
    "pinned_bytes", "resident_tensors", "loads", "load_bytes", "load_us", "direct_loads",
    "buffered_loads", "evictions", "mlock_ok", "mlock_failed", "mapped_computes",
    "batched_passes", "batched_columns", "threads", "gpu_budget", "gpu_resident_bytes")


class nwc_client_counters(Structure):
    _fields_ = [(f, c_uint64) for f in COUNTER_FIELDS] + [("backend", c_char * 16)]


PLACE_FIELDS = ("budget", "resident_bytes", "resident_tensors", "pinned_bytes", "mem_free",
                "mem_total", "pool_idle")


class nwc_client_place(Structure):
    _fields_ = [("name", c_char * 16)] + [(f, c_uint64) for f in PLACE_FIELDS]


PROGRESS_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_uint64, c_uint64)
VERIFY_FN = ctypes.CFUNCTYPE(None, c_void_p, c_char_p)


class nwc_client_import_opts(Structure):
    _fields_ = [("elem", c_uint), ("layout", c_uint), ("progress", PROGRESS_FN),
                ("ctx", c_void_p)]


class nwc_client_skipped(Structure):
    _fields_ = [("name", c_char * 1024), ("ndim", c_uint), ("shape", c_uint64 * 8),
                ("dtype", c_char * 12)]


class nwc_client_map_info(Structure):
    _fields_ = [("rows", c_uint64), ("cols", c_uint64), ("elem", c_uint), ("base", c_void_p),
                ("size", c_uint64), ("fd", c_int), ("maps", c_uint), ("locked", c_int)]


STRUCTS = (nwc_client_model, nwc_client_tensor, nwc_client_tensor_info, nwc_client_resident,
           nwc_client_result, nwc_client_counters, nwc_client_place, nwc_client_import_opts,
           nwc_client_skipped, nwc_client_map_info)

BF16 = 1  # NWC_CLIENT_BF16
INLINE = 2  # NWC_CLIENT_INLINE
IMPORT_STRICT = 1  # NWC_CLIENT_IMPORT_STRICT
PLAIN_HTTP = 1  # NWC_CLIENT_PLAIN_HTTP
CPU = -1  # NWC_CLIENT_CPU
MAX_COLS = 64  # NWC_CLIENT_MAX_COLS

_P = c_void_p  # nwc_client *, nwc_client_mapping *, and every buffer (passed as an int address)
_S = c_char_p
_R = POINTER(nwc_client_result)
_U64P = POINTER(c_uint64)
_UP = POINTER(c_uint)
_PROTOS = {
    "nwc_client_connect": (c_int, [_S, POINTER(c_void_p)]),
    "nwc_client_free": (None, [_P]),
    "nwc_client_set_spin": (c_int, [_P, c_uint]),
    "nwc_client_last_error": (c_char_p, []),
    "nwc_client_default_socket": (c_char_p, []),
    "nwc_client_backend": (c_char_p, [_P]),
    "nwc_client_daemon_version": (c_char_p, [_P]),
    "nwc_client_models": (c_int, [_P, POINTER(POINTER(nwc_client_model)), POINTER(c_size_t)]),
    "nwc_client_tensors": (c_int, [_P, _S, POINTER(POINTER(nwc_client_tensor)),
                                   POINTER(c_size_t)]),
    "nwc_client_info": (c_int, [_P, _S, _S, POINTER(nwc_client_tensor_info)]),
    "nwc_client_ps": (c_int, [_P, POINTER(POINTER(nwc_client_resident)), POINTER(c_size_t)]),
    "nwc_client_stats": (c_int, [_P, POINTER(nwc_client_counters)]),
    "nwc_client_devices": (c_int, [_P, POINTER(POINTER(nwc_client_place)), POINTER(c_size_t)]),
    "nwc_client_import2": (c_int, [_P, _S, _S, POINTER(nwc_client_import_opts), c_uint, _R,
                                   POINTER(POINTER(nwc_client_skipped)), POINTER(c_size_t)]),
    "nwc_client_remove": (c_int, [_P, _S]),
    "nwc_client_pull": (c_int, [_P, _S, _S, _S, _S, c_uint, PROGRESS_FN, c_void_p, _R, c_char_p]),
    "nwc_client_push": (c_int, [_P, _S, _S, _S, _S, c_uint, PROGRESS_FN, c_void_p, _R, c_char_p]),
    "nwc_client_load_on": (c_int, [_P, _S, _S, c_int, PROGRESS_FN, c_void_p, _R]),
    "nwc_client_load": (c_int, [_P, _S, _S, PROGRESS_FN, c_void_p, _R]),
    "nwc_client_evict": (c_int, [_P, _S, _S, _R]),
    "nwc_client_pin": (c_int, [_P, _S, _S, _R]),
    "nwc_client_pin_on": (c_int, [_P, _S, _S, c_int, PROGRESS_FN, c_void_p, _R]),
    "nwc_client_evict_on": (c_int, [_P, _S, _S, c_int, _R]),
    "nwc_client_load_places": (c_int, [_P, _S, _S, POINTER(c_int), c_size_t, c_uint, PROGRESS_FN,
                                       c_void_p, _R]),
    "nwc_client_unpin": (c_int, [_P, _S, _S, _R]),
    "nwc_client_verify": (c_int, [_P, _S, VERIFY_FN, c_void_p, _R]),
    "nwc_client_dequant": (c_int, [_P, _S, _S, c_uint, _P, c_size_t, _U64P, _U64P, _UP]),
    "nwc_client_gather": (c_int, [_P, _S, _S, _P, c_size_t, c_uint, _P, c_size_t, _U64P, _UP]),
    "nwc_client_matvec": (c_int, [_P, _S, _S, _S, c_float, _P, c_uint64, c_uint, c_uint, _P,
                                  c_size_t, _UP]),
    "nwc_client_map": (c_int, [_P, _S, _S, POINTER(c_void_p)]),
    "nwc_client_unmap": (None, [_P]),
    "nwc_client_mapping_info": (POINTER(nwc_client_map_info), [_P]),
    "nwc_client_map_dequant": (c_int, [_P, c_uint, _P, c_size_t]),
    "nwc_client_map_dequant_rows": (c_int, [_P, c_uint64, c_uint64, c_uint, _P, c_size_t]),
    "nwc_client_map_gather": (c_int, [_P, _P, c_size_t, c_uint, _P, c_size_t]),
    "nwc_client_map_matvec": (c_int, [_P, _P, c_float, _P, c_uint, c_uint, _P, c_size_t]),
}


def _candidates() -> list:
    """Where the library is looked for, in order (see the module's docstring)."""
    out = []
    env = os.environ.get("NWC_CLIENT_LIBRARY")
    if env:
        out.append(env)
    try:
        from . import _paths  # written by CMake (build tree and install); absent in the source
        out.append(os.path.join(_paths.LIBDIR, SONAME))
    except ImportError:
        pass
    found = ctypes.util.find_library("nwc-client")
    if found:
        out.append(found)
    out.append(SONAME)
    return out


_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


def lib() -> ctypes.CDLL:
    """The loaded libnwc-client (loaded on first use); NwcError(ENOENT) naming every place
    tried when none loads."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path} (no such file)")
            continue
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        for name, (res, args) in _PROTOS.items():
            fn = getattr(handle, name)
            fn.restype, fn.argtypes = res, args
        _lib, _lib_path = handle, path
        return handle
    from .errors import NwcError
    import errno
    raise NwcError(errno.ENOENT, "libnwc-client not found; tried: " + "; ".join(tried) +
                   " (set NWC_CLIENT_LIBRARY to its path)")


def lib_path() -> Optional[str]:
    """The path (or soname) the library was loaded from, None before it is loaded."""
    return _lib_path


def last_error() -> str:
    """This thread's last libnwc-client error message (thread-local in the library)."""
    msg = lib().nwc_client_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def check(rc: int) -> int:
    """rc when it is >= 0; otherwise NwcError(-rc, the library's message)."""
    if rc < 0:
        from .errors import NwcError
        raise NwcError(-rc, last_error() or os.strerror(-rc))
    return rc


_C = TypeVar("_C", bound="Closable")


class Closable:
    """close() on leaving a ``with`` block and on garbage collection (quietly: at interpreter
    shutdown the library may be gone), for the handles that own a C object."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class Elem:
    """The properties of an ``elem`` (NWC_ELEM(type, layout)) shared by Tensor and Mapping."""
    elem: int

    @property
    def type(self) -> str:
        """The stored element type: "bf16" or "fp8"."""
        return "fp8" if self.elem & 0xF == 1 else "bf16"

    @property
    def layout(self) -> int:
        """The NWC layout (0, 1, 2)."""
        return (self.elem >> 4) & 0xF


def text(b: bytes) -> str:
    """A fixed char array of a struct as text."""
    return b.decode("utf-8", "replace")
