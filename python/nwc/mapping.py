"""mapping.py - nwc.Mapping: a resident tensor mapped read-only into this process
(nwc_client_map), decoded and multiplied here with no round trip to nwcd.

Zero-copy views: the mapping is the daemon's own copy of the tensor's blob (the layout in
docs/store.md, "Blobs"), entropy-coded, so its weights cannot be viewed as a dense array; what
can be viewed without a copy is the blob itself (``blob``, uint8), its raw plane (``raw_plane``:
the low byte of every BF16 weight, stored plain; [rows, K16] for BF16 layout 0, K16 = cols
rounded up to 16) and the per-row fp32 scales of an fp8 tensor (``scales``).  Those views are
read-only numpy arrays that keep the mapping alive: close() releases the mapping only once no
view of it is left (until then the pages stay mapped, and the daemon keeps the tensor).
dequant(), gather() and matvec() decode into new arrays.
"""
from __future__ import annotations

import ctypes
import errno
import math
import struct
from typing import Any, Optional

from . import _arrays, _lib
from ._lib import check, lib
from .errors import NwcError


class _Handle:
    """Owns one nwc_client_mapping *: unmapped when the last reference (the Mapping, a view)
    goes away."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __del__(self) -> None:
        if self.ptr:
            try:
                lib().nwc_client_unmap(self.ptr)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass
            self.ptr = 0


class Mapping(_lib.Elem):
    """A host mapping of model/tensor (``Client.map``).  Its calls may run from many threads
    at once, and it stays valid after the Client that made it is closed."""

    def __init__(self, ptr: int, model: str, tensor: str) -> None:
        self._h: Optional[_Handle] = _Handle(ptr)
        self.model, self.tensor = model, tensor
        i = lib().nwc_client_mapping_info(ptr).contents
        self.rows: int = i.rows
        self.cols: int = i.cols
        self.elem: int = i.elem
        self.size: int = i.size
        self.fd: int = i.fd
        self.maps: int = i.maps
        self.locked: bool = bool(i.locked)
        self._base: int = i.base

    def __repr__(self) -> str:
        return (f"<nwc.Mapping {self.model}/{self.tensor} {self.rows}x{self.cols} "
                f"{self.type} layout {self.layout}{' closed' if self._h is None else ''}>")

    @property
    def shape(self) -> tuple:
        """(rows, cols) as stored."""
        return (self.rows, self.cols)

    def _ptr(self) -> int:
        if self._h is None:
            raise NwcError(errno.EBADF, f"the mapping of {self.model}/{self.tensor} is closed")
        return self._h.ptr

    def close(self) -> None:
        """Drops this object's hold on the mapping: it is unmapped (and the daemon may evict
        the tensor) once no view from blob/raw_plane/scales is alive either."""
        self._h = None

    def __enter__(self) -> "Mapping":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- zero-copy views --------------------------------------------------------------------

    def _view(self, offset: int, count: int, dtype: str) -> Any:
        np = _arrays.np()
        itemsize = np.dtype(dtype).itemsize
        if offset + count * itemsize > self.size:
            raise NwcError(errno.EBADMSG, f"{self.model}/{self.tensor}: blob section outside "
                           "the mapping")
        self._ptr()
        buf = (ctypes.c_uint8 * (count * itemsize)).from_address(self._base + offset)
        buf._nwc_handle = self._h  # the view's buffer keeps the mapping alive
        a = np.frombuffer(buf, dtype=dtype, count=count)
        a.flags.writeable = False
        return a

    def _header(self, offset: int) -> int:
        return struct.unpack_from("<Q", self.blob[offset:offset + 8].tobytes())[0]

    @property
    def blob(self) -> Any:
        """The whole mapped blob as a read-only uint8 numpy array (no copy)."""
        self._ptr()
        return self._view(0, self.size, "uint8")

    @property
    def raw_plane(self) -> Any:
        """The raw plane (no copy), read-only uint8: the low bytes of the weights ([rows, K16]
        for BF16 layout 0, flat otherwise; fp8: the low nibbles, two per byte)."""
        nbytes, off = self._header(64), self._header(96)
        a = self._view(off, nbytes, "uint8")
        k16 = (self.cols + 15) // 16 * 16
        if self.type == "bf16" and self.layout == 0 and nbytes == self.rows * k16:
            return a.reshape(self.rows, k16)
        return a

    @property
    def scales(self) -> Optional[Any]:
        """The per-row fp32 scales of an fp8 tensor (no copy), None for a tensor without."""
        off = self._header(104)
        return self._view(off, self.rows, "<f4") if off else None

    # ---- decoding -----------------------------------------------------------------------------

    def dequant(self, dtype: Any = "float32", as_torch: bool = False) -> Any:
        """The whole tensor, [rows, cols], float32 or BF16 (as Client.dequant)."""
        bf16 = _arrays.want_bf16(dtype)
        out, ptr, cap = _arrays.alloc((self.rows, self.cols), bf16, as_torch)
        check(lib().nwc_client_map_dequant(self._ptr(), _lib.BF16 if bf16 else 0, ptr, cap))
        return out

    def dequant_rows(self, row0: int, nrows: int, dtype: Any = "float32", as_torch: bool = False,
                     out: Any = None) -> Any:
        """Rows [row0, row0 + nrows), [nrows, cols], float32 or BF16, into out when given (a
        contiguous array or tensor of that shape and dtype, e.g. a view of a reused buffer):
        a dense weight in bounded pieces.  A range outside the tensor: NwcError EINVAL."""
        bf16 = _arrays.want_bf16(dtype)
        if out is None:
            out, ptr, cap = _arrays.alloc((nrows, self.cols), bf16, as_torch)
        else:
            ptr, cap = _arrays.out_buffer(out, (nrows, self.cols), bf16)
        check(lib().nwc_client_map_dequant_rows(self._ptr(), row0, nrows, _lib.BF16 if bf16 else 0,
                                                ptr, cap))
        return out

    def gather(self, rows: Any, dtype: Any = "float32", as_torch: Optional[bool] = None) -> Any:
        """Rows by index, shape rows.shape + [cols] (as Client.gather)."""
        bf16 = _arrays.want_bf16(dtype)
        idx, iptr = _arrays.rows_in(rows)
        torch_out = _arrays.is_torch(rows) if as_torch is None else as_torch
        n = math.prod(idx.shape)
        out, ptr, cap = _arrays.alloc((n, self.cols), bf16, torch_out)
        if n:
            check(lib().nwc_client_map_gather(self._ptr(), iptr, n, _lib.BF16 if bf16 else 0, ptr,
                                              cap))
        return out.reshape(tuple(idx.shape) + (self.cols,))

    def matvec(self, x: Any, bias: Any = None, scale: float = 1.0, dtype: Any = "float32",
               as_torch: Optional[bool] = None) -> Any:
        """y = scale * (W x) + bias for x of shape [cols] or [n, cols]; bias: None or rows
        floats (an array, not a tensor name)."""
        bf16 = _arrays.want_bf16(dtype)
        xs, xptr = _arrays.floats_in(x)
        torch_out = _arrays.is_torch(x) if as_torch is None else as_torch
        if xs.ndim == 0 or xs.shape[-1] != self.cols:
            raise NwcError(errno.EINVAL, f"x of shape {tuple(xs.shape)} for {self.model}/"
                           f"{self.tensor}: its last dimension must be {self.cols}")
        b, bptr = (None, None)
        if bias is not None:
            b, bptr = _arrays.floats_in(bias)
            if tuple(b.shape) != (self.rows,):
                raise NwcError(errno.EINVAL, f"bias of shape {tuple(b.shape)} for "
                               f"{self.model}/{self.tensor}: it must be [{self.rows}]")
        lead = tuple(xs.shape[:-1])
        n = math.prod(lead)
        out, ptr, cap = _arrays.alloc((n, self.rows), bf16, torch_out)
        if n:
            check(lib().nwc_client_map_matvec(self._ptr(), bptr, scale, xptr, n,
                                              _lib.BF16 if bf16 else 0, ptr, cap))
        return out.reshape(lead + (self.rows,))
