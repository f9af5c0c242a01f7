"""dnnbind: cuDNN, cuBLAS and NCCL driven from Python through ctypes, with a Gluon-style API on top.

Importing touches no GPU and loads no library: everything is opened by the first call that needs it.
"""

__version__ = "0.1.0"

from ._lib.errors import (CublasError, CudaError, CudnnBadParam, CudnnError, CudnnExecutionFailed,  # noqa: F401
                          CudnnInternalError, CudnnNotInitialized, CudnnNotSupported, DnnbindError,
                          DnnbindTypeError, DnnbindValueError, LibraryNotFoundError, UnknownArgumentError, NcclError, NvrtcError)
from .runtime import (Device, Event, NDArray, Stream, array, cpu, current_stream, default_device,  # noqa: F401
                      empty, from_dlpack, full, gpu, math_mode, math_scope, num_gpus, ones, set_math_mode,
                      show_time, synchronize, zeros)
from .ops import *  # noqa: F401,F403
from .ops import __all__ as _ops_all
from .config_report import show_config  # noqa: F401

context = Device  # MXNet spelling: mx.context.Context-like

__all__ = ["CublasError", "CudaError", "CudnnBadParam", "CudnnError", "CudnnExecutionFailed",
           "CudnnInternalError", "CudnnNotInitialized", "CudnnNotSupported", "DnnbindError", "DnnbindTypeError",
           "DnnbindValueError", "UnknownArgumentError",
           "LibraryNotFoundError", "NcclError", "NvrtcError", "Device", "Event", "NDArray", "Stream", "array", "cpu",
           "current_stream", "default_device", "empty", "from_dlpack", "full", "gpu", "math_mode", "math_scope",
           "num_gpus", "ones", "set_math_mode", "show_time", "synchronize", "zeros", "show_config", "trace",
           *_ops_all]


from . import autograd, nd  # noqa: E402,F401  (nd installs NDArray operators)
from . import initializer as init  # noqa: E402,F401
from . import gluon  # noqa: E402,F401
from .ops import set_conv_algo_policy  # noqa: E402,F401
from . import trace  # noqa: E402,F401  (dnnbind.trace() records every library call)
from .mxnet import install_mxnet_alias  # noqa: E402,F401  (`import mxnet` -> dnnbind; python -m dnnbind.mxnet)
from . import distributed  # noqa: E402,F401  (rank/world size; python -m dnnbind.launch starts workers)
from . import amp  # noqa: E402,F401  (loss scaling for net.cast("float16") training, MXNet contrib.amp calls)
from . import hybrid  # noqa: E402,F401  (Block.hybridize(): recorded forward/backward, replayed per call)
from . import eager_replay  # noqa: E402,F401  (eager Block calls replayed where proven to repeat)
from .eager_replay import eager_replay_enabled, set_eager_replay  # noqa: E402,F401
