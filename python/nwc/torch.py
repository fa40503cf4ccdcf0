"""nwc.torch - PyTorch modules on weights that nwcd keeps compressed.

NwcLinear is a drop-in for nn.Linear (inference only: no gradients flow to the weights): an input
of 1..dense_rows rows (8 by default) is one matvec of the daemon (or of a host map, mapped=True),
which decodes the weights inside the product; more rows dequantize the weight from a host map a
chunk of output rows at a time into one bounded BF16 scratch shared by every NwcLinear of the
process (set_dense_scratch_bytes) and multiply each chunk with torch's matmul.  NwcEmbedding is
nn.Embedding's lookup through the daemon's gather.  patch() swaps a model's nn.Linear and nn.Embedding modules
for these, matching parameter names to the tensor names of the imported model (as in its
safetensors), and frees their parameters.

CUDA inputs run on a GPU map (nwc.GpuMap: nwcd's device copies in this process, libnwc-cuda's
kernels in torch's current stream): 1..8 rows are one fused decode-matvec, more rows dequantize
the weight a chunk of output rows at a time into one bounded BF16 scratch per device, shared by
every NwcLinear there (set_dense_scratch_bytes; 16 MiB by default), and multiply each chunk
with torch's matmul into its columns of the output; embeddings are one gather.
A module maps its own tensors on its first CUDA call (which must be eager, not captured) unless
it was given a map; patch() of a model on a CUDA device maps the whole model once and shares it.
Captured in a torch CUDA graph, the CUDA paths replay as they ran (nothing is read back).
"""
from __future__ import annotations

import errno
from collections import defaultdict
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from . import _lib
from ._cuda import MAX_COLS, ROW_ALIGN, GpuMap, GpuTensor
from .client import Client, TensorInfo
from .mapping import Mapping
from .errors import NwcError

__all__ = ["NwcEmbedding", "NwcLinear", "dense_scratch_bytes", "patch",
           "set_dense_scratch_bytes"]

DENSE_SCRATCH_BYTES = 16 << 20  # the default size of the dense path's scratch per device (cpu too)
_scratch_bytes = DENSE_SCRATCH_BYTES
_scratch: Dict[torch.device, torch.Tensor] = {}  # the dense path's scratch of each device


def set_dense_scratch_bytes(nbytes: int = DENSE_SCRATCH_BYTES) -> None:
    """Sets the size of the BF16 scratch that NwcLinear's dense path (more rows than the
    matvecs take) dequantizes weights into, one chunk of output rows at a time, shared by every
    NwcLinear of a device (the CPU is one).  A buffer is made as large as the weights it has
    served need (a weight smaller than the size takes its own size), up to the size set; a chunk
    is at least 16 rows of the weight, so a size smaller than 16 rows of a weight grows to that.
    Drops the buffers made so far (to torch's caching allocator, stream-ordered: work already
    queued on them is safe); the next call on each device makes its own again, so set it
    before capturing CUDA graphs."""
    global _scratch_bytes
    if not isinstance(nbytes, int) or nbytes <= 0:
        raise NwcError(errno.EINVAL, f"dense scratch of {nbytes!r} bytes: a positive int")
    _scratch_bytes = nbytes
    _scratch.clear()


def dense_scratch_bytes(device: Optional[torch.device] = None) -> int:
    """Device bytes of the dense path's scratch on device (0 until its first dense call), or
    the configured size when device is None."""
    if device is None:
        return _scratch_bytes
    buf = _scratch.get(torch.device(device))
    return 0 if buf is None else buf.numel() * buf.element_size()


def _dense_scratch(device: torch.device, rows: int, row_elems: int) -> torch.Tensor:
    """The device's dense scratch (BF16, flat), made or grown to what a weight of rows x
    row_elems asks for: all its rows where they fit in the set size, else that size, but at
    least 16 rows."""
    buf = _scratch.get(device)
    need = max(min(_scratch_bytes // 2, rows * row_elems), ROW_ALIGN * row_elems)
    if buf is None or buf.numel() < need:
        buf = _scratch[device] = torch.empty(need, dtype=torch.bfloat16, device=device)
    return buf


def _cpu(x: torch.Tensor, what: str) -> None:
    if x.device.type != "cpu":
        raise NwcError(errno.ENOTSUP, f"{what}: input on {x.device}; nwc computes on the CPU "
                       "or on a CUDA GPU")


def _matrix(client: Client, model: str, weight: str, module: str) -> TensorInfo:
    """The stored tensor's info, or NwcError(EINVAL) when it is not a matrix."""
    info = client.info(model, weight)
    if len(info.shape) != 2:
        raise NwcError(errno.EINVAL, f"{model}/{weight} has shape {info.shape}: {module} needs "
                       "a matrix")
    return info


class _OnGpu:
    """What NwcLinear and NwcEmbedding share on CUDA inputs: the GPU map holding their weight
    (given, or made on the first CUDA call on that device)."""
    client: Client
    model: str
    weight_name: str
    gpu_map: Optional[GpuMap]

    def _attach(self, g: GpuMap) -> None:
        self._gt: GpuTensor = g.tensor(self.weight_name)
        self.gpu_map = g

    def _gpu_weight(self, device: torch.device) -> GpuTensor:
        """The weight in the GPU map on device; NwcError(EINVAL) when mapped on another."""
        if self.gpu_map is None:
            self._attach(self.client.map(self.model, self.weight_name, device=device.index,
                                         torch_device=device))
        if self.gpu_map.device != device:
            raise NwcError(errno.EINVAL, f"{self.model}/{self.weight_name} is mapped on "
                           f"{self.gpu_map.device}, the input is on {device}")
        return self._gt


class NwcLinear(_OnGpu, nn.Module):
    """y = x W^T + b with W (and b) stored in nwcd: a drop-in for nn.Linear(in_features,
    out_features) in inference.  weight and bias name tensors of model ([out, in] and [out]).

    Rows of input (the product of x's leading dimensions) up to dense_rows: one matvec call
    (float32 accumulation, output in x's dtype); more: F.linear on the weight dequantized from
    a host map (the module's, or one made on the first such call) a chunk of output rows at a
    time into the CPU's dense scratch (converted to x's dtype when x is not BF16), each chunk's
    product written into its columns of the output (one chunk: F.linear on the whole weight).
    mapped=True computes the matvecs in this process on a host map of the tensors instead of
    in the daemon (no round trip; the daemon keeps them resident while mapped).

    CUDA inputs use gpu_map (a GpuMap holding the weight; None: the weight is mapped on the
    first CUDA call): up to min(dense_rows, 8) rows a fused matvec on the device copy (float32
    accumulation, BF16 output for BF16 x, float32 otherwise); more rows F.linear on the weight
    dequantized a chunk of output rows at a time into the device's dense scratch
    (set_dense_scratch_bytes), each chunk's product written into its columns of the output
    (one chunk: F.linear on the whole weight); fp8 weights: matvecs of 8 rows, which apply the
    row scales."""

    def __init__(self, client: Client, model: str, weight: str, bias: Optional[str] = None,
                 dense_rows: int = 8, mapped: bool = False,
                 gpu_map: Optional[GpuMap] = None) -> None:
        super().__init__()
        info = _matrix(client, model, weight, "NwcLinear")
        self.client, self.model, self.weight_name, self.bias_name = client, model, weight, bias
        self.out_features, self.in_features = info.rows, info.cols
        self.dense_rows = dense_rows
        if bias is not None:
            b = client.info(model, bias)
            if b.rows * b.cols != self.out_features:
                raise NwcError(errno.EINVAL, f"{model}/{bias} has shape {b.shape}: the bias of "
                               f"{model}/{weight} needs {self.out_features} values")
        self._m, self._w = model.encode(), weight.encode()
        self._b = bias.encode() if bias is not None else None
        self._matvec = _lib.lib().nwc_client_matvec
        self._bias: Optional[torch.Tensor] = None  # BF16, for the dense path
        self._map_matvec = _lib.lib().nwc_client_map_matvec
        self.mapping = client.map(model, weight) if mapped else None
        self._dense_map: Optional[Mapping] = None  # the dense path's map when not mapped
        self._map_bias: Optional[torch.Tensor] = None  # float32, for the map's matvec
        self._bias_ptr: Optional[int] = None
        if mapped and bias is not None:
            self._map_bias = client.dequant(model, bias, as_torch=True).reshape(-1)
            self._bias_ptr = self._map_bias.data_ptr()
        self.gpu_map = None
        self._gpu_bias: Optional[torch.Tensor] = None  # float32 on the map's device
        if gpu_map is not None:
            self._attach(gpu_map)

    def _attach(self, g: GpuMap) -> None:
        super()._attach(g)
        if self.bias_name is not None:
            self._gpu_bias = self.client.dequant(self.model, self.bias_name,
                                                 as_torch=True).reshape(-1).to(g.device)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias_name is not None}, nwc={self.model}/{self.weight_name}")

    def host_map(self) -> Mapping:
        """The weight's host map for the dense path: mapped=True's, else one made by the first
        dense call (the daemon keeps the tensor resident while the module holds it; the
        matvecs stay the daemon's)."""
        if self.mapping is not None:
            return self.mapping
        if self._dense_map is None:
            self._dense_map = self.client.map(self.model, self.weight_name)
        return self._dense_map

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Every line here is paid per call (bench/python_linear.py): cheap tests first, the
        # output tensor made once, in the shape asked for.
        K = self.in_features
        if x.dim() == 0 or x.shape[-1] != K:
            raise NwcError(errno.EINVAL, f"NwcLinear {self.model}/{self.weight_name}: input of "
                           f"shape {tuple(x.shape)}, its last dimension must be {K}")
        if x.is_cuda:
            return self._forward_gpu(x)
        if not x.is_cpu:
            _cpu(x, "NwcLinear")
        n = x.numel() // K
        if n > self.dense_rows or n == 0:
            return self._forward_dense(x)
        dt, M = x.dtype, self.out_features
        f32, bf16 = dt is torch.float32, dt is torch.bfloat16
        xs = x if f32 and x.is_contiguous() else x.detach().to(torch.float32).contiguous()
        y = torch.empty((n, M) if x.dim() == 2 else x.shape[:-1] + (M,),
                        dtype=torch.bfloat16 if bf16 else torch.float32)
        if self.mapping is None:
            rc = self._matvec(self.client.handle, self._m, self._w, self._b, 1.0, xs.data_ptr(),
                              K, n, bf16, y.data_ptr(), n * M * (2 if bf16 else 4), None)
        else:
            rc = self._map_matvec(self.mapping._ptr(), self._bias_ptr, 1.0, xs.data_ptr(), n,
                                  bf16, y.data_ptr(), n * M * (2 if bf16 else 4))
        if rc < 0:
            _lib.check(rc)
        return y if f32 or bf16 else y.to(dt)

    def _forward_gpu(self, x: torch.Tensor) -> torch.Tensor:
        t = self._gpu_weight(x.device)
        g, b = self.gpu_map, self._gpu_bias
        K, M, dt = self.in_features, self.out_features, x.dtype
        n = x.numel() // K
        if n > min(self.dense_rows, MAX_COLS) and t.type != "fp8":
            return self._forward_gpu_dense(x, t)
        xs = x.reshape(n, K)
        bf16 = dt is torch.bfloat16
        y = torch.empty((n, M), dtype=torch.bfloat16 if bf16 else torch.float32,
                        device=x.device)
        for i in range(0, n, MAX_COLS):
            g.matvec(t, xs[i:i + MAX_COLS], b, out=y[i:i + MAX_COLS])
        y = y.view(x.shape[:-1] + (M,))
        return y if bf16 or dt is torch.float32 else y.to(dt)

    def _forward_gpu_dense(self, x: torch.Tensor, t: GpuTensor) -> torch.Tensor:
        g, b = self.gpu_map, self._gpu_bias
        buf = _dense_scratch(x.device, t.rows, t.k16)
        return self._chunked(x, b, buf, t.k16, lambda r0, nr, out: g.dequant_rows(t, r0, nr, out))

    def _forward_dense(self, x: torch.Tensor) -> torch.Tensor:
        m = self.host_map()
        if self.bias_name is not None and self._bias is None:
            self._bias = self.client.dequant(self.model, self.bias_name, "bfloat16",
                                             as_torch=True).reshape(-1)
        buf = _dense_scratch(torch.device("cpu"), self.out_features, self.in_features)
        return self._chunked(x, self._bias, buf, self.in_features,
                             lambda r0, nr, out: m.dequant_rows(r0, nr, "bfloat16", out=out))

    def _chunked(self, x: torch.Tensor, bias: Optional[torch.Tensor], buf: torch.Tensor,
                 stride: int, rows: Callable[[int, int, torch.Tensor], torch.Tensor]
                 ) -> torch.Tensor:
        """F.linear on the weight dequantized R rows at a time (whole row groups; rows(r0, nr,
        out) writes rows r0 .. r0 + nr - 1 into out, nr x stride BF16) into buf, each chunk's
        product written into its columns of y; a weight that fits whole is one F.linear on it
        (bit for bit nn.Linear's)."""
        dt, K, M = x.dtype, self.in_features, self.out_features
        b = None if bias is None else bias.to(dt)
        fit = buf.numel() // stride
        R = M if fit >= M else fit // ROW_ALIGN * ROW_ALIGN
        if R == M:
            w = rows(0, M, buf[:M * stride].view(M, stride))[:, :K]
            return nn.functional.linear(x, w if dt is torch.bfloat16 else w.to(dt), b)
        x2 = x.reshape(-1, K)
        y = torch.empty((x2.shape[0], M), dtype=dt, device=x.device)
        for r0 in range(0, M, R):
            nr = min(R, M - r0)
            w = rows(r0, nr, buf[:nr * stride].view(nr, stride))[:, :K]
            y[:, r0:r0 + nr] = nn.functional.linear(
                x2, w if dt is torch.bfloat16 else w.to(dt), None if b is None else b[r0:r0 + nr])
        return y.view(x.shape[:-1] + (M,))


class NwcEmbedding(_OnGpu, nn.Module):
    """nn.Embedding's lookup on a [num_embeddings, embedding_dim] tensor stored in nwcd: each
    call is one gather of the rows asked for (bit for bit the stored BF16 values).  dtype is
    the output's (bfloat16 by default, as stored).  An index out of range raises NwcError
    EINVAL naming it.  CUDA ids gather on gpu_map (made on the first CUDA call when None) in
    torch's stream; there an index out of range is not read back: its row comes out zero."""

    def __init__(self, client: Client, model: str, weight: str,
                 dtype: torch.dtype = torch.bfloat16, padding_idx: Optional[int] = None,
                 gpu_map: Optional[GpuMap] = None) -> None:
        super().__init__()
        info = _matrix(client, model, weight, "NwcEmbedding")
        self.client, self.model, self.weight_name = client, model, weight
        self.num_embeddings, self.embedding_dim = info.rows, info.cols
        self.dtype, self.padding_idx = dtype, padding_idx
        self._m, self._w = model.encode(), weight.encode()
        self._gather = _lib.lib().nwc_client_gather
        self.gpu_map = None
        if gpu_map is not None:
            self._attach(gpu_map)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, "
                f"nwc={self.model}/{self.weight_name}")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.is_cuda:
            t = self._gpu_weight(ids.device)
            out = self.gpu_map.gather(t, ids)
            return out if out.dtype is self.dtype else out.to(self.dtype)
        _cpu(ids, "NwcEmbedding")
        idx = ids.detach().to(torch.int64).contiguous()
        n, D = idx.numel(), self.embedding_dim
        bf16 = self.dtype is torch.bfloat16
        out = torch.empty((n, D), dtype=torch.bfloat16 if bf16 else torch.float32)
        if n:
            rc = self._gather(self.client.handle, self._m, self._w, idx.data_ptr(), n, bf16,
                              out.data_ptr(), n * D * (2 if bf16 else 4), None, None)
            if rc < 0:
                _lib.check(rc)
        out = out.reshape(tuple(ids.shape) + (D,))
        return out if out.dtype is self.dtype else out.to(self.dtype)


def _param_names(model: nn.Module) -> Dict[int, List[str]]:
    """Every name of every parameter (a tied weight has several), in the modules' order."""
    names: Dict[int, List[str]] = defaultdict(list)
    for mname, mod in model.named_modules():
        for pname, p in mod._parameters.items():
            if p is not None:
                names[id(p)].append(f"{mname}.{pname}" if mname else pname)
    return names


def patch(model: nn.Module, client: Client, model_name: str, prefix: str = "",
          dense_rows: int = 8, mapped: bool = False) -> Dict[str, str]:
    """Swaps every nn.Linear and nn.Embedding of model for an NwcLinear / NwcEmbedding on the
    tensors of model_name in nwcd, and frees their parameters.  A parameter matches the stored
    tensor of its name (prefix + its name in model.state_dict(), as in the model's safetensors);
    a tied parameter (one object under several names, as a tied lm_head) matches any of its
    names, which is how transformers saves it once.

    All or nothing: NwcError(ENOENT) naming every parameter with no tensor of its name, or
    NwcError(EINVAL) naming every one whose stored shape differs, before anything is swapped.
    A model on a CUDA device (its first swapped module's weight there) is mapped there whole,
    once: one GpuMap shared by the new modules (nwcd's device numbering taken to be torch's).
    Returns {module name: stored weight tensor name} of the modules swapped."""
    stored = {t.name: t for t in client.tensors(model_name)}
    aliases = _param_names(model)
    plan: List[Tuple[nn.Module, str, str, nn.Module, str, Optional[str]]] = []
    missing: List[str] = []
    wrong: List[str] = []

    def find(p: nn.Parameter, own: str) -> Optional[str]:
        for n in aliases.get(id(p), [own]):
            if prefix + n in stored:
                t = stored[prefix + n]
                if tuple(t.shape) != tuple(p.shape):
                    wrong.append(f"{n} ({tuple(p.shape)} in the model, {tuple(t.shape)} in "
                                 f"{model_name}/{prefix + n})")
                return prefix + n
        missing.append(own)
        return None

    for pname, parent in model.named_modules():
        for attr, child in parent._modules.items():
            if not isinstance(child, (nn.Linear, nn.Embedding)):
                continue
            full = f"{pname}.{attr}" if pname else attr
            w = find(child.weight, full + ".weight")
            b = None
            if isinstance(child, nn.Linear) and child.bias is not None:
                b = find(child.bias, full + ".bias")
            plan.append((parent, attr, full, child, w or "", b))
    if missing:
        raise NwcError(errno.ENOENT, f"model {model_name!r} has no tensor for "
                       f"{len(missing)} parameter(s): " + ", ".join(prefix + m for m in missing))
    if wrong:
        raise NwcError(errno.EINVAL, f"model {model_name!r}: shapes differ for "
                       f"{len(wrong)} parameter(s): " + ", ".join(wrong))
    dev = plan[0][3].weight.device if plan else None
    gpu_map = (client.map(model_name, device=dev.index, torch_device=dev)
               if dev is not None and dev.type == "cuda" else None)
    made: Dict[int, nn.Module] = {}
    done: Dict[str, str] = {}
    for parent, attr, full, child, w, b in plan:
        new = made.get(id(child))
        if new is None:
            if isinstance(child, nn.Linear):
                new = NwcLinear(client, model_name, w, b, dense_rows=dense_rows, mapped=mapped,
                                gpu_map=gpu_map)
            else:
                new = NwcEmbedding(client, model_name, w, dtype=child.weight.dtype,
                                   padding_idx=child.padding_idx, gpu_map=gpu_map)
            made[id(child)] = new
        setattr(parent, attr, new)
        done[full] = w
    for parent, attr, full, child, w, b in plan:  # free the parameters (tied ones too)
        for p in ("weight", "bias"):
            if child._parameters.get(p) is not None:
                child._parameters[p] = None
    return done
