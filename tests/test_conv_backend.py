"""The cuDNN backend (graph) API binding for convolutions (dnnbind.ops.conv_backend).

CPU: the enum values against the header's own text, the prototypes, cuDNN's set-time check of every attribute
type we pass (cudnnBackendSetAttribute rejects a wrong type with status 2010 before any finalize, and needs
no GPU), the fused conv + bias + ReLU graph's wiring, descriptor lifetime, the variant-pack cache and argument
checks. GPU (marker ``gpu``): every plan the heuristics give (at most 3 per case) against the float64 numpy
reference, in each direction (fwd_bias_relu skips, naming why, where cuDNN has no engine for its graph).
"""

from __future__ import annotations

import ctypes
import gc
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dnnbind._lib import cudnn as C
from dnnbind._lib.errors import CudnnBadParam, CudnnNotSupported
from dnnbind.ops import conv_backend as cb
from tests._helpers import assert_close

ROOT = Path(__file__).resolve().parents[1]
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
BACKEND_PREFIXES = ("CUDNN_BACKEND_", "CUDNN_ATTR_", "CUDNN_TYPE_", "CUDNN_HEUR_", "CUDNN_NUMERICAL_NOTE_",
                    "CUDNN_BEHAVIOR_NOTE_", "CUDNN_KNOB_TYPE_", "CUDNN_POINTWISE_")


def _header_enums() -> dict:
    try:
        import nvidia.cudnn
    except ImportError:
        pytest.skip("the nvidia-cudnn wheel (and its headers) is not installed")
    include = Path(next(iter(nvidia.cudnn.__path__))) / "include"
    if not (include / "cudnn_graph_v9.h").exists():
        pytest.skip(f"no cudnn_graph_v9.h under {include}")
    values = {}
    comments = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
    member = re.compile(r"\b(CUDNN_\w+)(?:\s+CUDNN_DEPRECATED_ENUM)?\s*=\s*(-?(?:0x[0-9a-fA-F]+|\d+))\s*[,}]")
    for header in sorted(include.glob("*_v9.h")):
        for name, value in member.findall(comments.sub(" ", header.read_text(errors="replace"))):
            assert values.setdefault(name, int(value, 0)) == int(value, 0), f"{name} differs between headers"
    return values


def test_enum_constants_match_the_header():
    header = _header_enums()
    ours = {k: v for k, v in vars(C).items() if k.startswith("CUDNN_") and type(v) is int}
    backend = {k: v for k, v in ours.items() if k.startswith(BACKEND_PREFIXES)}
    assert len(backend) >= 90, sorted(backend)
    missing = sorted(k for k in backend if k not in header)
    assert not missing, f"not in cudnn_*_v9.h: {missing}"
    # *_COUNT(S) sentinels grow with each cuDNN release (9.19's knob count is 44, 9.28's 46); we use them only as
    # array capacities, where a larger value is safe, so they may exceed an older header's
    wrong = {k: (v, header[k]) for k, v in ours.items() if k in header and header[k] != v
             and not (k.endswith(("_COUNT", "_COUNTS")) and v >= header[k])}
    assert not wrong, f"ours != header: {wrong}"
    # the legacy names we share with the backend (data types, conv mode) are checked too
    for name in ("CUDNN_DATA_FLOAT", "CUDNN_DATA_DOUBLE", "CUDNN_CROSS_CORRELATION", "CUDNN_STATUS_NOT_SUPPORTED"):
        assert header[name] == ours[name]


def test_backend_functions_bind_with_their_prototypes():
    assert cb.available()
    arity = {"cudnnBackendCreateDescriptor": 2, "cudnnBackendDestroyDescriptor": 1, "cudnnBackendFinalize": 1,
             "cudnnBackendSetAttribute": 5, "cudnnBackendGetAttribute": 6, "cudnnBackendExecute": 3}
    for name, n in arity.items():
        fn = getattr(C.lib, name)
        assert len(fn.argtypes) == n and fn.errcheck is not None, name
    assert C.lib.cudnnBackendSetAttribute.argtypes[3] is ctypes.c_int64  # int64_t elementCount


def test_import_loads_no_library():
    code = "import dnnbind.ops.conv_backend; from dnnbind._lib import loader; assert not loader.loaded()"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_cudnn_accepts_every_attribute_type_we_set(dtype):
    # cudnnBackendSetAttribute checks name/type pairs at set time (status 2010), so this needs no GPU.
    code = cb._DTYPES[dtype]
    tensors = [cb._tensor(uid, s, code, dtype.itemsize)
               for uid, s in ((1, (64, 32, 14, 14)), (2, (64, 32, 3, 3)), (3, (64, 64, 14, 14)))]
    conv = cb._conv((1, 1), (1, 1), (1, 1), code)
    made = tensors + [conv] + [cb._operation(direction, conv, *tensors, dtype)
                               for direction in ("fwd", "bwd_data", "bwd_filter", "fwd_bias_relu")]
    # fwd_bias_relu's extra pieces: the bias, the virtual intermediates, both pointwise descriptors and ops
    bias = cb._tensor(cb.UID_B, (1, 64, 1, 1), code, dtype.itemsize)
    virtual = [cb._tensor(uid, (64, 64, 14, 14), code, dtype.itemsize, virtual=True)
               for uid in (cb.UID_CONV_OUT, cb.UID_BIAS_OUT)]
    add, relu = cb._pointwise(C.CUDNN_POINTWISE_ADD, code), cb._pointwise(C.CUDNN_POINTWISE_RELU_FWD, code)
    made += [bias, *virtual, add, relu, cb._pointwise_op(add, virtual[0], virtual[1], bias),
             cb._pointwise_op(relu, virtual[1], tensors[2])]
    made += [cb._variant_pack((1, 2, 3), (256, 512, 768), 0), cb._variant_pack((2, 3, 1), (256, 512, 768), 4096),
             cb._variant_pack((1, 2, 4, 3), (256, 512, 768, 1024), 0)]
    made.append(cb.Descriptor(C.CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR).set(
        C.CUDNN_ATTR_ENGINEHEUR_MODE, C.CUDNN_TYPE_HEUR_MODE, ctypes.c_int, C.CUDNN_HEUR_MODE_A))
    cfg = cb.Descriptor(C.CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
    made.append(cb.Descriptor(C.CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR).set_descs(
        C.CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg))
    # every set above returned without CUDNN_STATUS_BAD_PARAM, and each object holds a live cuDNN descriptor
    assert len(made) == 20 and all(isinstance(m, cb.Descriptor) and m._as_parameter_ for m in made)


def test_a_wrong_attribute_type_raises_bad_param():
    t = cb.Descriptor(C.CUDNN_BACKEND_TENSOR_DESCRIPTOR)
    with pytest.raises(CudnnBadParam) as info:
        t.set(C.CUDNN_ATTR_TENSOR_UNIQUE_ID, C.CUDNN_TYPE_FLOAT, ctypes.c_float, 1.0)
    assert info.value.status == 2010 and info.value.function == "cudnnBackendSetAttribute"


def test_fused_graph_wiring(monkeypatch):
    # finalize is skipped (it needs a GPU); every SetAttribute is recorded and still checked by cuDNN
    monkeypatch.setattr(C.lib, "cudnnBackendFinalize", lambda d: 0)
    attrs, real = {}, C.lib.cudnnBackendSetAttribute

    def spy(d, name, atype, n, values):
        attrs.setdefault(d._as_parameter_, {})[name] = list(values[:n])
        return real(d, name, atype, n, values)

    monkeypatch.setattr(C.lib, "cudnnBackendSetAttribute", spy)
    xs, ws, ys = (8, 3, 10, 10), (5, 3, 3, 3), (8, 5, 5, 5)  # stride 2, padding 1
    conv = cb._conv((2, 2), (1, 1), (1, 1), C.CUDNN_DATA_FLOAT)
    conv_op, add_op, relu_op = cb._graph_ops("fwd_bias_relu", xs, ws, ys, conv, F32, 4)

    def tensor(op, attr):
        (h,) = attrs[op._as_parameter_][attr]
        return attrs[h]

    def uid(op, attr):
        return tensor(op, attr)[C.CUDNN_ATTR_TENSOR_UNIQUE_ID][0]

    def virtual(op, attr):
        return tensor(op, attr).get(C.CUDNN_ATTR_TENSOR_IS_VIRTUAL) == [True]

    assert [op.kind for op in (conv_op, add_op, relu_op)] == [
        C.CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, C.CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
        C.CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR]
    conv_x, conv_w = C.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, C.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W
    conv_y = C.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y
    assert (uid(conv_op, conv_x), uid(conv_op, conv_w), uid(conv_op, conv_y)) == (1, 2, 5)
    pw_x, pw_b, pw_y = (C.CUDNN_ATTR_OPERATION_POINTWISE_XDESC, C.CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
                        C.CUDNN_ATTR_OPERATION_POINTWISE_YDESC)
    assert (uid(add_op, pw_x), uid(add_op, pw_b), uid(add_op, pw_y)) == (5, 4, 6)
    assert (uid(relu_op, pw_x), uid(relu_op, pw_y)) == (6, 3) and pw_b not in attrs[relu_op._as_parameter_]
    assert virtual(conv_op, conv_y) and virtual(add_op, pw_y)
    assert not any(virtual(op, a) for op, a in ((add_op, pw_b), (relu_op, pw_y), (conv_op, conv_x), (conv_op, conv_w)))
    b = tensor(add_op, pw_b)
    assert b[C.CUDNN_ATTR_TENSOR_DIMENSIONS] == [1, 5, 1, 1] and b[C.CUDNN_ATTR_TENSOR_STRIDES] == [5, 1, 1, 1]
    v = tensor(add_op, pw_y)
    assert v[C.CUDNN_ATTR_TENSOR_DIMENSIONS] == list(ys) and v[C.CUDNN_ATTR_TENSOR_DATA_TYPE] == [C.CUDNN_DATA_FLOAT]
    modes = [attrs[attrs[op._as_parameter_][C.CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR][0]]
             for op in (add_op, relu_op)]
    assert [m[C.CUDNN_ATTR_POINTWISE_MODE] for m in modes] == [[C.CUDNN_POINTWISE_ADD], [C.CUDNN_POINTWISE_RELU_FWD]]
    assert all(m[C.CUDNN_ATTR_POINTWISE_MATH_PREC] == [C.CUDNN_DATA_FLOAT] for m in modes)
    assert modes[1][C.CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP] == [0.0]
    assert cb._OPS["fwd_bias_relu"][5] == (cb.UID_X, cb.UID_W, cb.UID_B, cb.UID_Y) == (1, 2, 4, 3)


def test_descriptor_is_destroyed_with_its_owner(monkeypatch):
    destroyed, real = [], C.lib.cudnnBackendDestroyDescriptor
    monkeypatch.setattr(C.lib, "cudnnBackendDestroyDescriptor", lambda h: (destroyed.append(h), real(h))[1])
    t = cb.Descriptor(C.CUDNN_BACKEND_TENSOR_DESCRIPTOR)
    op = cb.Descriptor(C.CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)
    op.set_descs(C.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, t)
    th, oh = t._as_parameter_, op._as_parameter_
    del t
    gc.collect()
    assert th not in destroyed  # still referenced by op
    del op
    gc.collect()
    assert oh in destroyed and th in destroyed


def _fake_plan(monkeypatch, workspace_size=0, alignment=4, direction="bwd_data"):
    """A BackendConvPlan around an unfinalized plan descriptor, for CPU tests of the execute path: cuDNN's
    finalize is skipped and cudnnBackendExecute records its arguments."""
    monkeypatch.setattr(C.lib, "cudnnBackendFinalize", lambda d: 0)
    calls = []
    monkeypatch.setattr(C.lib, "cudnnBackendExecute", lambda *args: calls.append(args))
    plan = object.__new__(cb.BackendConvPlan)
    plan.direction, plan.name, plan.workspace_size, plan.alignment = direction, "fake", workspace_size, alignment
    plan._plan = cb.Descriptor(C.CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
    plan._ph, plan._uids, plan._packs = plan._plan._as_parameter_, cb._OPS[direction][5], {}
    return plan, calls


def test_execute_caches_one_variant_pack_per_pointer_set(monkeypatch):
    plan, calls = _fake_plan(monkeypatch)
    assert plan._uids == (cb.UID_W, cb.UID_Y, cb.UID_X)
    plan.execute(7, (256, 512, 768))
    plan.execute(7, [256, 512, 768])  # a list works too
    assert len(plan._packs) == 1 and calls[0] == calls[1] and calls[0][:2] == (7, plan._ph)
    first = calls[0][2]
    assert isinstance(first, cb.Descriptor) and plan._plan in first._refs  # the pack keeps the plan alive
    for i in range(cb.PACK_CACHE + 5):
        plan.execute(7, (256, 512, 1024 + 256 * i))
    assert len(plan._packs) == cb.PACK_CACHE
    assert ((256, 512, 768), 0) not in plan._packs  # the oldest went first
    fn = plan.prepared(9, (256, 512, 768))
    fn()
    assert calls[-1][:2] == (9, plan._ph) and calls[-1][2] is fn.args[2] is plan._packs[((256, 512, 768), 0)]
    with pytest.raises(ValueError, match="aligned"):
        plan.execute(7, (256, 514, 768))
    with pytest.raises(ValueError, match="3 pointers"):
        plan.execute(7, (256, 512))


def test_fused_plan_takes_four_pointers(monkeypatch):
    plan, calls = _fake_plan(monkeypatch, direction="fwd_bias_relu")
    with pytest.raises(ValueError, match="4 pointers"):
        plan.execute(7, (256, 512, 768))
    with pytest.raises(ValueError, match="aligned"):
        plan.execute(7, (256, 512, 770, 1024))  # the bias pointer is checked too
    plan.execute(7, (256, 512, 768, 1024))
    assert len(calls) == 1 and len(plan._packs) == 1


def test_execute_refuses_a_missing_workspace(monkeypatch):
    plan, calls = _fake_plan(monkeypatch, workspace_size=1024)
    with pytest.raises(ValueError, match="workspace"):
        plan.execute(7, (256, 512, 768))
    plan.execute(7, (256, 512, 768), 4096)
    assert len(calls) == 1


def test_candidates_checks_its_arguments_before_cudnn():
    args = ((64, 1, 28, 28), (32, 1, 3, 3), (64, 32, 28, 28), 1, 1, 1)
    with pytest.raises(ValueError, match="direction"):
        cb.candidates(0, "bwd", *args)
    with pytest.raises(TypeError, match="float32, float64 or float16"):
        cb.candidates(0, "fwd", *args, dtype=np.int32)
    with pytest.raises(ValueError, match="math"):
        cb.candidates(0, "fwd", *args, math="bf16")
    with pytest.raises(ValueError, match="y_shape"):
        cb.candidates(0, "fwd", (64, 1, 28, 28), (32, 1, 3, 3), (64, 32, 26, 26), 1, 1, 1)
    assert cb.candidates(0, "fwd", (5, 6, 8, 8), (6, 2, 3, 3), (5, 6, 8, 8), 1, 1, 1, groups=3) == []
    assert cb.candidates(0, "fwd_bias_relu", (5, 6, 8, 8), (6, 2, 3, 3), (5, 6, 8, 8), 1, 1, 1, groups=3) == []
    with pytest.raises(ValueError, match="y_shape"):
        cb.candidates(0, "fwd_bias_relu", (64, 1, 28, 28), (32, 1, 3, 3), (64, 32, 26, 26), 1, 1, 1)


def test_candidates_returns_no_plan_when_cudnn_refuses_the_fused_graph(monkeypatch):
    # finalize is faked (it needs a GPU): the pointwise ops answer NOT_SUPPORTED, the others succeed. (Later
    # stages cannot be faked: cuDNN checks at SetAttribute time that a graph's ops really are finalized.)
    def finalize(d):
        if d.kind == C.CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
            raise CudnnNotSupported(3001, "cudnnBackendFinalize", "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN")
        return 0

    monkeypatch.setattr(C.lib, "cudnnBackendFinalize", finalize)
    skipped = []
    assert cb.candidates(0, "fwd_bias_relu", (64, 32, 14, 14), (64, 32, 3, 3), (64, 64, 14, 14), 1, 1, 1,
                         skipped=skipped) == []
    assert [name for name, why in skipped if isinstance(why, CudnnNotSupported)] == ["graph"], skipped


def test_numerical_note_filter():
    tc, nd, down = (C.CUDNN_NUMERICAL_NOTE_TENSOR_CORE, C.CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC,
                    C.CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)
    assert cb._excluded((tc,), F32, "fp32", False) and not cb._excluded((tc,), F32, "tf32", False)
    assert not cb._excluded((tc,), F64, "fp32", False)
    assert cb._excluded((nd,), F32, "tf32", True) and not cb._excluded((nd,), F32, "tf32", False)
    assert cb._excluded((down,), F32, "tf32", False)
    assert not cb._excluded((), F32, "fp32", True)


# --- GPU ----------------------------------------------------------------------------------------------------

GPU_CASES = [  # x shape, w shape, stride, padding, dilation
    ((64, 1, 28, 28), (32, 1, 3, 3), 1, 1, 1),    # SimpleCNN conv1
    ((64, 32, 14, 14), (64, 32, 3, 3), 1, 1, 1),  # SimpleCNN conv2
    ((3, 4, 11, 10), (6, 4, 3, 3), 2, 0, 1),      # stride 2, no padding, odd sizes
    ((2, 3, 12, 12), (4, 3, 3, 3), 1, 0, 2),      # dilation 2
]


def _run_case(case, direction, dtype=F32, math="fp32", deterministic=False, per_case=3, alignment=None):
    import dnnbind as d
    from dnnbind.ops import _check
    from dnnbind.ops import reference as R
    from dnnbind.ops._common import workspace
    from dnnbind.runtime.handles import cudnn_handle
    xs, ws, stride, padding, dilation = case
    ys = _check.conv_params("t", xs, ws, None, stride, padding, dilation, 1)[4]
    rng = np.random.default_rng(0)
    x, w, dy = (rng.standard_normal(s).astype(dtype) for s in (xs, ws, ys))
    f64 = np.float64
    conv = R.conv_forward(x.astype(f64), w.astype(f64), None, stride, padding, dilation)
    # fwd_bias_relu: a bias of the conv's own scale, so it moves many outputs across zero (in both directions)
    b = (rng.standard_normal(ws[0]) * conv.std()).astype(dtype)
    ref, out_shape, ins = {
        "fwd": (lambda: conv, ys, (x, w)),
        "bwd_data": (lambda: R.conv_backward_data(w.astype(f64), dy.astype(f64), xs, stride, padding, dilation),
                     xs, (w, dy)),
        "bwd_filter": (lambda: R.conv_backward_filter(x.astype(f64), dy.astype(f64), ws, stride, padding, dilation),
                       ws, (x, dy)),
        "fwd_bias_relu": (lambda: R.activation_forward(R.conv_forward(
            x.astype(f64), w.astype(f64), b.astype(f64), stride, padding, dilation, 1), "relu"), ys, (x, w, b)),
    }[direction]
    expected = ref()
    if direction == "fwd_bias_relu":  # the bias and the ReLU both matter at this data
        flipped = (conv + b.reshape(1, -1, 1, 1) > 0) != (conv > 0)
        assert 0.1 < float(np.mean(expected == 0)) < 0.9 and float(np.mean(flipped)) > 0.02
    dev = d.gpu(0)
    h = cudnn_handle(dev)
    skipped = []
    plans = cb.candidates(h, direction, xs, ws, ys, stride, padding, dilation, dtype, math, deterministic,
                          alignment=alignment, limit=per_case if direction == "fwd_bias_relu" else None,
                          skipped=skipped)
    if not plans and direction == "fwd_bias_relu":
        reasons = sorted({f"{name}: {str(why)[:160]}" for name, why in skipped})
        pytest.skip(f"cuDNN {C.version()} offers no usable engine for the conv+bias+ReLU graph ({dtype}, math={math}, "
                    f"alignment={alignment or dtype.itemsize}) at x={xs} w={ws} stride={stride} padding={padding}; "
                    f"refused/failed: {reasons}")
    assert plans, f"no backend plan for {direction} {case}"
    rtol = 1e-4 if math == "fp32" and dtype != np.float16 else 2e-2
    atol = rtol * max(1.0, float(np.abs(expected).max()))
    arrays = [d.array(v, device=dev) for v in ins]
    ptrs = tuple(a.ptr for a in arrays)
    for plan in plans[:per_case]:
        out = d.array(np.full(out_shape, np.nan, dtype), device=dev)  # beta = 0: never read
        ws_ptr, _ = workspace(dev, plan.workspace_size)
        plan.execute(h, (*ptrs, out.ptr), ws_ptr)
        assert_close(out, expected, rtol, atol, name=f"{direction} {plan.name}")
        out2 = d.array(np.full(out_shape, np.nan, dtype), device=dev)  # a second pointer set, then the cached one
        plan.execute(h, (*ptrs, out2.ptr), ws_ptr)
        plan.prepared(h, (*ptrs, out.ptr), ws_ptr)()
        assert_close(out2, expected, rtol, atol, name=f"{direction} {plan.name} (2nd pointers)")
        assert_close(out, expected, rtol, atol, name=f"{direction} {plan.name} (prepared)")
    return plans


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["fwd", "bwd_data", "bwd_filter"])
@pytest.mark.parametrize("case", GPU_CASES, ids=[str(i) for i in range(len(GPU_CASES))])
def test_backend_plans_match_reference(case, direction):
    for plan in _run_case(case, direction):
        assert C.CUDNN_NUMERICAL_NOTE_TENSOR_CORE not in plan.numerical_notes  # strict fp32
        assert plan.workspace_size >= 0 and plan.name.startswith("eng")


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["fwd", "bwd_data", "bwd_filter", "fwd_bias_relu"])
def test_backend_float16_plans_match_reference(direction):
    """Half data, float accumulation (tensor cores): within 2e-2 of the float64 reference on the same values
    (fwd_bias_relu: float intermediates, rounded to half once at y)."""
    _run_case(GPU_CASES[1], direction, dtype=np.float16, per_case=3)


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["fwd", "bwd_data", "bwd_filter"])
def test_backend_float64_tf32_and_deterministic(direction):
    _run_case(GPU_CASES[1], direction, dtype=F64, per_case=2)
    _run_case(GPU_CASES[1], direction, math="tf32", per_case=2)
    for plan in _run_case(GPU_CASES[1], direction, deterministic=True, per_case=1):
        assert C.CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC not in plan.numerical_notes


FUSED_CASES = GPU_CASES[:2] + [((64, 32, 14, 14), (64, 32, 3, 3), 2, 1, 1)]  # SimpleCNN conv1, conv2; stride 2


@pytest.mark.gpu
@pytest.mark.parametrize("math", ["fp32", "tf32"])
@pytest.mark.parametrize("case", FUSED_CASES, ids=["conv1", "conv2", "stride2"])
def test_fused_bias_relu_plans_match_reference(case, math):
    # the reference is relu(conv + b); _run_case skips (naming cuDNN's reasons) when no engine takes the graph
    for plan in _run_case(case, "fwd_bias_relu", math=math):
        assert plan.direction == "fwd_bias_relu" and plan.workspace_size >= 0
        if math == "fp32":
            assert C.CUDNN_NUMERICAL_NOTE_TENSOR_CORE not in plan.numerical_notes


@pytest.mark.gpu
def test_fused_bias_relu_16_byte_alignment():
    # runtime-fusion engines may want 16-byte pointers (dnnbind's buffers are 256-aligned, so 16 is honest here)
    plans = _run_case(FUSED_CASES[1], "fwd_bias_relu", math="tf32", alignment=16)  # checks results; skips if none
    assert plans and all(p.alignment == 16 for p in plans)


@pytest.mark.gpu
def test_fused_bias_relu_float64():
    # double intermediates: cuDNN may have no engine (a skip naming why); candidates() must not raise
    plans = _run_case(FUSED_CASES[1], "fwd_bias_relu", dtype=F64, per_case=1)  # checks results; skips if none
    assert plans and all(p.direction == "fwd_bias_relu" for p in plans)
