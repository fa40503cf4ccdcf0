"""client.py - nwc.Client: one connection to nwcd through libnwc-client, with methods that
mirror nwcctl (models, tensors, info, import, load, evict, pin, unpin, ps, devices, stats,
verify, rm) and the compute calls (dequant, gather, matvec) returning numpy arrays or torch
tensors.

Design: a Client owns one ``nwc_client *`` (freed by close(), ``with``, or garbage collection).
libnwc-client serializes the calls on one connection with its own mutex and ctypes releases the
GIL during each call, so a Client may be shared by threads (they take turns); open one per
thread for parallel requests.  Outputs are allocated here (numpy or torch) and written by the
library in place: no copy after the call.  Every failure raises nwc.NwcError with the errno and
the daemon's (or the library's) message.  Arrays the library returns (lists of models, tensors,
...) are copied into Python objects and freed with libc's free() at once.
"""
from __future__ import annotations

import ctypes
import errno
import math
from ctypes import byref, c_int, c_size_t, c_void_p
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from . import _arrays, _lib
from ._lib import check, lib, text
from .errors import NwcError
from .mapping import Mapping

_free = ctypes.CDLL(None).free
_free.argtypes, _free.restype = [c_void_p], None

Progress = Union[bool, None, Callable[[int, int], Any]]
Device = Union[None, int, str]
# nwc_client_load_places flags (nwc_client.h NWC_CLIENT_LOAD_PIN, NWC_CLIENT_LOAD_SPLIT)
_LOAD_PIN = 1
_LOAD_SPLIT = 2
# a place, or several (a list or tuple of them: Client.load, Client.pin)
Places = Union[Device, Sequence[Union[int, str]]]


@dataclass
class Model:
    """A model in the store (``nwcctl ls``).  ``tensors`` is how many it holds (their list:
    ``Client.tensors(name)``); sizes in bytes; ``created`` and ``verified`` unix seconds
    (``verified`` 0 if never)."""
    name: str
    tensors: int
    raw_bytes: int
    nwc_bytes: int
    resident_bytes: int
    created: int
    verified: int

    @property
    def ratio(self) -> float:
        """nwc_bytes / raw_bytes (0.0 for an empty model)."""
        return self.nwc_bytes / self.raw_bytes if self.raw_bytes else 0.0


_STATES = {0: "absent", 1: "loading", 2: "resident"}
_LAYOUT_AUTO = 15  # NWC_CLIENT_LAYOUT_AUTO (nwc_client.h): the import's layout chosen per tensor


@dataclass
class Tensor(_lib.Elem):
    """A tensor of a model (``nwcctl ls MODEL``): its source shape and dtype, how it is stored
    (``type`` "bf16" or "fp8", ``layout`` 0..2; ``rows`` x ``cols`` as stored, a 1-D tensor 1 x
    N), its sizes, and its residency (``state`` "absent", "loading" or "resident")."""
    name: str
    shape: Tuple[int, ...]
    dtype: str
    elem: int
    rows: int
    cols: int
    raw_bytes: int
    nwc_bytes: int
    state: str
    pinned: bool
    refs: int
    last_used_ms: int


@dataclass
class TensorInfo(Tensor):
    """``nwcctl info``: a Tensor and where its blob lives in the store."""
    conversion: str = ""
    path: str = ""
    offset: int = 0
    length: int = 0
    nchunks: int = 0
    nblocks: int = 0
    data_bytes: int = 0
    format_version: int = 0


@dataclass
class Resident:
    """A resident tensor (``nwcctl ps``); ``device`` is "cpu" or "cuda:N"."""
    model: str
    tensor: str
    bytes: int
    pinned: bool
    locked: bool
    direct: bool
    refs: int
    last_used_ms: int
    maps: int
    device: str


@dataclass
class Place:
    """Memory of one place (``nwcctl devices``): "cpu" or "cuda:N", budget and use in bytes."""
    name: str
    budget: int
    resident_bytes: int
    resident_tensors: int
    pinned_bytes: int
    mem_free: int
    mem_total: int
    pool_idle: int


@dataclass
class Result:
    """What an import, load, evict, pin, unpin, verify, pull or push did (the fields that apply
    are set, as nwc_client_result says: verify counts the models it checked in ``skipped``, pull
    sets it to 1 when it found the model already there): ``skipped_tensors`` (import) lists the
    tensors left out as (name, shape, dtype); ``problem_lines`` (verify) the problems found;
    ``digest`` (pull, push) the manifest's."""
    tensors: int = 0
    bytes: int = 0
    skipped: int = 0
    micros: int = 0
    direct: int = 0
    buffered: int = 0
    raw_bytes: int = 0
    chunks: int = 0
    problems: int = 0
    skipped_tensors: List[Tuple[str, Tuple[int, ...], str]] = field(default_factory=list)
    problem_lines: List[str] = field(default_factory=list)
    digest: str = ""


def _result(r: _lib.nwc_client_result) -> Result:
    return Result(**{f: getattr(r, f) for f, _ in _lib.nwc_client_result._fields_})


def _tensor_kw(t: _lib.nwc_client_tensor) -> dict:
    return dict(name=text(t.name), shape=tuple(t.shape[i] for i in range(t.ndim)),
                dtype=text(t.dtype), elem=t.elem, rows=t.rows, cols=t.cols,
                raw_bytes=t.raw_bytes, nwc_bytes=t.nwc_bytes,
                state=_STATES.get(t.state, str(t.state)), pinned=bool(t.pinned), refs=t.refs,
                last_used_ms=t.last_used_ms)


def _device_name(d: int) -> str:
    return "cpu" if d == _lib.CPU else f"cuda:{d}"


def device_index(device: Device) -> int:
    """"cpu" (or -1) -> NWC_CLIENT_CPU, "cuda:N" / "cuda" / N -> N; NwcError(EINVAL) else."""
    if isinstance(device, int) and not isinstance(device, bool) and device >= -1:
        return device
    s = str(device)  # also a torch.device
    if s == "cpu":
        return _lib.CPU
    if s == "cuda":
        return 0
    if s.startswith("cuda:") and s[5:].isdigit():
        return int(s[5:])
    raise NwcError(errno.EINVAL, f"device {device!r}: say \"cpu\", \"cuda:N\" or N")


def _enc(s: Optional[str]) -> Optional[bytes]:
    return None if s is None else s.encode()


class _Progress:
    """A progress callback for the C library: tqdm when progress is True and tqdm is
    installed, the caller's function(done, total) (a true return cancels: -ECANCELED), or none.
    An exception in the caller's function stops the wait and is raised again by reraise()."""

    def __init__(self, progress: Progress, desc: str) -> None:
        self.exc: Optional[BaseException] = None
        self.bar = None
        self.user: Optional[Callable[[int, int], Any]] = None
        if callable(progress):
            self.user = progress
        elif progress:
            try:
                from tqdm import tqdm
                self.bar = tqdm(desc=desc, unit="B", unit_scale=True, leave=False)
            except ImportError:
                pass
        live = self.user is not None or self.bar is not None  # bool(tqdm()) raises
        self.fn = _lib.PROGRESS_FN(self._call) if live else _lib.PROGRESS_FN()

    def _call(self, _ctx: Any, done: int, total: int) -> int:
        try:
            if self.bar is not None:
                self.bar.total = total
                self.bar.update(done - self.bar.n)
            if self.user is not None and self.user(done, total):
                return 1
            return 0
        except BaseException as e:  # noqa: B902 - carried across the C frame, raised again
            self.exc = e
            return 1

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def reraise(self) -> None:
        if self.exc is not None:
            raise self.exc


class Client(_lib.Closable):
    """A connection to nwcd (``nwc.connect()``).  Use it as a context manager, or close() it.

    Tensors are named by model and tensor name as in the model's safetensors.  Compute calls
    return numpy arrays (float32, or BF16 bits as uint16), or torch tensors (float32 or
    bfloat16) when given torch inputs or ``as_torch=True``."""

    def __init__(self, path: Optional[str] = None) -> None:
        """Connects to path; None: ``$NWC_SOCKET``, else the default socket (as nwcctl)."""
        self._h: Optional[int] = None
        h = c_void_p()
        check(lib().nwc_client_connect(_enc(path), byref(h)))
        self._h = h.value
        self.path: str = path if path is not None else default_socket()

    # ---- the connection -----------------------------------------------------------------------

    def close(self) -> None:
        """Closes the connection (again: a no-op).  Mappings made through it stay valid."""
        h, self._h = self._h, None
        if h is not None:
            lib().nwc_client_free(h)

    def __repr__(self) -> str:
        state = "closed" if self._h is None else f"backend {self.backend}"
        return f"<nwc.Client {self.path} {state}>"

    @property
    def handle(self) -> int:
        """The ``nwc_client *`` (for other C libraries); NwcError(EBADF) once closed."""
        if self._h is None:
            raise NwcError(errno.EBADF, "the nwc connection is closed")
        return self._h

    @property
    def backend(self) -> str:
        """The daemon's compute backend ("cpu" or "cuda"), from the handshake."""
        return (lib().nwc_client_backend(self.handle) or b"").decode()

    @property
    def daemon_version(self) -> str:
        """The daemon's version string, from the handshake."""
        return (lib().nwc_client_daemon_version(self.handle) or b"").decode()

    def set_spin(self, spin_us: int) -> None:
        """How long a call polls for its reply before it sleeps (nwc_client_set_spin)."""
        check(lib().nwc_client_set_spin(self.handle, spin_us))

    # ---- catalog --------------------------------------------------------------------------------

    def _list_copy(self, fn: Any, ctype: Any, conv: Callable[[Any], Any], *args: Any) -> list:
        p, n = ctypes.POINTER(ctype)(), c_size_t()
        check(fn(self.handle, *args, byref(p), byref(n)))
        try:
            return [conv(p[i]) for i in range(n.value)]
        finally:
            _free(ctypes.cast(p, c_void_p).value)

    def models(self) -> List[Model]:
        """The store's models (``nwcctl ls``)."""
        return self._list_copy(
            lib().nwc_client_models, _lib.nwc_client_model,
            lambda m: Model(text(m.name), m.tensors, m.raw_bytes, m.nwc_bytes, m.resident_bytes,
                            m.created, m.verified))

    def tensors(self, model: str) -> List[Tensor]:
        """The tensors of model (``nwcctl ls MODEL``); NwcError(ENOENT) for an unknown one."""
        return self._list_copy(lib().nwc_client_tensors, _lib.nwc_client_tensor,
                               lambda t: Tensor(**_tensor_kw(t)), model.encode())

    def info(self, model: str, tensor: str) -> TensorInfo:
        """One tensor in detail (``nwcctl info MODEL/TENSOR``)."""
        i = _lib.nwc_client_tensor_info()
        check(lib().nwc_client_info(self.handle, model.encode(), tensor.encode(), byref(i)))
        return TensorInfo(**_tensor_kw(i.t), conversion=text(i.conversion), path=text(i.path),
                          offset=i.offset, length=i.length, nchunks=i.nchunks,
                          nblocks=i.nblocks, data_bytes=i.data_bytes,
                          format_version=i.format_version)

    def ps(self) -> List[Resident]:
        """The resident tensors (``nwcctl ps``)."""
        return self._list_copy(
            lib().nwc_client_ps, _lib.nwc_client_resident,
            lambda r: Resident(text(r.model), text(r.tensor), r.bytes, bool(r.pinned),
                               bool(r.locked), bool(r.direct), r.refs, r.last_used_ms, r.maps,
                               _device_name(r.device)))

    def devices(self) -> List[Place]:
        """Memory per place, host first, then each CUDA device (``nwcctl devices``)."""
        return self._list_copy(
            lib().nwc_client_devices, _lib.nwc_client_place,
            lambda p: Place(text(p.name), *(getattr(p, f) for f in _lib.PLACE_FIELDS)))

    def stats(self) -> dict:
        """The daemon's counters (``nwcctl stats``): a dict of the names in nwc_client.h's
        nwc_client_counters, ints, and "backend"."""
        c = _lib.nwc_client_counters()
        check(lib().nwc_client_stats(self.handle, byref(c)))
        out: dict = {f: getattr(c, f) for f in _lib.COUNTER_FIELDS}
        out["backend"] = text(c.backend)
        return out

    # ---- store and residency --------------------------------------------------------------------

    def import_(self, name: str, path: str, elem: Union[None, int, str] = None,
                layout: Union[None, int, str] = None, progress: Progress = True,
                strict: bool = False) -> Result:
        """Imports path (a .safetensors file, or a sharded model's ``*.json`` index) as model
        name (``nwcctl import``).  elem: None or "bf16" (keep), "fp8" (quantize per row);
        layout: None or "auto" (per tensor: 2 for BF16 matrices of at least 16 rows, 0 for the
        rest, as nwcctl), 0, 1, 2.  progress: True shows a tqdm bar where tqdm is installed, a
        function(done, total) is called instead (a true return stops waiting: NwcError
        ECANCELED, while the daemon finishes the import), False shows nothing.  strict: a tensor
        nwc does not store (integer, bool, empty) fails the import instead of being skipped
        (then ``Result.skipped_tensors`` lists them, at most 1024)."""
        elems = {None: 0, "bf16": 0, "fp8": 1, 0: 0, 1: 1}
        if elem not in elems:
            raise NwcError(errno.EINVAL, f"elem {elem!r}: say \"bf16\" or \"fp8\"")
        layouts = {None: _LAYOUT_AUTO, "auto": _LAYOUT_AUTO, 0: 0, 1: 1, 2: 2}
        if layout not in layouts:
            raise NwcError(errno.EINVAL, f"layout {layout!r}: say \"auto\", 0, 1 or 2")
        pr = _Progress(progress, f"import {name}")
        opts = _lib.nwc_client_import_opts(elems[elem], layouts[layout], pr.fn, None)
        res = _lib.nwc_client_result()
        sk, nsk = ctypes.POINTER(_lib.nwc_client_skipped)(), c_size_t()
        try:
            rc = lib().nwc_client_import2(self.handle, name.encode(), str(path).encode(),
                                          byref(opts), _lib.IMPORT_STRICT if strict else 0,
                                          byref(res), byref(sk), byref(nsk))
            skipped = [(text(s.name), tuple(s.shape[i] for i in range(s.ndim)), text(s.dtype))
                       for s in (sk[i] for i in range(nsk.value))]
        finally:
            _free(ctypes.cast(sk, c_void_p).value)
            pr.close()
        pr.reraise()
        check(rc)
        out = _result(res)
        out.skipped_tensors = skipped
        return out

    def pull(self, ref: str, name: Optional[str] = None, *, user: Optional[str] = None,
             secret: Optional[str] = None, plain_http: bool = False,
             progress: Progress = True) -> Result:
        """Pulls an nwc model from an OCI registry into the store (``nwcctl pull``; docs/oci.md):
        ref "host[:port]/repository[:tag|@sha256:...]", stored as name (None: the name it was
        pushed under).  user and secret: credentials for the registry; both None for the
        caller's as docker and podman keep them.  plain_http: http:// (a local registry).  The
        Result's ``digest`` is the manifest's; ``skipped`` is 1 when name was already pulled from
        it (nothing done).  progress as for import_."""
        return self._registry(lib().nwc_client_pull, ref, name, ref, user, secret, plain_http,
                              progress, f"pull {ref}")

    def push(self, model: str, ref: str, *, user: Optional[str] = None,
             secret: Optional[str] = None, plain_http: bool = False,
             progress: Progress = True) -> Result:
        """Pushes a stored model to an OCI registry as an nwc artifact (``nwcctl push``): blobs
        the registry has are not sent again.  Arguments as for pull; ``digest`` is the
        manifest's."""
        return self._registry(lib().nwc_client_push, model, ref, ref, user, secret, plain_http,
                              progress, f"push {model}")

    def _registry(self, fn, a: str, b: Optional[str], ref: str, user: Optional[str],
                  secret: Optional[str], plain_http: bool, progress: Progress, what: str) -> Result:
        if (user is None) != (secret is None):
            raise NwcError(errno.EINVAL, "give both user and secret, or neither")
        enc = (lambda v: None if v is None else v.encode())
        pr = _Progress(progress, what)
        res = _lib.nwc_client_result()
        digest = ctypes.create_string_buffer(73)
        try:
            rc = fn(self.handle, enc(a), enc(b), enc(user), enc(secret),
                    _lib.PLAIN_HTTP if plain_http else 0, pr.fn, None, byref(res), digest)
        finally:
            pr.close()
        pr.reraise()
        check(rc)
        out = _result(res)
        out.digest = digest.value.decode()
        return out

    def remove(self, model: str) -> None:
        """Removes model from the store (``nwcctl rm``)."""
        check(lib().nwc_client_remove(self.handle, model.encode()))

    def load(self, model: str, tensor: Optional[str] = None, device: Places = None,
             progress: Progress = True, split: bool = False) -> Result:
        """Makes model's tensors (or one) resident (``nwcctl load``): device None for the
        tensor's resident replica or home (else the daemon's default place), or "cpu" or
        "cuda:N" for a replica there (one per place), or a list of places: a replica on each
        from one read of each blob (``Result.raw_bytes``: the bytes the daemon read; the home
        becomes the lowest GPU named, else "cpu"); with split=True (a list of places, no
        tensor) each tensor goes to ONE of them instead (``nwcctl load --split``: natural name
        order, each at the first of cuda:0, cuda:1, ..., cpu whose free budget takes it, nothing
        evicted; a tensor that fits nowhere raises ENOSPC, nothing loaded; ``ps()`` says where
        each went); progress as for import_."""
        return self._on_place("load", model, tensor, device, progress, split)

    def _on_place(self, what: str, model: str, tensor: Optional[str], device: Device,
                  progress: Progress, split: bool = False) -> Result:
        if split and (not isinstance(device, (list, tuple)) or tensor is not None):
            raise ValueError("split spreads a model's tensors over a list of places: "
                             "device=[...] and no tensor")
        pr = _Progress(progress, f"{what} {model}")
        res = _lib.nwc_client_result()
        try:
            if isinstance(device, (list, tuple)):
                at = [device_index(d) for d in device]
                arr = (c_int * max(len(at), 1))(*at)
                flags = (_LOAD_PIN if what == "pin" else 0) | (_LOAD_SPLIT if split else 0)
                rc = lib().nwc_client_load_places(self.handle, model.encode(), _enc(tensor), arr,
                                                  len(at), flags, pr.fn, None, byref(res))
            elif device is None and what == "load":
                rc = lib().nwc_client_load(self.handle, model.encode(), _enc(tensor), pr.fn, None,
                                           byref(res))
            else:
                fn = lib().nwc_client_load_on if what == "load" else lib().nwc_client_pin_on
                rc = fn(self.handle, model.encode(), _enc(tensor), device_index(device), pr.fn,
                        None, byref(res))
        finally:
            pr.close()
        pr.reraise()
        check(rc)
        return _result(res)

    def _residency(self, fn: Any, model: str, tensor: Optional[str]) -> Result:
        res = _lib.nwc_client_result()
        check(fn(self.handle, model.encode(), _enc(tensor), byref(res)))
        return _result(res)

    def evict(self, model: str, tensor: Optional[str] = None, device: Device = None) -> Result:
        """Drops model's resident tensors (or one) (``nwcctl evict``): every replica, or with
        device ("cpu", "cuda:N") the one there."""
        if device is None:
            return self._residency(lib().nwc_client_evict, model, tensor)
        res = _lib.nwc_client_result()
        check(lib().nwc_client_evict_on(self.handle, model.encode(), _enc(tensor),
                                        device_index(device), byref(res)))
        return _result(res)

    def pin(self, model: str, tensor: Optional[str] = None, device: Places = None,
            split: bool = False) -> Result:
        """Loads and pins (never evicted by the budget) (``nwcctl pin``): device None for the
        replica a request would use, or "cpu" or "cuda:N" for the replica there, or a list of
        places (as for load: one read of each blob; with split=True each tensor at its one
        place, pinned there)."""
        if device is None and not split:
            return self._residency(lib().nwc_client_pin, model, tensor)
        return self._on_place("pin", model, tensor, device, False, split)

    def unpin(self, model: str, tensor: Optional[str] = None) -> Result:
        """Unpins (``nwcctl unpin``)."""
        return self._residency(lib().nwc_client_unpin, model, tensor)

    def verify(self, model: Optional[str] = None) -> Result:
        """Checks every chunk's checksum of model (None: every model) (``nwcctl verify``):
        ``problems`` counts what is wrong and ``problem_lines`` says it."""
        lines: List[str] = []
        cb = _lib.VERIFY_FN(lambda _ctx, line: lines.append(line.decode("utf-8", "replace")))
        res = _lib.nwc_client_result()
        check(lib().nwc_client_verify(self.handle, _enc(model), cb, None, byref(res)))
        out = _result(res)
        out.problem_lines = lines
        return out

    # ---- compute --------------------------------------------------------------------------------

    def _shape(self, model: str, tensor: str) -> TensorInfo:
        return self.info(model, tensor)

    def dequant(self, model: str, tensor: str, dtype: Any = "float32",
                as_torch: bool = False) -> Any:
        """The whole tensor, decoded, in its own shape: float32, or (dtype "bfloat16") BF16
        (numpy uint16 bits, or torch.bfloat16 with as_torch).  fp8 tensors give their unscaled
        fp8 values."""
        t = self._shape(model, tensor)
        bf16 = _arrays.want_bf16(dtype)
        out, ptr, cap = _arrays.alloc((t.rows, t.cols), bf16, as_torch)
        check(lib().nwc_client_dequant(self.handle, model.encode(), tensor.encode(),
                                       _lib.BF16 if bf16 else 0, ptr, cap, None, None, None))
        return out.reshape(t.shape) if math.prod(t.shape) == t.rows * t.cols else out

    def gather(self, model: str, tensor: str, rows: Any, dtype: Any = "float32",
               as_torch: Optional[bool] = None) -> Any:
        """Rows of the tensor by index (an embedding lookup): rows of any shape S (ints, numpy
        or torch integers) give S + [cols].  Torch rows give a torch tensor unless as_torch is
        False.  NwcError(EINVAL) naming a row out of range."""
        t = self._shape(model, tensor)
        bf16 = _arrays.want_bf16(dtype)
        idx, iptr = _arrays.rows_in(rows)
        torch_out = _arrays.is_torch(rows) if as_torch is None else as_torch
        shape = tuple(idx.shape)
        n = math.prod(shape)
        out, ptr, cap = _arrays.alloc((n, t.cols), bf16, torch_out)
        if n:
            check(lib().nwc_client_gather(self.handle, model.encode(), tensor.encode(), iptr, n,
                                          _lib.BF16 if bf16 else 0, ptr, cap, None, None))
        return out.reshape(shape + (t.cols,))

    def matvec(self, model: str, tensor: str, x: Any, bias: Optional[str] = None,
               scale: float = 1.0, dtype: Any = "float32", as_torch: Optional[bool] = None,
               inline: bool = False) -> Any:
        """y = scale * (W x) + bias for x of shape [K] or [n, K] (or [..., K]), W the tensor as
        stored (M rows, K cols): y of shape [M] or [n, M].  bias names a tensor of M values in
        the same model.  Torch x gives a torch y unless as_torch is False; dtype "bfloat16"
        returns BF16.  inline: x and y in the frames, not the shared region.  NwcError(EINVAL)
        for an x whose last dimension is not K (the daemon's message says what it wanted)."""
        t = self._shape(model, tensor)
        bf16 = _arrays.want_bf16(dtype)
        xs, xptr = _arrays.floats_in(x)
        torch_out = _arrays.is_torch(x) if as_torch is None else as_torch
        if xs.ndim == 0:
            raise NwcError(errno.EINVAL, "x must have shape [K] or [n, K], not a scalar")
        K = xs.shape[-1]
        lead = tuple(xs.shape[:-1])
        n = math.prod(lead)
        out, ptr, cap = _arrays.alloc((n, t.rows), bf16, torch_out)
        if n:
            flags = (_lib.BF16 if bf16 else 0) | (_lib.INLINE if inline else 0)
            check(lib().nwc_client_matvec(self.handle, model.encode(), tensor.encode(),
                                          _enc(bias), scale, xptr, K, n, flags, ptr, cap, None))
        return out.reshape(lead + (t.rows,))

    # ---- mappings -------------------------------------------------------------------------------

    def map(self, model: str, tensor: Optional[str] = None, device: Device = None,
            torch_device: Any = None) -> Any:
        """Maps a resident tensor (loading it if needed) into this process.  device None or
        "cpu": a host map (nwc.Mapping) of tensor, read-only, the daemon's own copy decoded
        here with no round trip.  device "cuda:N" (or N): a GPU map (nwc.GpuMap) of nwcd's
        copies on its cuda:N, of tensor or, when tensor is None, of every tensor of model,
        imported into torch's context of torch_device (default cuda:N), computed on in torch's
        current stream; NwcError(ENOTSUP) without libnwc-cuda or a CUDA torch."""
        if device is not None and device_index(device) != _lib.CPU:
            from . import _cuda
            return _cuda.map(self, model, tensor, device_index(device), torch_device)
        if tensor is None:
            raise NwcError(errno.EINVAL, f"a host map of {model} needs a tensor name (whole "
                           "models are mapped on a GPU only)")
        h = c_void_p()
        check(lib().nwc_client_map(self.handle, model.encode(), tensor.encode(), byref(h)))
        return Mapping(h.value, model, tensor)


def default_socket() -> str:
    """The socket a Client connects to by default: ``$NWC_SOCKET``, else
    ``$XDG_RUNTIME_DIR/nwc/nwcd.sock``, else /run/nwc/nwcd.sock as root (libnwc-client's rule)."""
    return lib().nwc_client_default_socket().decode()


def connect(path: Optional[str] = None) -> Client:
    """A Client connected to nwcd at path (None: ``$NWC_SOCKET`` or the default socket)."""
    return Client(path)

