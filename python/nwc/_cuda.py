"""_cuda.py - the GPU half of the package: GPU maps (nwcd's device copies imported into this
process, docs/gpu-maps.md) and the kernels on them, through the GPU client library libnwc-cuda
(client/nwc_cuda.h) by ctypes.

Design:
  - Every CUDA call is made by libnwc-cuda, never through a Python CUDA binding.  Python passes
    torch's current stream of the map's device (``torch.cuda.current_stream(d).cuda_stream``)
    and tensors' ``data_ptr()``; results are torch tensors allocated by torch on that device, or
    the caller's ``out=``.  The C compute calls only enqueue (no allocation, no sync), and so
    does everything here around them (torch ops on the same stream), so a torch CUDA graph can
    capture them; the first call of a module must be eager when it maps lazily (nwc.torch).
  - Arguments are checked here first (NwcError EINVAL naming the problem): torch tensors on the
    map's device, dtypes, shapes, contiguity, alignment; the library's own refusals raise
    NwcError with nwc_cuda_last_error().
  - x as the kernels take it: layout 0 reads K16 floats of each column (K rounded up to 16, the
    tail zero), both layouts want 16-byte aligned columns with a stride that is a multiple of 4.
    A float32 x that already is so (K a multiple of 16) is passed as it is; any other x is copied
    into the map's staging buffer (8 columns of its widest tensor, allocated with the map, the
    pad zeroed per call) by torch ops on the stream: no allocation per call either way.  Layouts
    1 and 2 also read BF16 x itself (nwc_cuda_matvec_bf16x: 16-byte aligned columns, a stride
    that is a multiple of 8): matvec() passes a bfloat16 x so, with no copy and no conversion.
  - Dequant, dequant_rows and gather write BF16 rows of stride K16; results are [.., cols] views
    of them.  dequant_rows (a range of whole row groups) lets a dense weight be made piece by
    piece through a bounded buffer (nwc.torch's dense path).
  - One map's matvec and linear calls share the library's scratch and the staging buffer, and
    its dense() calls one BF16 buffer: order them on one stream (or join streams by events), as
    nwc_cuda.h says for the scratch.

The library is looked for in order: ``$NWC_CUDA_LIBRARY``, the libdir CMake wrote into
nwc._paths, then the soname libnwc-cuda.so.0; without it (or without a CUDA torch) every GPU call
raises NwcError(ENOTSUP) saying which is missing, and the CPU package works as before.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from ctypes import POINTER, Structure, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Tuple, Union

from . import _arrays, _lib
from .errors import NwcError

SONAME = "libnwc-cuda.so.0"
MAX_COLS = 8  # columns of one matvec call (nwc_cuda_matvec)
ROW_ALIGN = 16  # where a dequant_rows range may start (NWC_CUDA_ROW_ALIGN)


class nwc_cuda_tensor(Structure):
    _fields_ = [("name", c_char_p), ("elem", c_uint), ("rows", c_uint64), ("cols", c_uint64),
                ("k16", c_uint64), ("k", c_void_p), ("bytes", c_uint64)]


_P = c_void_p  # nwc_cuda_map *, nwc_client *, tensors, device pointers, streams (as integers)
_TP = POINTER(nwc_cuda_tensor)
_PROTOS = {
    "nwc_cuda_last_error": (c_char_p, []),
    "nwc_cuda_map_model": (c_int, [_P, c_char_p, c_int, POINTER(c_void_p)]),
    "nwc_cuda_map_tensor": (c_int, [_P, c_char_p, c_char_p, c_int, POINTER(c_void_p)]),
    "nwc_cuda_unmap": (None, [_P]),
    "nwc_cuda_count": (c_size_t, [_P]),
    "nwc_cuda_at": (_TP, [_P, c_size_t]),
    "nwc_cuda_read_only": (c_int, [_P]),
    "nwc_cuda_scratch_bytes": (c_uint64, [_P]),
    "nwc_cuda_matvec": (c_int, [_P, _P, _P, c_uint, c_uint64, _P, _P, _P, c_uint64, _P]),
    "nwc_cuda_matvec_bf16x": (c_int, [_P, _P, _P, c_uint, c_uint64, _P, _P, _P, c_uint64, _P]),
    "nwc_cuda_linear": (c_int, [_P, _P, _P, _P, _P, _P]),
    "nwc_cuda_dequant": (c_int, [_P, _P, _P, _P]),
    "nwc_cuda_dequant_rows": (c_int, [_P, _P, c_uint64, c_uint64, _P, _P]),
    "nwc_cuda_gather": (c_int, [_P, _P, _P, c_uint64, _P, _P]),
}

_tried = False
_lib_handle: Optional[ctypes.CDLL] = None


def load() -> Optional[ctypes.CDLL]:
    """libnwc-cuda with its prototypes declared when it is installed or built, else None
    (looked for once)."""
    global _tried, _lib_handle
    if _tried:
        return _lib_handle
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
            h = ctypes.CDLL(c)
        except OSError:
            continue
        for name, (res, args) in _PROTOS.items():
            fn = getattr(h, name)
            fn.restype, fn.argtypes = res, args
        _lib_handle = h
        break
    return _lib_handle


def _torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def available() -> bool:
    """Whether GPU maps work here: libnwc-cuda loads and torch has CUDA."""
    return load() is not None and _torch_cuda()


def _missing() -> str:
    if load() is None:
        return "libnwc-cuda (the GPU client library) is not installed or built"
    return "libnwc-cuda is there, but torch is not installed or has no CUDA device"


def _check(rc: int) -> None:
    if rc < 0:
        msg = load().nwc_cuda_last_error()
        raise NwcError(-rc, (msg.decode("utf-8", "replace") if msg else "") or os.strerror(-rc))


def _bad(msg: str) -> NwcError:
    return NwcError(errno.EINVAL, msg)


@dataclass(frozen=True)
class GpuTensor(_lib.Elem):
    """One tensor of a GpuMap: ``rows`` x ``cols`` as stored (1-D: 1 x N), ``k16`` (cols rounded
    up to 16: the row stride of dequant and gather output), ``bytes`` of the shared device copy;
    ``type`` and ``layout`` as for nwc.Tensor.  ``ptr`` is the nwc_cuda_tensor *."""
    name: str
    elem: int
    rows: int
    cols: int
    k16: int
    bytes: int
    ptr: int


Tensorish = Union[str, GpuTensor]


class GpuMap(_lib.Closable):
    """nwcd's device copies of a model's tensors (or one) in this process (``Client.map(...,
    device=N)``): lookup by name (``m["w"]``, ``"w" in m``, ``m.tensors``), compute on torch
    CUDA tensors of ``device`` in torch's current stream, ``close()`` (also ``with`` and garbage
    collection) to unmap.  It outlives the Client that made it."""

    def __init__(self, ptr: int, model: str, device: Any, nwc_device: int) -> None:
        import torch
        self._torch = torch
        self._ptr: Optional[int] = ptr
        self._lib = load()
        self.model, self.device, self.nwc_device = model, device, nwc_device
        at = self._lib.nwc_cuda_at
        ts = [at(ptr, i).contents for i in range(self._lib.nwc_cuda_count(ptr))]
        self.tensors: Dict[str, GpuTensor] = {
            t.name.decode(): GpuTensor(t.name.decode(), t.elem, t.rows, t.cols, t.k16, t.bytes,
                                       ctypes.addressof(t)) for t in ts}
        self.read_only: bool = bool(self._lib.nwc_cuda_read_only(ptr))
        self.scratch_bytes: int = self._lib.nwc_cuda_scratch_bytes(ptr)
        widest = max((t.k16 for t in self.tensors.values()), default=0)
        self._stage = torch.zeros(MAX_COLS * widest, dtype=torch.float32, device=device)
        self._dense: Optional[Any] = None

    def __repr__(self) -> str:
        state = " closed" if self._ptr is None else ""
        return (f"<nwc.GpuMap {self.model}: {len(self.tensors)} tensor(s) on {self.device}"
                f"{' read-only' if self.read_only else ''}{state}>")

    @property
    def staging_bytes(self) -> int:
        """Device bytes of the staging buffer for x (8 columns of the widest tensor)."""
        return self._stage.numel() * self._stage.element_size()

    @property
    def dense_bytes(self) -> int:
        """Device bytes of the dense() buffer (0 until the first dense() call)."""
        return 0 if self._dense is None else self._dense.numel() * self._dense.element_size()

    # ---- lifetime and lookup ------------------------------------------------------------------

    def close(self) -> None:
        """Waits for the device and unmaps (again: a no-op); work and graphs that use the map
        must be finished first (nwc_cuda_unmap)."""
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            self._lib.nwc_cuda_unmap(ptr)

    def __getitem__(self, name: str) -> GpuTensor:
        return self.tensor(name)

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def __len__(self) -> int:
        return len(self.tensors)

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def tensor(self, t: Tensorish) -> GpuTensor:
        """t by name (NwcError ENOENT if the map has none) or a GpuTensor of this map (EINVAL
        for another map's); EBADF once closed."""
        if self._ptr is None:
            raise NwcError(errno.EBADF, f"the GPU map of {self.model} is closed")
        if isinstance(t, GpuTensor):
            if self.tensors.get(t.name) is not t:
                raise _bad(f"tensor {t.name} is not one of this GPU map's ({self.model})")
            return t
        got = self.tensors.get(t) if isinstance(t, str) else None
        if got is None:
            raise NwcError(errno.ENOENT, f"no tensor {t!r} in the GPU map of {self.model}")
        return got

    # ---- argument checks ----------------------------------------------------------------------

    def _on_device(self, x: Any, what: str) -> None:
        if not isinstance(x, self._torch.Tensor):
            raise _bad(f"{what} must be a torch tensor, not {type(x).__name__}")
        if x.device != self.device:
            raise _bad(f"{what} is on {x.device}, the GPU map of {self.model} on {self.device}")

    def _out(self, out: Any, what: str, shape: Tuple[int, ...], dtype: Any) -> int:
        """out's address after checking it is a contiguous, 16-byte aligned tensor of dtype and
        shape on this device."""
        self._on_device(out, what)
        if out.dtype != dtype or tuple(out.shape) != shape:
            raise _bad(f"{what} is {out.dtype} {tuple(out.shape)}, it must be {dtype} {shape}")
        if not out.is_contiguous() or out.data_ptr() % 16:
            raise _bad(f"{what} must be contiguous and 16-byte aligned (strides "
                       f"{tuple(out.stride())})")
        return out.data_ptr()

    def _bias(self, t: GpuTensor, bias: Any) -> Optional[int]:
        if bias is None:
            return None
        return self._out(bias, "bias", (t.rows,), self._torch.float32)

    def _x(self, t: GpuTensor, x: Any, cols: int) -> Tuple[int, int, int]:
        """(address, columns, ldx) of x [K] or [n, K] as the kernels read it: x itself where
        it already is in their layout, else the staging buffer filled on the stream."""
        self._on_device(x, "x")
        K = t.cols
        if x.dim() not in (1, 2) or x.shape[-1] != K or not x.dtype.is_floating_point:
            raise _bad(f"x is {x.dtype} {tuple(x.shape)}: {t.name} takes floats [{K}] or "
                       f"[n, {K}]")
        x2 = x if x.dim() == 2 else x.unsqueeze(0)
        n = x2.shape[0]
        if not 1 <= n <= cols:
            raise _bad(f"x has {n} rows: 1..{cols} a call")
        ld = x2.stride(0)
        if (x.dtype == self._torch.float32 and K == t.k16 and x2.stride(1) == 1 and
                x2.data_ptr() % 16 == 0 and (n == 1 or (ld >= K and ld % 4 == 0))):
            return x2.data_ptr(), n, (ld if n > 1 else K)
        buf = self._stage[:n * t.k16].view(n, t.k16)
        buf[:, :K].copy_(x2)
        if K != t.k16:
            buf[:, K:].zero_()
        return buf.data_ptr(), n, t.k16

    def _x_bf16(self, t: GpuTensor, x: Any) -> Optional[Tuple[int, int, int]]:
        """(address, columns, ldx) of a bfloat16 x [K] or [n, K] (n 1..8) that layouts 1 and 2
        read as it is (nwc_cuda_matvec_bf16x), or None (then _x stages it as floats)."""
        torch = self._torch
        if (t.layout == 0 or not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or
                x.dim() not in (1, 2) or x.shape[-1] != t.cols or x.device != self.device):
            return None
        x2 = x if x.dim() == 2 else x.unsqueeze(0)
        n, ld = x2.shape[0], x2.stride(0)
        if (not 1 <= n <= MAX_COLS or x2.stride(1) != 1 or x2.data_ptr() % 16 or
                (n > 1 and (ld < t.cols or ld % 8))):
            return None
        return x2.data_ptr(), n, (ld if n > 1 else t.cols)

    # ---- compute ------------------------------------------------------------------------------

    def _call(self, fn: Any, *args: Any) -> None:
        """fn(map, *args, stream) with this map's device current (the library launches there)."""
        torch = self._torch
        stream = torch.cuda.current_stream(self.device).cuda_stream
        if torch.cuda.current_device() == self.device.index:
            rc = fn(self._ptr, *args, stream)
        else:
            with torch.cuda.device(self.device):
                rc = fn(self._ptr, *args, stream)
        _check(rc)

    def matvec(self, t: Tensorish, x: Any, bias: Any = None, out: Any = None,
               dtype: Any = None) -> Any:
        """y = W x + bias for x [K] or [n, K] (n 1..8, any float dtype) in one pass over the
        weights: y [M] or [n, M], float32 (default) or bfloat16 (dtype), accumulated in
        float32, BF16 rounded to nearest even.  bias: float32 [M] on the device, or None.
        out: a float32 or bfloat16 tensor of y's shape, or a pair (float32, bfloat16) for
        both; then out is returned.  fp8 tensors apply their row scales."""
        t = self.tensor(t)
        torch = self._torch
        bp = self._bias(t, bias)
        xb = self._x_bf16(t, x)  # BF16 x read as it is, else x staged as float32
        xp, n, ldx = xb if xb else self._x(t, x, MAX_COLS)
        shape = (t.rows,) if x.dim() == 1 else (n, t.rows)
        y = y16 = None
        if isinstance(out, tuple):
            if len(out) != 2:
                raise _bad("out as a tuple must be a pair (float32, bfloat16)")
            y = self._out(out[0], "out[0]", shape, torch.float32)
            y16 = self._out(out[1], "out[1]", shape, torch.bfloat16)
        else:
            if out is None:
                bf16 = dtype is not None and _arrays.want_bf16(dtype)
                out = torch.empty(shape, dtype=torch.bfloat16 if bf16 else torch.float32,
                                  device=self.device)
            if isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16:
                y16 = self._out(out, "out", shape, torch.bfloat16)
            else:
                y = self._out(out, "out", shape, torch.float32)
        fn = self._lib.nwc_cuda_matvec_bf16x if xb else self._lib.nwc_cuda_matvec
        self._call(fn, t.ptr, xp, n, ldx, bp, y, y16, t.rows)
        return out

    def linear(self, t: Tensorish, x: Any, bias: Any = None, out: Any = None) -> Any:
        """y = W x + bias for one column x [K] (or [1, K]), BF16 y of x's leading shape plus
        [M] (nwc_cuda_linear); bias float32 [M] or None; out a bfloat16 tensor of y's shape."""
        t = self.tensor(t)
        torch = self._torch
        bp = self._bias(t, bias)
        xp, _, _ = self._x(t, x, 1)
        shape = tuple(x.shape[:-1]) + (t.rows,)
        if out is None:
            out = torch.empty(shape, dtype=torch.bfloat16, device=self.device)
        yp = self._out(out, "out", shape, torch.bfloat16)
        self._call(self._lib.nwc_cuda_linear, t.ptr, xp, bp, yp)
        return out

    def dequant(self, t: Tensorish, out: Any = None) -> Any:
        """The whole tensor as BF16 [rows, cols] (fp8: unscaled values): a view of out, a
        contiguous bfloat16 [rows, k16] tensor (allocated when None) whose rows the library
        writes, bit for bit the stored values."""
        t = self.tensor(t)
        torch = self._torch
        if out is None:
            out = torch.empty((t.rows, t.k16), dtype=torch.bfloat16, device=self.device)
        op = self._out(out, "out", (t.rows, t.k16), torch.bfloat16)
        self._call(self._lib.nwc_cuda_dequant, t.ptr, op)
        return out[:, :t.cols]

    def dequant_rows(self, t: Tensorish, row0: int, nrows: int, out: Any = None) -> Any:
        """Rows [row0, row0 + nrows) of the tensor as BF16 [nrows, cols], bit for bit those
        rows of dequant(): a view of out, a contiguous bfloat16 [nrows, k16] tensor (allocated
        when None).  row0 a multiple of ROW_ALIGN (16), nrows one too or reaching the last
        row (EINVAL otherwise); ENOTSUP where dequant() is (a layout or type the kernels
        lack)."""
        t = self.tensor(t)
        torch = self._torch
        if not (isinstance(row0, int) and isinstance(nrows, int) and 0 <= row0 <= t.rows and
                0 <= nrows <= t.rows - row0 and row0 % ROW_ALIGN == 0 and
                (nrows % ROW_ALIGN == 0 or row0 + nrows == t.rows)):
            raise _bad(f"rows {row0!r} + {nrows!r} of {t.name} ({t.rows} rows): the start must "
                       f"be a multiple of {ROW_ALIGN}, the count too unless it reaches the end")
        if out is None:
            out = torch.empty((nrows, t.k16), dtype=torch.bfloat16, device=self.device)
        op = self._out(out, "out", (nrows, t.k16), torch.bfloat16)
        if nrows:
            self._call(self._lib.nwc_cuda_dequant_rows, t.ptr, row0, nrows, op)
        return out[:, :t.cols]

    def dense(self, t: Tensorish) -> Any:
        """dequant() into this map's one reusable BF16 buffer (grown to the largest tensor
        asked for): valid until the next dense() of this map on the stream."""
        t = self.tensor(t)
        need = t.rows * t.k16
        if self._dense is None or self._dense.numel() < need:
            self._dense = self._torch.empty(need, dtype=self._torch.bfloat16, device=self.device)
        return self.dequant(t, self._dense[:need].view(t.rows, t.k16))

    def gather(self, t: Tensorish, rows: Any, out: Any = None) -> Any:
        """Rows of the tensor by index, BF16 of shape rows.shape + [cols], bit for bit.  rows:
        integers (a sequence, or a torch tensor on the CPU or on this device).  Indices from
        the host are checked (EINVAL naming one out of range); a device tensor is not read
        back (no sync): a row out of range is skipped and its output left zero (or, with
        out=, as it was).  out: a contiguous bfloat16 [n, k16] tensor, n = len of rows."""
        t = self.tensor(t)
        torch = self._torch
        try:
            idx = rows if isinstance(rows, torch.Tensor) else torch.tensor(rows,
                                                                           dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError) as e:
            raise _bad(f"rows must be integers: {e}") from None
        shape = tuple(idx.shape)
        if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
            raise _bad(f"rows must be integers, not {idx.dtype}")
        if idx.device.type == "cpu":
            bad = idx[(idx < 0) | (idx >= t.rows)]
            if bad.numel():
                raise _bad(f"row {int(bad[0])} of {t.name} out of range (it has {t.rows})")
            idx = idx.to(self.device, non_blocking=False)
        self._on_device(idx, "rows")
        idx = idx.to(torch.int64).contiguous()
        n = idx.numel()
        if out is None:
            out = torch.zeros((n, t.k16), dtype=torch.bfloat16, device=self.device)
        op = self._out(out, "out", (n, t.k16), torch.bfloat16)
        if n:
            self._call(self._lib.nwc_cuda_gather, t.ptr, idx.data_ptr(), n, op)
        return out[:, :t.cols].reshape(shape + (t.cols,))


def map(client: Any, model: str, tensor: Optional[str], device: int,
        torch_device: Any = None) -> GpuMap:
    """A GpuMap of model (every tensor when tensor is None) as nwcd holds it on its cuda:device
    (loaded there first if needed), imported into torch's context of torch_device (default
    cuda:device; nwcd's numbering and this process's differ when CUDA_VISIBLE_DEVICES does:
    the library then refuses with ENODEV)."""
    h = load()
    if h is None or not _torch_cuda():
        raise NwcError(errno.ENOTSUP, f"GPU map of {model} on cuda:{device}: {_missing()}; "
                       "map on the CPU (device None) or use the daemon's calls")
    import torch
    dev = torch.device("cuda", device) if torch_device is None else torch.device(torch_device)
    if dev.type != "cuda":
        raise _bad(f"torch_device {torch_device!r} is not a CUDA device")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    out = c_void_p()
    with torch.cuda.device(dev):
        torch.cuda.current_stream(dev)  # torch's context first: the library imports into it
        if tensor is None:
            rc = h.nwc_cuda_map_model(client.handle, model.encode(), device, ctypes.byref(out))
        else:
            rc = h.nwc_cuda_map_tensor(client.handle, model.encode(), tensor.encode(), device,
                                       ctypes.byref(out))
        _check(rc)
        try:
            return GpuMap(out.value, model, dev, device)
        except BaseException:
            h.nwc_cuda_unmap(out.value)
            raise

