"""Layer 1 (runtime): devices, streams, events, handles, stream-ordered memory, the NDArray, timing.

May import dnnbind._lib only. Importing touches no GPU.
"""

from .array import NDArray, array, empty, from_cuda, from_dlpack, full, ones, zeros
from .config import math_mode, math_scope, set_math_mode
from .device import Device, as_device, cpu, default_device, gpu, gpu_status, num_gpus
from .handles import cublas_handle, cudnn_handle
from .stream import Event, Stream, current_stream, default_stream, synchronize
from .timing import Timing, show_time

__all__ = ["NDArray", "array", "empty", "from_cuda", "from_dlpack", "full", "ones", "zeros", "math_mode",
           "math_scope", "set_math_mode", "Device", "as_device", "cpu", "default_device", "gpu", "gpu_status",
           "num_gpus", "cublas_handle", "cudnn_handle", "Event", "Stream", "current_stream", "default_stream",
           "synchronize", "Timing", "show_time"]
