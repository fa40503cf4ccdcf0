"""_arrays.py - numpy and torch buffers for the C calls: inputs made contiguous in the C type,
outputs allocated where the caller wants them (numpy, or torch when asked or given torch).

torch is optional and never imported here: a value is a torch tensor only if torch is already
imported (``sys.modules``), which it must be for the caller to hold one.
"""
from __future__ import annotations

import errno
import sys
from typing import Any, Sequence, Tuple

from .errors import NwcError


def np():  # numpy, imported on first use so that control calls work without it
    import numpy
    return numpy


def is_torch(x: Any) -> bool:
    """Whether x is a torch tensor."""
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def want_bf16(dtype: Any) -> bool:
    """True for BF16 output ("bfloat16", "bf16", torch.bfloat16), False for float32
    ("float32", "float", numpy.float32, torch.float32); NwcError(EINVAL) otherwise."""
    name = str(dtype).replace("torch.", "").replace("<class 'numpy.", "").rstrip("'>")
    if name in ("bfloat16", "bf16"):
        return True
    if name in ("float32", "float", "f4", "fp32"):
        return False
    raise NwcError(errno.EINVAL, f"dtype {dtype!r}: nwc returns float32 or bfloat16")


def cpu_only(x: Any, what: str) -> None:
    """NwcError(ENOTSUP) for a torch tensor not in host memory: GPU tensors go to a GPU map."""
    if is_torch(x) and x.device.type != "cpu":
        raise NwcError(errno.ENOTSUP, f"{what} is on {x.device}: the CPU calls take host "
                       "memory; for GPU tensors use a GPU map (Client.map(model, device=...))")


def floats_in(x: Any) -> Tuple[Any, int]:
    """x as contiguous float32 (numpy or torch, as given) and the address of its data."""
    cpu_only(x, "x")
    if is_torch(x):
        x = x.detach().to(dtype=sys.modules["torch"].float32).contiguous()
        return x, x.data_ptr()
    x = np().array(x, dtype=np().float32, copy=False, order="C")  # keeps a 0-d x 0-d
    return x, x.ctypes.data


def rows_in(rows: Any) -> Tuple[Any, int]:
    """Row indices as contiguous 64-bit integers and their address (a negative index reaches
    the daemon as a huge one, which it refuses as out of range)."""
    cpu_only(rows, "rows")
    if is_torch(rows):
        rows = rows.detach().to(dtype=sys.modules["torch"].int64).contiguous()
        return rows, rows.data_ptr()
    a = np().asarray(rows)
    if a.dtype.kind not in "iu" and a.size:
        raise NwcError(errno.EINVAL, f"rows must be integers, not {a.dtype}")
    a = np().ascontiguousarray(a.astype(np().int64 if a.dtype.kind == "i" else np().uint64,
                                        copy=False))
    return a, a.ctypes.data


def out_buffer(out: Any, shape: Sequence[int], bf16: bool) -> Tuple[int, int]:
    """The address and byte size of a caller's output: a contiguous CPU torch tensor
    (bfloat16 / float32) or numpy array (uint16 BF16 bits / float32) of exactly shape."""
    if is_torch(out):
        torch = sys.modules["torch"]
        ok = (out.dtype is (torch.bfloat16 if bf16 else torch.float32) and not out.is_cuda
              and out.is_contiguous())
        addr, nbytes = out.data_ptr(), out.numel() * out.element_size()
    else:
        ok = out.dtype == (np().uint16 if bf16 else np().float32) and out.flags.c_contiguous
        addr, nbytes = out.ctypes.data, out.nbytes
    if not ok or tuple(out.shape) != tuple(shape):
        raise NwcError(errno.EINVAL, "out must be a contiguous CPU "
                       f"{'BF16' if bf16 else 'float32'} array of shape {tuple(shape)}")
    return addr, nbytes


def alloc(shape: Sequence[int], bf16: bool, as_torch: bool) -> Tuple[Any, int, int]:
    """An uninitialized output of shape: torch (float32 / bfloat16) or numpy (float32, or the
    BF16 bits as uint16: numpy has no bfloat16); returns (array, address, bytes)."""
    if as_torch:
        torch = sys.modules.get("torch")
        if torch is None:
            import torch  # noqa: F811 - asked for torch output without holding torch yet
        t = torch.empty(tuple(shape), dtype=torch.bfloat16 if bf16 else torch.float32)
        return t, t.data_ptr(), t.numel() * t.element_size()
    a = np().empty(tuple(shape), dtype=np().uint16 if bf16 else np().float32)
    return a, a.ctypes.data, a.nbytes
