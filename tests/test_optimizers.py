"""Optimizers through gluon.Trainer and mx.optimizer against float64 numpy references of MXNet 1.9's update
rules (written here from python/mxnet/optimizer/optimizer.py and src/operator/optimizer_op-inl.h), plus
literal fixtures produced by MXNet 1.9.1 itself. CPU tests; the GPU twin at the end is marked ``gpu``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _helpers import assert_close

from dnnbind import autograd, nd
from dnnbind.gluon import Parameter, Trainer
from dnnbind.gluon import lr_scheduler as L
from dnnbind.gluon import optimizer as O

SHAPES = [(3, 4), (7,), (2, 3, 5)]


# -- float64 references of MXNet's rules ----------------------------------------------------------------------
def _clip(x, c, zero_clips=False):
    return x if c is None or (c == 0 and not zero_clips) else np.clip(x, -c, c)


def reference_step(name, hp, w, g, st, lr, wd, r, clip, t):
    """One MXNet update of float64 ``w`` (returned) with state dict ``st`` updated in place."""
    if name == "sgd":
        mu = hp.get("momentum", 0.0)
        if mu == 0:
            return (1 - lr * wd) * w - lr * _clip(r * g, clip)
        st["mom"] = mu * st.get("mom", 0 * w) - lr * wd * w - lr * _clip(r * g, clip)
        return w + st["mom"]
    if name == "nag":
        mu = hp.get("momentum", 0.0)
        if mu == 0:
            return (1 - lr * wd) * w - lr * _clip(r * g, clip)
        m = mu * st.get("mom", 0 * w)
        c = _clip(r * g, clip)
        new = w - m + (mu + 1) * (m - lr * (c + wd * w))
        st["mom"] = m - lr * (c + wd * new)  # MXNet's kernel reads the weight after writing it (out=weight)
        return new
    if name == "adam":
        b1, b2, eps = hp.get("beta1", 0.9), hp.get("beta2", 0.999), hp.get("epsilon", 1e-8)
        gg = _clip(r * g + wd * w, clip)
        st["m"] = b1 * st.get("m", 0 * w) + (1 - b1) * gg
        st["v"] = b2 * st.get("v", 0 * w) + (1 - b2) * gg * gg
        lr_t = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        return w - lr_t * st["m"] / (np.sqrt(st["v"]) + eps)
    if name == "adagrad":
        gg = _clip(r * g, clip, zero_clips=True)
        st["h"] = st.get("h", 0 * w) + gg * gg
        return w - lr * (gg / np.sqrt(st["h"] + hp.get("eps", 1e-7)) + wd * w)
    if name == "rmsprop":
        g1, g2, eps = hp.get("gamma1", 0.9), hp.get("gamma2", 0.9), hp.get("epsilon", 1e-8)
        gg = _clip(r * g + wd * w, clip)
        st["n"] = (1 - g1) * gg * gg + g1 * st.get("n", 0 * w)
        if hp.get("centered"):
            st["g"] = (1 - g1) * gg + g1 * st.get("g", 0 * w)
            st["d"] = g2 * st.get("d", 0 * w) - lr * gg / np.sqrt(st["n"] - st["g"] ** 2 + eps)
            new = w + st["d"]
        else:
            new = w - lr * gg / np.sqrt(st["n"] + eps)
        cw = hp.get("clip_weights")
        return np.clip(new, -cw, cw) if cw else new
    if name == "adadelta":
        rho, eps = hp.get("rho", 0.9), hp.get("epsilon", 1e-5)
        gg = _clip(r * g, clip, zero_clips=True)
        st["ag"] = rho * st.get("ag", 0 * w) + (1 - rho) * gg * gg
        d = np.sqrt(st.get("ad", 0 * w) + eps) / np.sqrt(st["ag"] + eps) * gg
        st["ad"] = rho * st.get("ad", 0 * w) + (1 - rho) * d * d
        return w - d - wd * w
    raise AssertionError(name)


CASES = [
    ("sgd", {"learning_rate": 0.1}),
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01}),
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01, "clip_gradient": 0.3}),
    ("sgd", {"learning_rate": 0.05, "wd": 0.02, "clip_gradient": 0.3, "multi_precision": True}),
    ("nag", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.05}),
    ("nag", {"learning_rate": 0.1, "momentum": 0.8, "clip_gradient": 0.2}),
    ("nag", {"learning_rate": 0.1, "wd": 0.05}),
    ("adam", {"learning_rate": 0.01, "wd": 0.01}),
    ("adam", {"learning_rate": 0.01, "beta1": 0.8, "beta2": 0.95, "clip_gradient": 0.25, "wd": 0.1}),
    ("adagrad", {"learning_rate": 0.1, "wd": 0.01}),
    ("adagrad", {"learning_rate": 0.1, "eps": 1e-3, "clip_gradient": 0.2}),
    ("rmsprop", {"learning_rate": 0.01, "wd": 0.01}),
    ("rmsprop", {"learning_rate": 0.01, "gamma1": 0.8, "clip_gradient": 0.3, "clip_weights": 0.5}),
    ("rmsprop", {"learning_rate": 0.01, "centered": True, "gamma2": 0.7, "wd": 0.02}),
    ("adadelta", {"wd": 0.01}),
    ("adadelta", {"rho": 0.7, "epsilon": 1e-4, "clip_gradient": 0.2}),
]
OPT_ARGS = {"learning_rate", "wd", "clip_gradient", "multi_precision", "rescale_grad"}


def _hp(kw):
    return {k: v for k, v in kw.items() if k not in OPT_ARGS}


def _make_params(rs, shapes, mults=None):
    params = []
    for i, shape in enumerate(shapes):
        lr_mult, wd_mult = (mults or {}).get(i, (1.0, 1.0))
        p = Parameter(f"p{i}_weight", shape=shape, lr_mult=lr_mult, wd_mult=wd_mult)
        p.initialize()
        p.set_data(nd.array(rs.uniform(-1, 1, shape).astype(np.float32)))
        params.append(p)
    return params


def _backward_with(params, grads):
    """A loss whose gradient for params[i] is exactly grads[i]."""
    with autograd.record():
        loss = None
        for p, g in zip(params, grads):
            term = (p.data() * nd.array(g.astype(np.float32))).sum()
            loss = term if loss is None else loss + term
    loss.backward()


def _run_trainer(name, kw, steps, batch_size, rs, shapes=SHAPES, mults=None, scheduler=None, ref_scheduler=None):
    params = _make_params(rs, shapes, mults)
    w = [p.data().numpy().astype(np.float64) for p in params]
    opt_kw = dict(kw, lr_scheduler=scheduler) if scheduler is not None else kw
    trainer = Trainer(params, name, opt_kw)
    states = [{} for _ in params]
    base_lr = kw.get("learning_rate", 0.001 if name in ("adam", "rmsprop") else 0.01)
    for t in range(1, steps + 1):
        grads = [rs.standard_normal(s).astype(np.float32) * 2 for s in shapes]
        _backward_with(params, grads)
        trainer.step(batch_size)
        lr = ref_scheduler(t) if ref_scheduler is not None else base_lr
        for i, g in enumerate(grads):
            lm, wm = (mults or {}).get(i, (1.0, 1.0))
            w[i] = reference_step(name, _hp(kw), w[i], g.astype(np.float64), states[i], lr * lm,
                                  kw.get("wd", 0.0) * wm, 1.0 / batch_size, kw.get("clip_gradient"), t)
    return params, w, trainer


@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
@pytest.mark.parametrize("steps", [1, 4])
def test_trainer_matches_float64_reference(name, kw, steps):
    rs = np.random.RandomState(7 + steps)
    params, want, _ = _run_trainer(name, kw, steps, batch_size=4, rs=rs)
    for p, w in zip(params, want):
        assert_close(p.data(), w, rtol=2e-5, atol=2e-6, name=f"{name} {kw} step {steps} {p.name}")


@pytest.mark.parametrize("name,kw", [c for c in CASES if c[0] in ("sgd", "adam", "rmsprop", "adadelta")][:6])
def test_groups_with_lr_and_wd_mult(name, kw):
    rs = np.random.RandomState(11)
    mults = {0: (0.5, 2.0), 2: (2.0, 0.0)}
    params, want, _ = _run_trainer(name, dict(kw, wd=0.05), 3, batch_size=2, rs=rs, mults=mults)
    for p, w in zip(params, want):
        assert_close(p.data(), w, rtol=2e-5, atol=2e-6, name=f"{name} {p.name}")


@pytest.mark.parametrize("make", [lambda lr: L.FactorScheduler(step=2, factor=0.5, base_lr=lr),
                                  lambda lr: L.MultiFactorScheduler([1, 3], factor=0.3, base_lr=lr),
                                  lambda lr: L.PolyScheduler(6, base_lr=lr, pwr=2, warmup_steps=2,
                                                             warmup_begin_lr=0.01),
                                  lambda lr: L.CosineScheduler(5, base_lr=lr, final_lr=0.01, warmup_steps=1)])
@pytest.mark.parametrize("name", ["sgd", "adam", "rmsprop"])
def test_lr_scheduler_through_trainer(make, name):
    # The reference asks its own twin scheduler for num_update = t: MXNet counts the update before asking.
    rs = np.random.RandomState(5)
    kw = {"learning_rate": 0.2, "momentum": 0.9} if name == "sgd" else {"learning_rate": 0.02}
    ref = make(kw["learning_rate"])
    params, want, trainer = _run_trainer(name, kw, 6, 3, rs, shapes=[(4, 3)], scheduler=make(kw["learning_rate"]),
                                         ref_scheduler=ref)
    for p, w in zip(params, want):
        assert_close(p.data(), w, rtol=2e-5, atol=2e-6, name=f"{name} with {type(ref).__name__}")
    assert trainer.optimizer.num_update == 6
    assert trainer.learning_rate == pytest.approx(ref(6))


# Literal fixtures: MXNet 1.9.1 (CPU wheel, python 3.8, /tmp/mx38) ran
#   opt = mx.optimizer.create(name, **kw); upd = mx.optimizer.get_updater(opt); w = mx.nd.array(W0)
#   for k in range(3): upd(0, mx.nd.array(G(k)), w)
# and printed w.asnumpy().ravel().tolist() (float32 values; the last case adds FactorScheduler(step=1, factor=0.5)).
W0 = np.linspace(-1, 1, 12).reshape(3, 4).astype(np.float32)


def G(k):
    return (np.cos(np.arange(12) * 0.7 + k) * 3).reshape(3, 4).astype(np.float32)


MXNET_FIXTURES = [
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.1, "rescale_grad": 0.5, "clip_gradient": 1.0},
     [-1.3023426532745361, -0.9033563137054443, -0.38009384274482727, 0.048310309648513794, 0.18552722036838531,
      0.14111796021461487, 0.04953205585479736, -0.10619905591011047, -0.06463578343391418, 0.24932196736335754,
      0.6467129588127136, 1.171904444694519]),
    ("sgd", {"learning_rate": 0.1, "wd": 0.1, "rescale_grad": 0.5},
     [-1.1351269483566284, -0.751579999923706, -0.38792797923088074, -0.13222989439964294, -0.021772336214780807,
      -0.02553310990333557, -0.058771342039108276, -0.022882409393787384, 0.14822666347026825, 0.4570527672767639,
      0.8413223624229431, 1.2032794952392578]),
    ("nag", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.1, "rescale_grad": 0.5, "clip_gradient": 1.0},
     [-1.348418116569519, -0.8426529169082642, -0.21466857194900513, 0.26087918877601624, 0.3197845220565796,
      0.14045821130275726, -0.050272136926651, -0.29692918062210083, -0.2488037496805191, 0.1693383902311325,
      0.6717323064804077, 1.3012926578521729]),
    ("adam", {"learning_rate": 0.01, "wd": 0.1, "rescale_grad": 0.5, "clip_gradient": 1.0},
     [-1.0230114459991455, -0.8307144045829773, -0.6324996948242188, -0.42455002665519714, -0.245496466755867,
      -0.07179029285907745, 0.09575850516557693, 0.2441597431898117, 0.4253148138523102, 0.6120314002037048,
      0.8039682507514954, 1.0021514892578125]),
    ("adagrad", {"learning_rate": 0.1, "wd": 0.1, "rescale_grad": 0.5, "clip_gradient": 1.0},
     [-1.087007999420166, -0.8030456900596619, -0.5499526858329773, -0.20746491849422455, -0.10585439950227737,
      -0.02935921773314476, 0.04771537333726883, 0.0019115358591079712, 0.24728010594844818, 0.5034133791923523,
      0.786864161491394, 1.0385619401931763]),
    ("rmsprop", {"learning_rate": 0.01, "wd": 0.1, "rescale_grad": 0.5, "clip_gradient": 1.0, "clip_weights": 0.9},
     [-0.8831057548522949, -0.8178393244743347, -0.6141072511672974, -0.3786870241165161, -0.22080007195472717,
      -0.07204018533229828, 0.07674315571784973, 0.18824955821037292, 0.3903760313987732, 0.5974963903427124,
      0.8145545721054077, 0.8999999761581421]),
    ("rmsprop", {"learning_rate": 0.01, "wd": 0.1, "rescale_grad": 0.5, "centered": True, "gamma2": 0.8},
     [-1.0959720611572266, -0.8577354550361633, -0.6315679550170898, -0.2994779348373413, -0.15172162652015686,
      -0.015264308080077171, 0.10332468152046204, 0.10728821903467178, 0.3152518570423126, 0.5351289510726929,
      0.7681078314781189, 1.0016261339187622]),
    ("adadelta", {"wd": 0.1, "rescale_grad": 0.5, "clip_gradient": 1.0, "rho": 0.8},
     [-0.7349527478218079, -0.5927603244781494, -0.4508393108844757, -0.31033042073249817, -0.18769443035125732,
      -0.06521262228488922, 0.05635780468583107, 0.17438940703868866, 0.3153132200241089, 0.4582253098487854,
      0.6004088521003723, 0.7421549558639526]),
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "factor_schedule": True},
     [-1.9357751607894897, -1.3354724645614624, -0.49187982082366943, 0.2837596833705902, 0.7121629118919373,
      0.6773567795753479, 0.28122323751449585, -0.20441798865795135, -0.4656503200531006, -0.2941003143787384,
      0.3150615096092224, 1.160848617553711]),
]


def _fixture_kw(kw):
    kw = dict(kw)
    if kw.pop("factor_schedule", False):
        kw["lr_scheduler"] = L.FactorScheduler(step=1, factor=0.5)
    return kw


@pytest.mark.parametrize("name,kw,want", MXNET_FIXTURES, ids=[f"{f[0]}-{i}" for i, f in enumerate(MXNET_FIXTURES)])
def test_matches_mxnet_fixture_direct_update(name, kw, want):
    opt = O.create(name, **_fixture_kw(kw))
    w = nd.array(W0)
    state = opt.create_state(0, w)
    for k in range(3):
        opt.update(0, w, nd.array(G(k)), state)
    assert_close(w.numpy().ravel(), np.array(want), rtol=1e-6, atol=3e-7, name=f"{name} {kw}")


@pytest.mark.parametrize("name,kw,want", MXNET_FIXTURES, ids=[f"{f[0]}-{i}" for i, f in enumerate(MXNET_FIXTURES)])
def test_matches_mxnet_fixture_through_trainer(name, kw, want):
    kw = _fixture_kw(kw)
    rescale = kw.pop("rescale_grad", 1.0)
    p = Parameter("w_weight", shape=W0.shape)
    p.initialize()
    p.set_data(nd.array(W0))
    trainer = Trainer([p], name, kw)
    for k in range(3):
        _backward_with([p], [G(k)])
        trainer.step(round(1 / rescale))  # step(b) rescales by 1/b
    assert_close(p.data().numpy().ravel(), np.array(want), rtol=1e-6, atol=3e-7, name=f"{name} {kw}")


def test_create_names_defaults_and_errors():
    assert isinstance(O.create("SGD"), O.SGD) and O.create("sgd").lr == 0.01
    assert O.create("adam").lr == 0.001 and O.create("rmsprop").lr == 0.001
    for name, cls in [("nag", O.NAG), ("adagrad", O.AdaGrad), ("rmsprop", O.RMSProp), ("adadelta", O.AdaDelta)]:
        assert type(O.create(name)) is cls
    assert O.create("rmsprop", centered=True).n_states == 3 and O.create("rmsprop").n_states == 1
    with pytest.raises(ValueError, match="unknown optimizer"):
        O.create("adamax_typo")
    with pytest.raises(TypeError, match="unexpected keyword argument 'momentun' .did you mean 'momentum'"):
        O.create("sgd", momentun=0.9)  # MXNet: "__init__() got an unexpected keyword argument 'momentun'"
    with pytest.raises(ValueError, match="clip_gradient"):
        O.create("sgd", clip_gradient=-1.0)
    # No learning_rate: the scheduler's base_lr is used (MXNet); an explicit one overrides it.
    s = L.FactorScheduler(step=10, base_lr=0.3)
    assert O.create("sgd", lr_scheduler=s).learning_rate == pytest.approx(0.3)
    s2 = L.FactorScheduler(step=10, base_lr=0.3)
    assert O.create("sgd", learning_rate=0.05, lr_scheduler=s2).learning_rate == pytest.approx(0.05)
    import dnnbind.mxnet  # noqa: F401  (the alias maps mxnet.optimizer to this module)
    from dnnbind.mxnet import _finder
    assert _finder.TARGETS["mxnet.optimizer"] == ("dnnbind.gluon.optimizer",)


def test_learning_rate_property_and_setter():
    rs = np.random.RandomState(0)
    params = _make_params(rs, [(5, 2)])
    trainer = Trainer(params, "sgd", {"learning_rate": 0.1})
    assert trainer.learning_rate == pytest.approx(0.1)
    trainer.set_learning_rate(0.02)
    w = params[0].data().numpy().astype(np.float64)
    g = rs.standard_normal((5, 2)).astype(np.float32)
    _backward_with(params, [g])
    trainer.step(2)
    assert_close(params[0].data(), w - 0.02 * g / 2, rtol=1e-6, atol=1e-7, name="after set_learning_rate")
    t2 = Trainer(_make_params(rs, [(3,)]), "sgd", {"learning_rate": 0.1,
                                                  "lr_scheduler": L.FactorScheduler(step=1, factor=0.5)})
    with pytest.raises(RuntimeError, match="LRScheduler"):
        t2.set_learning_rate(0.5)


def test_allreduce_then_update_equals_step():
    rs = np.random.RandomState(3)
    a = _make_params(np.random.RandomState(1), SHAPES)
    b = _make_params(np.random.RandomState(1), SHAPES)
    ta = Trainer(a, "rmsprop", {"learning_rate": 0.01, "centered": True})
    tb = Trainer(b, "rmsprop", {"learning_rate": 0.01, "centered": True})
    for _ in range(3):
        grads = [rs.standard_normal(s) for s in SHAPES]
        _backward_with(a, grads)
        _backward_with(b, grads)
        ta.step(8)
        tb.allreduce_grads()
        tb.update(8)
    for pa, pb in zip(a, b):
        np.testing.assert_array_equal(pa.data().numpy(), pb.data().numpy())


@pytest.mark.parametrize("name,kw", [("rmsprop", {"centered": True, "wd": 0.01}), ("adadelta", {}),
                                     ("nag", {"momentum": 0.9}), ("adagrad", {"learning_rate": 0.1})])
def test_save_and_load_states_resume_exactly(tmp_path, name, kw):
    rs = np.random.RandomState(9)
    grads = [[rs.standard_normal(s) for s in SHAPES] for _ in range(4)]
    a = _make_params(np.random.RandomState(2), SHAPES)
    ta = Trainer(a, name, kw)
    for k in range(4):
        _backward_with(a, grads[k])
        ta.step(4)
        if k == 1:
            ta.save_states(tmp_path / "s.states")
            snapshot = [p.data().numpy().copy() for p in a]
    b = _make_params(np.random.RandomState(2), SHAPES)
    for p, v in zip(b, snapshot):
        p.set_data(nd.array(v))
    tb = Trainer(b, name, kw)
    tb.load_states(tmp_path / "s.states")
    for k in (2, 3):
        _backward_with(b, grads[k])
        tb.step(4)
    for pa, pb in zip(a, b):
        np.testing.assert_array_equal(pa.data().numpy(), pb.data().numpy())
    other = Trainer(_make_params(rs, SHAPES), "sgd", {"momentum": 0.9})
    with pytest.raises(ValueError, match="load_states"):
        other.load_states(tmp_path / "s.states")


def test_begin_num_update_counts_like_mxnet():
    # Adam's bias correction uses t = begin_num_update + 1 on the first step; the scheduler sees it too.
    rs = np.random.RandomState(4)
    p = _make_params(rs, [(6,)])[0]
    w0 = p.data().numpy().astype(np.float64)
    t = Trainer([p], "adam", {"learning_rate": 0.01, "begin_num_update": 10})
    g = rs.standard_normal(6)
    _backward_with([p], [g])
    t.step(1)
    st = {}
    assert_close(p.data(), reference_step("adam", {}, w0, g.astype(np.float32).astype(np.float64), st, 0.01, 0,
                                          1.0, None, 11), rtol=1e-5, atol=1e-6, name="adam t=11")
    assert t.optimizer.num_update == 11


class _SignSGD(O.Optimizer):
    """A custom optimizer written against MXNet's per-array API."""

    def create_state(self, index, weight):
        return nd.zeros(weight.shape)

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        state[:] = state + 1
        weight[:] = weight - (nd.sign(grad) + weight * wd) * lr


def test_custom_optimizer_subclass_through_trainer():
    rs = np.random.RandomState(8)
    params = _make_params(rs, [(4, 3), (5,)], mults={1: (0.5, 1.0)})
    w = [p.data().numpy().astype(np.float64) for p in params]
    trainer = Trainer(params, _SignSGD(learning_rate=0.1, wd=0.1))
    for _ in range(2):
        grads = [rs.standard_normal(p.shape) for p in params]
        _backward_with(params, grads)
        trainer.step(3)
        for i, g in enumerate(grads):
            lr = 0.1 * (0.5 if i == 1 else 1.0)
            w[i] = w[i] - (np.sign(g) + 0.1 * w[i]) * lr
    for p, want in zip(params, w):
        assert_close(p.data(), want, rtol=1e-6, atol=1e-6, name=f"custom {p.name}")
    assert trainer.optimizer.num_update == 2
    with pytest.raises(ValueError, match="custom optimizer"):
        trainer.save_states("/tmp/never-written.states")


@pytest.mark.gpu
@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_gpu_trainer_matches_cpu(name, kw):
    from dnnbind import gpu
    rs = np.random.RandomState(12)
    inits = [rs.uniform(-1, 1, s).astype(np.float32) for s in SHAPES]
    grads = [[rs.standard_normal(s) for s in SHAPES] for _ in range(3)]
    results = []
    for ctx in (None, gpu(0)):
        params = []
        for i, (s, v) in enumerate(zip(SHAPES, inits)):
            p = Parameter(f"q{i}_weight", shape=s)
            p.initialize(ctx=ctx)
            p.set_data(nd.array(v))
            params.append(p)
        trainer = Trainer(params, name, kw)
        for k in range(3):
            with autograd.record():
                loss = sum(((p.data() * nd.array(g.astype(np.float32)).as_in_context(p.data().context)).sum()
                            for p, g in zip(params, grads[k])), nd.zeros((1,)).as_in_context(params[0].data().context))
            loss.backward()
            trainer.step(4)
        results.append([p.data().numpy() for p in params])
    for c, g in zip(*results):
        assert_close(g, c, rtol=1e-5, atol=1e-6, name=f"gpu {name}")
