"""dnnbind.trace with CUPTI: demangled kernel names, and the "GPU µs" column as the sum of each call's kernels.

CPU tests: the demangler on Itanium-mangled names (libstdc++'s own ``__cxa_demangle``), a fake cupti-python
module feeding activity records to a real trace of a fake cuDNN function, ``_cupti.collect`` on a session built by
hand, and the renderings in both modes. The ``gpu`` test traces real kernels (and CUPTI where it is installed).
"""

from __future__ import annotations

import ctypes
import itertools
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import dnnbind
from dnnbind import trace
from dnnbind._lib import cfunc
from dnnbind.trace import Record, Trace, _cupti, _demangle
from dnnbind.trace._demangle import demangle
from dnnbind.trace._format import short_kernel

POOL = ("_ZN5cudnn20pooling_fw_4d_kernelIffNS_15maxpooling_funcIffL21cudnnNanPropagation_t1EEELi0ELb0EEEv"
        "17cudnnTensorStructPKT_S5_PT0_")
POOL_PREFIX = ("void cudnn::pooling_fw_4d_kernel<float, float, cudnn::maxpooling_func<float, float, "
               "(cudnnNanPropagation_t)1>, 0, false>(cudnnTensorStruct, ")
SGEMM = "cutlass_80_simt_sgemm_64x64_8x5_tn_align1"


# --- the demangler -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mangled, readable", [
    ("_ZN3foo3barEv", "foo::bar()"),
    ("_Z3addIfEvPT_S1_i", "void add<float>(float*, float*, int)"),
    ("_Z3fooPKc", "foo(char const*)"),
    ("_ZN12_GLOBAL__N_13fooEv", "(anonymous namespace)::foo()"),
    ("_ZN8internal5gemvx6kernelIiiffffLb0ELb1EEEvv",
     "void internal::gemvx::kernel<int, int, float, float, float, float, false, true>()"),
    (f"_ZN7cutlass7Kernel2I{len(SGEMM)}{SGEMM}EEvNT_6ParamsE", f"void cutlass::Kernel2<{SGEMM}>({SGEMM}::Params)"),
])
def test_demangle_itanium_names(mangled, readable):
    assert demangle(mangled) == readable


def test_demangle_cudnn_kernel():
    assert demangle(POOL).startswith(POOL_PREFIX)


@pytest.mark.parametrize("name", [
    "fill_f32", "add2_kernel", "dn_map", "sm90_xmma_fprop_implicit_gemm", "cudnn::foo<float>(int)", "",
    "i", "f", "Pf",  # bare type encodings: __cxa_demangle alone would answer "int", "float", "float*"
    "_Zbogus", "_ZN3foo",  # start like a symbol, are not one: status != 0
])
def test_demangle_passes_other_names_through(name):
    assert demangle(name) == name


@pytest.fixture
def fresh_cache():
    demangle.cache_clear()
    yield
    demangle.cache_clear()


def test_demangle_without_libstdcxx_returns_the_name(monkeypatch, fresh_cache):
    monkeypatch.setattr(_demangle, "_functions", lambda: ())
    assert demangle("_ZN3foo3barEv") == "_ZN3foo3barEv"


def test_demangle_never_raises(monkeypatch, fresh_cache):
    def broken():
        raise OSError("no such library")
    monkeypatch.setattr(_demangle, "_functions", broken)
    assert demangle("_ZN3foo3barEv") == "_ZN3foo3barEv"


def test_demangle_frees_and_caches(monkeypatch, fresh_cache):
    fn, free = _demangle._functions()
    freed = []
    monkeypatch.setattr(_demangle, "_functions", lambda: (fn, lambda p: (freed.append(p), free(p))))
    assert demangle("_ZN3foo3barEv") == "foo::bar()" and len(freed) == 1
    assert demangle("_ZN3foo3barEv") == "foo::bar()" and len(freed) == 1  # the second answer is the cache's
    assert demangle.cache_info().hits == 1


def test_short_kernel_keeps_the_table_narrow():
    full = demangle(POOL)
    short = short_kernel(full, 100)
    assert short == ("cudnn::pooling_fw_4d_kernel<float, float, cudnn::maxpooling_func<...>, 0, false>(...)")
    assert short_kernel(full, 40) == short[:37] + "..."
    assert short_kernel("void add<float>(float*, float*, int)", 100) == "add<float>(float*, float*, int)"
    assert short_kernel("fill_f32", 10) == "fill_f32"


# --- CUPTI faked: a trace of a fake cuDNN function whose "kernels" the fake CUPTI reports -------------------------

class FakeCupti:
    """The part of cupti-python's ``cupti.cupti`` that _cupti uses; ``launch`` plays an API call and its kernel."""

    class ActivityKind:
        CONCURRENT_KERNEL, RUNTIME, DRIVER = 10, 5, 6

    def __init__(self, fail_flush: bool = False):
        self.clock, self.corr = itertools.count(1000, 1000), itertools.count(1)  # ns, correlation ids
        self.enabled, self.fail_flush = set(), fail_flush

    def activity_register_callbacks(self, requested, completed):
        self.completed = completed

    def activity_enable(self, kind):
        self.enabled.add(kind)

    def activity_disable(self, kind):
        self.enabled.discard(kind)

    def get_timestamp(self) -> int:
        return next(self.clock)

    def activity_flush_all(self, flag):
        if self.fail_flush:
            raise RuntimeError("CUPTI_ERROR_UNKNOWN")

    def launch(self, name: str, us: float) -> None:
        """The driver's launch API record, inside the calling window, then the kernel it launched."""
        corr, at = next(self.corr), self.get_timestamp()
        _cupti._acts.append((None, at, at + 10, corr))
        _cupti._acts.append((name, at + 100, at + 100 + int(us * 1000), corr))


@pytest.fixture
def fake_cupti(monkeypatch):
    fake = FakeCupti()
    module = types.ModuleType("cupti")
    module.cupti = fake
    monkeypatch.setitem(sys.modules, "cupti", module)
    monkeypatch.setattr(_cupti, "_registered", [])  # the real callbacks stay unregistered
    monkeypatch.setattr(_cupti, "_acts", [])
    return fake


@pytest.fixture
def fake_cudnn():
    """A Library named cudnn (a GPU library for the report) whose functions are Python stand-ins."""
    sig = (ctypes.c_int, [ctypes.c_void_p])
    return cfunc.Library("cudnn", {"cudnnPoolingForward": sig, "cudnnAddTensor": sig, "cudnnSetStream": sig}, None)


def _traced_calls(lib, fake, cupti: bool = True) -> Trace:
    lib.cudnnPoolingForward = lambda h: (fake.launch(POOL, 8.5), fake.launch("fill_f32", 1.25))[1] or 0
    lib.cudnnAddTensor = lambda h: 0  # launches nothing
    lib.cudnnSetStream = lambda h: 0  # setup: no GPU work
    with trace(libraries=[lib], cupti=cupti) as t, trace.scope("pooling_forward", op=True):
        lib.cudnnSetStream(None)
        lib.cudnnPoolingForward(None)
        lib.cudnnAddTensor(None)
    return t


def test_fake_cupti_kernels_are_demangled_and_summed(fake_cupti, fake_cudnn):
    t = _traced_calls(fake_cudnn, fake_cupti)
    assert t.cupti and t.gpu_time == "kernels" and not fake_cupti.enabled  # enabled on entry, disabled on exit
    setup, pool, add = t.records
    assert pool.kernels == [[demangle(POOL), 8.5], ["fill_f32", 1.25]] and pool.kernels[0][0].startswith("void cudnn")
    assert pool.gpu_us == pytest.approx(9.75)
    # no CUDA events on a CPU machine, so the calls without kernels keep None (Record's docstring)
    assert setup.kernels == add.kernels == [] and setup.gpu_us is None and add.gpu_us is None
    assert [k[0] for k in t.kernel_spans] == [demangle(POOL), "fill_f32"]
    text = str(t)
    assert f"note: {trace.GPU_TIME_NOTES['kernels']}" in text and trace.CUPTI_NOTE not in text
    assert "      -> cudnn::pooling_fw_4d_kernel<float, float, cudnn::maxpooling_func<...>, 0, false>(...)  8.50 µs" \
        in text.splitlines()
    assert "      -> fill_f32  1.25 µs" in text.splitlines()
    assert any(ln.split()[:4] == ["1", "pooling_forward", "pooling_forward", "cudnnPoolingForward"]
               and ln.split()[-2] == "9.75" for ln in text.splitlines())
    s = t.summary()
    assert s["gpu_time"] == "kernels" and s["gpu_us"] == pytest.approx(9.75)


def test_fake_cupti_names_reach_json_and_chrome(fake_cupti, fake_cudnn, tmp_path):
    t = _traced_calls(fake_cudnn, fake_cupti)
    data = json.loads(t.to_json())
    assert data["records"][1]["kernels"][0][0] == demangle(POOL) and data["summary"]["gpu_time"] == "kernels"
    assert data["kernels"][0][0] == demangle(POOL)
    text = t.to_json()
    assert "_ZN5cudnn" not in text and POOL_PREFIX.replace('"', '\\"') in text
    events = json.loads(Path(t.to_chrome(str(tmp_path / "c.json"))).read_text())["traceEvents"]
    assert [e["name"] for e in events if e["ph"] == "X" and e["tid"] == 3] == [demangle(POOL), "fill_f32"]


def test_without_cupti_the_column_is_event_time_and_says_so(fake_cupti, fake_cudnn):
    t = _traced_calls(fake_cudnn, fake_cupti, cupti=False)
    assert not t.cupti and t.gpu_time == "events" and all(r.kernels == [] for r in t.records)
    lines = str(t).splitlines()
    assert lines[-2:] == [f"note: {trace.GPU_TIME_NOTES['events']}", f"note: {trace.CUPTI_NOTE}"]
    assert "CUDA-event time around each call (launch gaps included)" in lines[-2]
    assert 'pip install "dnnbind[trace]"' in lines[-1]
    assert t.summary()["gpu_time"] == "events"


def test_cupti_failure_falls_back_to_event_times(fake_cupti, fake_cudnn):
    fake_cupti.fail_flush = True
    t = _traced_calls(fake_cudnn, fake_cupti)
    assert t.cupti and t.gpu_time == "events"
    assert any(n.startswith("CUPTI failed (CUPTI_ERROR_UNKNOWN)") for n in t.notes)
    assert f"note: {trace.GPU_TIME_NOTES['events']}" in str(t)


# --- _cupti.collect on a session built by hand: the rule for gpu_us ---------------------------------------------

def _session(fake, records, windows):
    return types.SimpleNamespace(cupti=fake, cupti_t0=0, base={}, windows=windows, records=records, notes=[],
                                 kernel_spans=[], kernel_times=True)


def test_collect_sums_kernels_and_keeps_event_time(monkeypatch):
    monkeypatch.setattr(_cupti, "_acts", [])
    conv = Record(0, "net", "conv_forward", "cudnn", "cudnnConvolutionForward", gpu_us=105.0, event_us=105.0)
    empty = Record(1, "net", "linear_forward", "cublas", "cublasSscal_v2", gpu_us=6.0, event_us=6.0)
    setup = Record(2, "net", "conv_forward", "cudnn", "cudnnSetTensor4dDescriptor")
    numpy_call = Record(3, "net", "relu", "numpy", "relu", host_us=3.0)
    _cupti._acts[:] = [(None, 1_100, 1_110, 7), ("_ZN3foo3barEv", 5_000, 5_000 + 8_700, 7),
                       (None, 1_200, 1_210, 8), ("fill_f32", 14_000, 14_000 + 300, 8),
                       ("stray_kernel", 20_000, 21_000, 99)]  # no API record: nobody's
    s = _session(FakeCupti(), [conv, empty, setup, numpy_call],
                 [(1_000, 1_500, conv), (2_000, 2_500, empty), (3_000, 3_500, setup)])
    _cupti.collect(s)
    assert conv.kernels == [["foo::bar()", pytest.approx(8.7)], ["fill_f32", pytest.approx(0.3)]]
    assert conv.gpu_us == pytest.approx(9.0) and conv.event_us == 105.0  # the kernels, not the 105 µs around them
    assert empty.gpu_us == 0.0 and empty.event_us == 6.0  # GPU work expected, none ran
    assert setup.gpu_us is None and numpy_call.gpu_us is None  # nothing expected, nothing ran
    assert [k[0] for k in s.kernel_spans] == ["foo::bar()", "fill_f32", "stray_kernel"]
    assert s.windows == [] and s.notes == [] and s.kernel_times


def test_collect_failure_restores_event_times(monkeypatch):
    monkeypatch.setattr(_cupti, "_acts", [])
    conv = Record(0, "net", "conv_forward", "cudnn", "cudnnConvolutionForward", gpu_us=3.0, event_us=105.0)
    s = _session(FakeCupti(fail_flush=True), [conv], [(1_000, 1_500, conv)])
    _cupti.collect(s)
    assert conv.gpu_us == 105.0 and not s.kernel_times and "CUPTI failed" in s.notes[0] and s.windows == []


# --- renderings by hand: both modes -------------------------------------------------------------------------------

def _report(gpu_time: str) -> Trace:
    t = Trace()
    t.cupti, t.gpu_time = gpu_time == "kernels", gpu_time
    t.records = [Record(0, "net/pool", "pooling_forward", "cudnn", "cudnnPoolingForward", {},
                        8.7 if gpu_time == "kernels" else 105.0, 20.0, 10.0, 12.0,
                        [[demangle(POOL), 8.7]] if gpu_time == "kernels" else [], event_us=105.0)]
    return t


@pytest.mark.parametrize("gpu_time", ["kernels", "events"])
def test_table_and_chrome_in_both_modes(gpu_time, tmp_path):
    t = _report(gpu_time)
    text = str(t)
    assert f"note: {trace.GPU_TIME_NOTES[gpu_time]}" in text.splitlines()
    assert (trace.CUPTI_NOTE in text) == (gpu_time == "events")
    assert text.splitlines()[1].split()[-2] == ("8.70" if gpu_time == "kernels" else "105.00")
    events = json.loads(Path(t.to_chrome(str(tmp_path / "c.json"))).read_text())["traceEvents"]
    (call,) = [e for e in events if e["ph"] == "X" and e["tid"] == 2]  # the events' track: always the event time
    assert call["dur"] == 105.0 and call["args"]["gpu_us"] == t.records[0].gpu_us


# --- on a GPU ---------------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_column_matches_the_mode(gpu, monkeypatch):
    from dnnbind.nd import _lower
    monkeypatch.setattr(_lower, "USE_CUDNN_OPTENSOR", False)  # a + a as one generated kernel
    a = dnnbind.array(np.arange(1 << 16, dtype=np.float32), device=gpu)
    a + a  # compile outside the trace
    with trace() as t:
        b = a + a
    np.testing.assert_array_equal(b.numpy(), np.arange(1 << 16, dtype=np.float32) * 2)
    (rec,) = [r for r in t.records if r.library == "kernel"]
    assert rec.op == "add" and rec.event_us is not None and rec.event_us > 0
    if t.gpu_time == "kernels":  # cupti-python installed
        assert rec.kernels and rec.gpu_us == pytest.approx(sum(us for _, us in rec.kernels))
        assert all(not name.startswith("_Z") for name, _ in rec.kernels)
    else:
        assert rec.gpu_us == rec.event_us and trace.CUPTI_NOTE in str(t)
