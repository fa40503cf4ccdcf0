"""_cuda.py - where the GPU half of the package plugs in: GPU maps (device copies that nwcd
shares with this process) and NwcLinear's fused kernels on them, through the GPU client library
libnwc-cuda (client/, beside libnwc-client).  Every CUDA call is made by that C library, never
through a Python CUDA binding; Python passes torch's current stream and data pointers, and
results come back as torch CUDA tensors (DLPack).

That library is not built yet: this module finds it when it exists ($NWC_CUDA_LIBRARY, the
libdir that CMake wrote into nwc._paths, or the soname libnwc-cuda.so.0) and, until its Python
binding is written here, every GPU call raises NwcError(ENOTSUP) saying so.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from typing import Any, Optional

from .errors import NwcError

SONAME = "libnwc-cuda.so.0"
_tried = False
_lib: Optional[ctypes.CDLL] = None


def load() -> Optional[ctypes.CDLL]:
    """libnwc-cuda when it is installed or built, else None (looked for once)."""
    global _tried, _lib
    if _tried:
        return _lib
    _tried = True
    cands = [os.environ.get("NWC_CUDA_LIBRARY", "")]
    try:
        from . import _paths
        cands.append(os.path.join(_paths.LIBDIR, SONAME))
    except ImportError:
        pass
    cands += [ctypes.util.find_library("nwc-cuda") or "", SONAME]
    for c in cands:
        if not c or (os.sep in c and not os.path.exists(c)):
            continue
        try:
            _lib = ctypes.CDLL(c)
            break
        except OSError:
            continue
    return _lib


def available() -> bool:
    """Whether GPU maps work in this installation (not yet: always False)."""
    return False


def map(client: Any, model: str, tensor: str, device: int) -> Any:
    """A GPU map of model/tensor on cuda:device: NwcError(ENOTSUP) until the GPU half exists."""
    why = ("the Python binding of libnwc-cuda is not written yet" if load() is not None else
           "libnwc-cuda (the GPU client library) is not installed")
    raise NwcError(errno.ENOTSUP, f"GPU map of {model}/{tensor} on cuda:{device}: {why}; "
                   "map on the CPU (device None) or use the daemon's calls")
