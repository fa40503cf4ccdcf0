"""nwc - Python access to nwcd, the nwc compressed weight store, over libnwc-client (ctypes).

    import nwc
    with nwc.connect() as c:                      # $NWC_SOCKET, or the default socket
        c.import_("tiny", "model.safetensors")
        w = c.dequant("tiny", "lm_head.weight")   # numpy float32
        y = c.matvec("tiny", "lm_head.weight", x) # x [K] or [n, K]

c.map(model, device="cuda:0") is a GpuMap: nwcd's device copies computed on in torch's stream.
nwc.torch has NwcLinear, NwcEmbedding and patch() for PyTorch models.  Every failure raises
nwc.NwcError (errno, message).  docs/python.md has the whole API.
"""
from ._cuda import GpuMap, GpuTensor
from ._lib import lib_path
from .client import (Client, Model, Place, Resident, Result, Tensor, TensorInfo, connect,
                     default_socket)
from .errors import NwcError
from .mapping import Mapping

__version__ = "0.1.0"
__all__ = ["Client", "GpuMap", "GpuTensor", "Mapping", "Model", "NwcError", "Place", "Resident",
           "Result", "Tensor", "TensorInfo", "connect", "default_socket", "lib_path"]
