"""Layer kernels: CUDA C++ compiled at run time with NVRTC and launched on dnnbind arrays.

Imports dnnbind._lib and dnnbind.runtime (for the current device and stream). No compiler toolchain is
needed; compiling works without a GPU, launching needs one.

    from dnnbind import kernels
    add2 = kernels.compile(r'''
    extern "C" __global__ void add2_kernel(float* c, const float* a, const float* b, int n) {
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
            c[i] = a[i] + b[i];
    }''', "add2_kernel")
    add2.launch(grid=(n + 255) // 256, block=256, args=(c, a, b, n))   # or add2[grid, block](c, a, b, n)

    add = kernels.elementwise("add", "const float* a, const float* b, float* c", "c[i] = a[i] + b[i];")
    add(a, b, c)

Kernels may be ``extern "C"`` (found by their plain name) or C++/templates (give the name expression,
e.g. "scale<float>"). Arguments: arrays with ``.ptr`` or ``__cuda_array_interface__`` become pointers,
Python ints int32, floats float32, numpy scalars and ctypes values keep their exact type.
"""

from dnnbind._lib.errors import CudaDriverError, NvrtcError

from .compiler import Module, cache_dir, clear_memory_cache, compile, target
from .elementwise import ElementwiseKernel, elementwise
from .launch import Kernel, pack_args, stream_handle
from .strided import Ref, gather, random_fill, scatter_add, sort_along, strided_map, strided_reduce

__all__ = ["CudaDriverError", "ElementwiseKernel", "Kernel", "Module", "NvrtcError", "Ref", "cache_dir",
           "clear_memory_cache", "compile", "elementwise", "gather", "pack_args", "random_fill", "scatter_add",
           "sort_along", "stream_handle", "strided_map", "strided_reduce", "target"]
