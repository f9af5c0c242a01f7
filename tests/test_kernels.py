"""dnnbind.kernels: NVRTC compilation, the code cache, argument packing, launches.

The CPU tests run anywhere NVRTC loads (CI included): NVRTC compiles without a GPU. The tests marked
``gpu`` skip cleanly without a GPU and driver; on one they check results against numpy.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import struct

import numpy as np
import pytest

from dnnbind import kernels, trace
from dnnbind._lib import nvrtc
from dnnbind._lib.errors import DnnbindError, NvrtcError
from dnnbind.kernels import compiler, launch

# Seed 003 (NN-CUDA-Example's add2), as a run-time compiled kernel instead of a torch C++ extension.
ADD2 = r"""
extern "C" __global__ void add2_kernel(float* c, const float* a, const float* b, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        c[i] = a[i] + b[i];
    }
}
"""

TEMPLATED = r"""
template <typename T>
__global__ void scale(T* x, T s, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}
"""


def _nvrtc_available() -> bool:
    try:
        nvrtc.version()
    except DnnbindError:
        return False
    return True


needs_nvrtc = pytest.mark.skipif(not _nvrtc_available(), reason="NVRTC is not installed")


def _gpu_count() -> int:
    try:
        from cuda.bindings import runtime
        err, count = runtime.cudaGetDeviceCount()
    except (ImportError, RuntimeError, OSError):  # no cuda-python, or no driver library at all
        return 0
    return int(count) if int(err) == 0 else 0


def gpu(test):
    """Mark a test as needing a GPU, and skip it (not fail) where there is none."""
    reason = "needs a CUDA GPU and driver (cudaGetDeviceCount failed or returned 0)"
    return pytest.mark.gpu(pytest.mark.skipif(_gpu_count() == 0, reason=reason)(test))


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Each test gets an empty disk cache and an empty memory cache."""
    monkeypatch.setenv("DNNBIND_CACHE_DIR", str(tmp_path / "kernel-cache"))
    compiler.clear_memory_cache()
    yield tmp_path / "kernel-cache"
    compiler.clear_memory_cache()


@pytest.fixture
def nvrtc_calls(monkeypatch):
    """Count real NVRTC compilations."""
    calls = []
    real = compiler._run_nvrtc

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "_run_nvrtc", counting)
    return calls


# --- compiling (no GPU needed) -------------------------------------------------------------------------

@needs_nvrtc
def test_compile_add2_to_cubin_without_gpu():
    k = compiler.compile(ADD2, "add2_kernel", arch="sm_90")
    assert k.name == k.lowered_name == "add2_kernel"
    assert k.module.kind == "cubin" and k.module.arch == "sm_90"
    assert k.module.code.startswith(b"\x7fELF")
    assert "-arch=sm_90" in k.module.options


@needs_nvrtc
def test_compile_add2_to_ptx_for_compute_arch():
    m = compiler.Module(ADD2, ["add2_kernel"], arch="compute_90")
    assert m.kind == "ptx"
    assert ".entry add2_kernel" in m.ptx and ".target sm_90" in m.ptx
    assert m.code.endswith(b"\0")  # cuModuleLoadData reads PTX as a C string


@needs_nvrtc
def test_default_arch_without_gpu_is_sm90():
    if _gpu_count():
        pytest.skip("there is a GPU: the default arch is its own")
    assert compiler.target() == ("-arch=sm_90", "cubin")


@needs_nvrtc
def test_target_falls_back_to_ptx_for_a_gpu_newer_than_nvrtc(monkeypatch):
    monkeypatch.setattr(nvrtc, "supported_archs", lambda: (75, 80, 86, 89))
    assert compiler.target("sm_90") == ("-arch=compute_89", "ptx")
    m = compiler.Module(ADD2, ["add2_kernel"], arch="sm_90")
    assert m.kind == "ptx" and ".target sm_89" in m.ptx
    assert compiler.target((8, 6)) == ("-arch=sm_86", "cubin")
    assert compiler.target("compute_80") == ("-arch=compute_80", "ptx")
    with pytest.raises(ValueError, match="cannot compile for sm_70"):
        compiler.target("sm_70")
    with pytest.raises(ValueError, match="arch must look like"):
        compiler.target("hopper")


@needs_nvrtc
def test_templates_and_several_kernels_by_name_expression():
    source = TEMPLATED + ADD2
    m = compiler.Module(source, ["scale<float>", "scale<double>", "add2_kernel"], arch="sm_90")
    f, d = m.get_function("scale<float>"), m.get_function("scale<double>")
    assert f.lowered_name.startswith("_Z") and f.lowered_name != d.lowered_name
    assert m.get_function("add2_kernel").lowered_name == "add2_kernel"
    assert m.get_function("scale<float>") is f


@needs_nvrtc
def test_arch_in_options_is_refused():
    with pytest.raises(ValueError, match="arch="):
        compiler.compile(ADD2, "add2_kernel", options=["-arch=sm_80"])


# --- compile errors ------------------------------------------------------------------------------------

@needs_nvrtc
def test_syntax_error_names_and_quotes_the_line():
    bad = ADD2.replace("c[i] = a[i] + b[i];", "c[i] = a[i] + bogus[i];")
    line = next(i for i, text in enumerate(bad.splitlines(), 1) if "bogus" in text)
    with pytest.raises(NvrtcError) as info:
        compiler.compile(bad, "add2_kernel", arch="sm_90")
    err = info.value
    msg = str(err)
    assert isinstance(err, DnnbindError) and err.status == nvrtc.NVRTC_ERROR_COMPILATION
    assert f"kernel.cu({line}): error" in msg and "bogus" in msg  # NVRTC's own log
    assert f"> kernel.cu:{line}" in msg and "c[i] = a[i] + bogus[i];" in msg  # our quote, with its number
    assert "add2_kernel" in msg  # the context says what was being compiled
    assert str(pickle.loads(pickle.dumps(err))) == msg


@needs_nvrtc
def test_missing_semicolon_quotes_the_line_before_too():
    bad = ADD2.replace("c[i] = a[i] + b[i];", "c[i] = a[i] + b[i]")
    with pytest.raises(NvrtcError) as info:
        compiler.compile(bad, "add2_kernel", arch="sm_90")
    msg = str(info.value)
    # NVRTC reports the next token's line (the '}'); the quote shows the line with the mistake above it.
    assert "c[i] = a[i] + b[i]" in msg.split("offending source lines")[1]


@needs_nvrtc
def test_unknown_kernel_name_explains_name_expressions():
    with pytest.raises(NvrtcError, match="kernel name was not found"):
        compiler.compile(ADD2, "add3_kernel", arch="sm_90")


# --- the cache -----------------------------------------------------------------------------------------

@needs_nvrtc
def test_memory_cache_returns_the_same_kernel(nvrtc_calls):
    a = compiler.compile(ADD2, "add2_kernel", arch="sm_90")
    b = compiler.compile(ADD2, "add2_kernel", arch="sm_90")
    assert a is b and len(nvrtc_calls) == 1
    compiler.compile(ADD2, "add2_kernel", options=["-lineinfo"], arch="sm_90")
    assert len(nvrtc_calls) == 2  # other options, other code


@needs_nvrtc
def test_disk_cache_hit_and_corrupt_file_rebuilt(nvrtc_calls, private_cache):
    first = compiler.compile(ADD2, "add2_kernel", arch="sm_90")
    files = [p for p in private_cache.iterdir() if p.suffix == ".bin"]
    assert len(nvrtc_calls) == 1 and len(files) == 1
    assert not [p for p in private_cache.iterdir() if p.name.startswith(".tmp-")]  # no temp file left

    compiler.clear_memory_cache()  # as in a new process
    second = compiler.compile(ADD2, "add2_kernel", arch="sm_90")
    assert len(nvrtc_calls) == 1, "the second compile should come from the disk cache"
    assert second.module.code == first.module.code and second.lowered_name == "add2_kernel"

    for damage in (b"garbage", files[0].read_bytes()[:-10], b""):
        files[0].write_bytes(damage)
        compiler.clear_memory_cache()
        rebuilt = compiler.compile(ADD2, "add2_kernel", arch="sm_90")
        assert rebuilt.module.code == first.module.code
    assert len(nvrtc_calls) == 4
    compiler.clear_memory_cache()
    compiler.compile(ADD2, "add2_kernel", arch="sm_90")
    assert len(nvrtc_calls) == 4, "the rebuilt file should be valid again"


@needs_nvrtc
def test_unwritable_cache_dir_still_compiles(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("DNNBIND_CACHE_DIR", str(blocker / "kernels"))
    assert compiler.compile(ADD2, "add2_kernel", arch="sm_90").module.kind == "cubin"


def test_cache_dir_default(monkeypatch):
    monkeypatch.delenv("DNNBIND_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert compiler.cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "dnnbind", "kernels")


# --- arguments and launch configuration (no GPU needed) ------------------------------------------------

class FakeDeviceArray:
    """Just enough of a CuPy/torch array: the CUDA Array Interface."""

    def __init__(self, ptr, shape, typestr="<f4"):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "version": 3, "strides": None}


class FakeNDArray:
    def __init__(self, ptr, size=4, dtype=np.float32):
        self.ptr, self.size, self.dtype = ptr, size, np.dtype(dtype)


def test_pack_args_types():
    args = (FakeNDArray(0x7F0000001000), FakeDeviceArray(0x7F0000002000, (4,)), 3, 2.5, np.float64(1.25),
            np.int64(2**40), np.uint8(7), np.float16(1.0), True, None, ctypes.c_int16(-3))
    holders, params = launch.pack_args(args)
    assert [type(h) for h in holders] == [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_float, ctypes.c_double, ctypes.c_int64,
        ctypes.c_uint8, ctypes.c_uint16, ctypes.c_bool, ctypes.c_void_p, ctypes.c_int16]
    assert holders[0].value == 0x7F0000001000 and holders[1].value == 0x7F0000002000
    assert holders[2].value == 3 and holders[3].value == 2.5 and holders[5].value == 2**40
    assert holders[7].value == 0x3C00  # the bits of half 1.0
    assert holders[9].value is None  # NULL
    assert holders[10] is args[10]  # ctypes values pass through untouched
    assert list(struct.unpack(f"{len(args)}P", params)) == [ctypes.addressof(h) for h in holders]


def test_pack_args_refuses_what_would_go_wrong():
    with pytest.raises(OverflowError, match="c_void_p"):
        launch.pack_args([0x7F0000001000])  # a raw pointer as a Python int would be truncated to int32
    with pytest.raises(TypeError, match="host memory"):
        launch.pack_args([np.zeros(3)])
    with pytest.raises(TypeError, match="argument 1"):
        launch.pack_args([1, object()])


@needs_nvrtc
def test_bad_block_raises_before_launching():
    k = compiler.compile(ADD2, "add2_kernel", arch="sm_90")
    # No GPU is touched: these fail in validation, so they behave the same on a CPU-only machine.
    with pytest.raises(ValueError, match=r"'add2_kernel' with grid \(1, 1, 1\), block \(2048, 1, 1\)"):
        k.launch(1, 2048, (0, 0, 0, 0))
    with pytest.raises(ValueError, match="2048 threads"):
        k[(1,), (32, 64)](0, 0, 0, 0)
    with pytest.raises(ValueError, match="at least 1"):
        k.launch(0, 256, ())
    with pytest.raises(ValueError, match="block dimensions"):
        k.launch(1, (1, 1, 128), ())
    with pytest.raises(ValueError, match="grid dimensions"):
        k.launch((1, 70000), 32, ())
    with pytest.raises(TypeError, match="grid must be"):
        k.launch("1", 32, ())


def test_stream_handles():
    class S:
        handle = 0x1234

    class TorchLike:
        cuda_stream = 0x99

    assert launch.stream_handle(7) == 7
    assert launch.stream_handle(S()) == 0x1234
    assert launch.stream_handle(TorchLike()) == 0x99
    with pytest.raises(TypeError, match="stream"):
        launch.stream_handle("default")


# --- elementwise (no GPU needed for these) -------------------------------------------------------------

def test_elementwise_generates_a_grid_stride_loop():
    add2 = kernels.elementwise("add2", "const float* a, const float* b, float* c", "c[i] = a[i] + b[i];")
    assert 'extern "C" __global__ void add2(const float* a, const float* b, float* c, long long n)' in add2.source
    assert "i += stride" in add2.source
    assert [p.name for p in add2.params] == ["a", "b", "c"] and add2._out == 2
    assert add2.params[0].const and not add2.params[2].const and add2.params[0].dtype == np.float32


@needs_nvrtc
def test_elementwise_compiles_without_gpu():
    axpy = kernels.elementwise("axpy", "const double* __restrict__ x, double* y, double alpha",
                                   "y[i] += alpha * x[i];")
    k = axpy.kernel(arch="sm_90")
    assert k.module.kind == "cubin" and k.name == "axpy"
    assert axpy.params[2].ctype is ctypes.c_double  # a Python float reaches `double alpha` as a double


def test_elementwise_checks_arguments_before_the_gpu():
    add2 = kernels.elementwise("add2", "const float* a, const float* b, float* c", "c[i] = a[i] + b[i];")
    f32 = FakeDeviceArray(0x1000, (8,))
    with pytest.raises(TypeError, match="takes 3 arguments"):
        add2(f32, f32)
    with pytest.raises(TypeError, match="declared float32 but got a float64"):
        add2(FakeDeviceArray(0x1000, (8,), "<f8"), f32, f32)
    with pytest.raises(ValueError, match="b has 4 elements, expected n = 8"):
        add2(f32, FakeDeviceArray(0x1000, (4,)), f32)
    with pytest.raises(ValueError, match="taken"):
        kernels.elementwise("bad", "float* n", "n[i] = 0;")
    with pytest.raises(TypeError, match="pass n="):
        kernels.elementwise("fill", "float* x", "x[i] = 0;")(0x7F00)  # a bare pointer has no size
    empty = FakeDeviceArray(0x1000, (0,))
    add2(empty, empty, empty)  # n = 0: nothing to do, so no launch and no GPU needed


# --- on the GPU ----------------------------------------------------------------------------------------

class DeviceBuffer:
    """Raw cudaMalloc memory with .ptr/.size/.dtype, so these tests do not depend on dnnbind.runtime."""

    def __init__(self, host: np.ndarray):
        from cuda.bindings import runtime
        self._rt = runtime
        host = np.ascontiguousarray(host)
        self.shape, self.dtype, self.size = host.shape, host.dtype, host.size
        err, ptr = runtime.cudaMalloc(max(host.nbytes, 1))
        assert int(err) == 0, err
        self.ptr = int(ptr)
        err, = runtime.cudaMemcpy(self.ptr, host.ctypes.data, host.nbytes,
                                  runtime.cudaMemcpyKind.cudaMemcpyHostToDevice)
        assert int(err) == 0, err

    def numpy(self) -> np.ndarray:
        rt = self._rt
        assert int(rt.cudaDeviceSynchronize()[0]) == 0
        out = np.empty(self.shape, self.dtype)
        err, = rt.cudaMemcpy(out.ctypes.data, self.ptr, out.nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        assert int(err) == 0, err
        return out

    def __del__(self):
        self._rt.cudaFree(self.ptr)


def _dnnbind_array(host):
    try:
        from dnnbind.runtime import array
    except ImportError:
        pytest.skip("dnnbind.runtime.array is not available")
    return array(host, device="gpu")


BACKENDS = {"raw": DeviceBuffer, "dnnbind": _dnnbind_array}


@gpu
@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("n", [1, 1000, (1 << 20) + 3])
def test_add2_matches_numpy(backend, n):
    rng = np.random.default_rng(n)
    a_h, b_h = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    to_gpu = BACKENDS[backend]
    a, b, c = to_gpu(a_h), to_gpu(b_h), to_gpu(np.zeros(n, np.float32))
    k = compiler.compile(ADD2, "add2_kernel")
    k.launch(grid=(n + 255) // 256, block=256, args=(c, a, b, n))
    np.testing.assert_array_equal(c.numpy(), a_h + b_h)  # one rounding either way: bit-exact


@gpu
def test_add2_seed_launch_config_and_getitem_syntax():
    n = 5000
    a_h = np.arange(n, dtype=np.float32)
    a, c = DeviceBuffer(a_h), DeviceBuffer(np.zeros(n, np.float32))
    k = compiler.compile(ADD2, "add2_kernel")
    k[(n + 1023) // 1024, 1024](c, a, a, n)  # the seed's own <<<(n + 1023) / 1024, 1024>>>
    np.testing.assert_array_equal(c.numpy(), 2 * a_h)
    k[4, 32](c, a, a, np.int32(n), stream=0)  # a small grid: the grid-stride loop covers the rest
    np.testing.assert_array_equal(c.numpy(), 2 * a_h)


@gpu
@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("n", [1, 1000, (1 << 20) + 3])
def test_elementwise_add2_matches_numpy(backend, n):
    rng = np.random.default_rng(n + 1)
    a_h, b_h = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    to_gpu = BACKENDS[backend]
    a, b, c = to_gpu(a_h), to_gpu(b_h), to_gpu(np.zeros(n, np.float32))
    add2 = kernels.elementwise("add2", "const float* a, const float* b, float* c", "c[i] = a[i] + b[i];")
    add2(a, b, c)
    np.testing.assert_array_equal(c.numpy(), a_h + b_h)


@gpu
def test_elementwise_scalar_takes_the_declared_type():
    x_h = np.linspace(-1, 1, 777)
    x, y = DeviceBuffer(x_h), DeviceBuffer(np.ones(777))
    axpy = kernels.elementwise("axpy", "const double* x, double* y, double alpha", "y[i] += alpha * x[i];")
    axpy(x, y, 0.1)  # a Python float, which a raw launch would send as float32
    np.testing.assert_allclose(y.numpy(), 1 + 0.1 * x_h, rtol=0, atol=1e-15)


@gpu
def test_template_kernel_and_param_size_check():
    n = 300
    x_h = np.arange(n, dtype=np.float32)
    x = DeviceBuffer(x_h)
    k = compiler.compile(TEMPLATED, "scale<float>")
    k.launch((n + 127) // 128, 128, (x, np.float32(3.0), np.int64(n)))
    np.testing.assert_array_equal(x.numpy(), 3 * x_h)
    from cuda.bindings import driver
    if not hasattr(driver, "cuFuncGetParamInfo"):
        pytest.skip("cuda-bindings without cuFuncGetParamInfo")
    with pytest.raises(TypeError, match="argument 2: the kernel expects 8 bytes"):
        k.launch(1, 128, (x, np.float32(3.0), n))  # a Python int is 4 bytes; n is long long
    with pytest.raises(TypeError, match="takes 3 arguments"):
        k.launch(1, 128, (x, np.float32(3.0)))


@gpu
def test_launch_bounds_limit_and_trace():
    src = r'extern "C" __global__ void __launch_bounds__(128) one(int* x) { x[threadIdx.x] = 1; }'
    k = compiler.compile(src, "one")
    x = DeviceBuffer(np.zeros(128, np.int32))
    with pytest.raises(ValueError, match="this kernel's limit of 128"):
        k.launch(1, 256, (x,))
    with trace() as t:  # the one way to intercept launches: dnnbind.trace wraps Kernel._launch
        k.launch(1, 128, (x,), stream=0)
    assert [(r.library, r.function, r.details["grid"], r.details["block"]) for r in t.records] == [
        ("kernel", "one", (1, 1, 1), (128, 1, 1))]
    np.testing.assert_array_equal(x.numpy(), np.ones(128, np.int32))


@gpu
def test_cuda_array_interface_objects():
    cp = pytest.importorskip("cupy")
    a, b = cp.arange(1000, dtype=cp.float32), cp.ones(1000, dtype=cp.float32)
    c = cp.empty_like(a)
    compiler.compile(ADD2, "add2_kernel").launch(4, 256, (c, a, b, 1000))
    cp.cuda.runtime.deviceSynchronize()
    np.testing.assert_array_equal(cp.asnumpy(c), np.arange(1000, dtype=np.float32) + 1)


def test_dnnbind_internal_kernels_compile_without_a_gpu():
    """ops._kernels.SOURCE (loss gather/scatter, fill, Adam) must compile for sm_90."""
    from dnnbind.kernels import Module
    from dnnbind.ops import _kernels
    mod = Module(_kernels.SOURCE, arch="sm_90")
    assert mod.code


@gpu
def test_launch_on_the_legacy_stream_and_on_dnnbind_current_stream():
    # stream=0 is the legacy default stream; None is dnnbind's current stream on the launch's device.
    import dnnbind
    n = 999
    a_h = np.arange(n, dtype=np.float32)
    a, c, c2 = DeviceBuffer(a_h), DeviceBuffer(np.zeros(n, np.float32)), DeviceBuffer(np.zeros(n, np.float32))
    add2 = compiler.compile(ADD2, "add2_kernel")
    add2.launch(4, 256, (c, a, a, n), stream=0)
    np.testing.assert_array_equal(c.numpy(), 2 * a_h)
    dev = launch.current_device()
    assert launch.stream_handle(None, dev) == dnnbind.current_stream(dnnbind.gpu(dev)).handle
    add2.launch(4, 256, (c2, a, c, n))
    np.testing.assert_array_equal(c2.numpy(), 3 * a_h)


@gpu
def test_dynamic_shared_memory_above_48k_and_ptx():
    src = r"""
    extern "C" __global__ void reverse(float* x, int n) {
        extern __shared__ float s[];
        for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = x[i];
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = s[n - 1 - i];
    }"""
    n = 16384  # 64 KiB of shared memory: needs the opt-in above 48 KiB
    x_h = np.arange(n, dtype=np.float32)
    x = DeviceBuffer(x_h)
    k = compiler.compile(src, "reverse")
    k.launch(1, 256, (x, n), shared_mem=4 * n)
    np.testing.assert_array_equal(x.numpy(), x_h[::-1])
    ptx = compiler.compile(src, "reverse", arch="compute_75")  # PTX the driver JIT-compiles at load
    assert ptx.module.kind == "ptx"
    ptx.launch(1, 256, (x, n), shared_mem=4 * n)
    np.testing.assert_array_equal(x.numpy(), x_h)
