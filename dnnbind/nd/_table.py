"""Layer nd: the element-wise and reduction ops, one entry each. Imports numpy and nd._registry.

Adding an element-wise op is one line here: name, numpy twin, C expression over ``a, b, c`` (the GPU lowering,
compiled by NVRTC for every dtype and broadcast pattern), gradient rule written with nd ops, and options. The
gradient rule is ``grad(g, out, *inputs, **params)`` and returns one gradient per input (None where there is
none); inputs may be Python scalars. Broadcasting is undone by the dispatcher, never here.

MXNet 1.x semantics: results keep the input dtype (comparisons give 0/1 in that dtype); two array operands
must share a dtype; full reductions return shape (1,); ``round`` rounds half away from zero.
"""

from __future__ import annotations

import math

import numpy as np

from .. import autograd
from ..runtime.array import NDArray
from ._lower import activation, optensor, relu_backward
from .._lib.errors import DnnbindValueError
from ..ops.opdef import typed
from ._registry import Op, REGISTRY, call, composite, keepdims_shape, norm_axes, reduced_size, register

_erf = np.frompyfunc(math.erf, 1, 1)
_SQRT_PI_2 = 2.0 / math.sqrt(math.pi)


def _np_round(x):
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _np_rint(x):
    f = np.floor(x)
    return np.where(x - f <= 0.5, f, np.ceil(x))


def unary(name, numpy, expr, grad, ints=False, methods=None, nd=None, differentiable=True, lib=None, saves=None):
    return register(Op(name, "map", numpy, expr=expr, grad=grad, ints=ints, lib=lib,
                       methods=(name,) if methods is None else methods, nd=nd, differentiable=differentiable,
                       saves=saves))


def binary(name, numpy, expr, grad, nd=(), methods=(), ints=True, out_dtype=None, differentiable=True, lib=None,
           saves=None):
    return register(Op(name, "map", numpy, expr=expr, grad=grad, ints=ints,
                       nd=() if nd == () and name.startswith("_") else (name, *nd), methods=methods,
                       out_dtype=out_dtype, differentiable=differentiable, lib=lib, arity=2, saves=saves))


OUT = ("out",)  # saves=OUT: the gradient is a function of the output alone (exp, relu, sigmoid, ...)


def _zero(g, out, *inputs, **_):
    return tuple(g * 0 if hasattr(x, "shape") else None for x in inputs)


def _nd(x):
    """x if it is an array operand, else None (scalar operands get no gradient)."""
    return x if isinstance(x, (NDArray, autograd.Released)) else None


def _b(x, term):
    """The gradient term ``term()`` for operand x, computed only when x is an array that needs a gradient."""
    return term() if isinstance(x, (NDArray, autograd.Released)) and autograd.needs_grad(x) else None


# -- unary math ------------------------------------------------------------------------------------------------

unary("exp", np.exp, "exp(a)", lambda g, y, a: g * y, saves=OUT)
unary("log", np.log, "log(a)", lambda g, y, a: g / a)
unary("log2", np.log2, "log2(a)", lambda g, y, a: g / (a * math.log(2.0)))
unary("log10", np.log10, "log10(a)", lambda g, y, a: g / (a * math.log(10.0)))
unary("log1p", np.log1p, "log1p(a)", lambda g, y, a: g / (a + 1.0))
unary("expm1", np.expm1, "expm1(a)", lambda g, y, a: g * (y + 1.0), saves=OUT)
unary("sqrt", np.sqrt, "sqrt(a)", lambda g, y, a: g * 0.5 / y, saves=OUT)
unary("rsqrt", lambda x: 1.0 / np.sqrt(x), "rsqrt(a)", lambda g, y, a: g * (y * y * y) * -0.5, saves=OUT)
unary("cbrt", np.cbrt, "cbrt(a)", lambda g, y, a: g / (y * y * 3.0), saves=OUT)
unary("square", np.square, "a * a", lambda g, y, a: g * a * 2, ints=True)
unary("reciprocal", np.reciprocal, "1 / a", lambda g, y, a: -(g * y * y), saves=OUT)
unary("abs", np.abs, "a < 0 ? -a : a", lambda g, y, a: g * sign(a), ints=True)
unary("sign", np.sign, "(a > 0) - (a < 0)", _zero, ints=True)
unary("negative", np.negative, "-a", lambda g, y, a: -g, ints=True, saves=())
unary("floor", np.floor, "floor(a)", _zero)
unary("ceil", np.ceil, "ceil(a)", _zero)
unary("trunc", np.trunc, "trunc(a)", _zero, nd=("trunc", "fix"))
unary("round", _np_round, "round(a)", _zero)
unary("rint", _np_rint, "(a - floor(a) <= 0.5 ? floor(a) : ceil(a))", _zero)
unary("sin", np.sin, "sin(a)", lambda g, y, a: g * cos(a))
unary("cos", np.cos, "cos(a)", lambda g, y, a: -(g * sin(a)))
unary("tan", np.tan, "tan(a)", lambda g, y, a: g * (y * y + 1.0), saves=OUT)
unary("arcsin", np.arcsin, "asin(a)", lambda g, y, a: g * rsqrt(1.0 - a * a))
unary("arccos", np.arccos, "acos(a)", lambda g, y, a: -(g * rsqrt(1.0 - a * a)))
unary("arctan", np.arctan, "atan(a)", lambda g, y, a: g / (a * a + 1.0))
unary("sinh", np.sinh, "sinh(a)", lambda g, y, a: g * cosh(a))
unary("cosh", np.cosh, "cosh(a)", lambda g, y, a: g * sinh(a))
unary("tanh", np.tanh, "tanh(a)", lambda g, y, a: _act_grad("tanh", g, y), lib=activation("tanh"), saves=OUT)
unary("erf", lambda x: np.asarray(_erf(x), dtype=np.result_type(x)), "erf(a)", lambda g, y, a: g * exp(-(a * a)) * _SQRT_PI_2)
unary("sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x)), "1 / (1 + exp(-a))", lambda g, y, a: _act_grad("sigmoid", g, y),
      lib=activation("sigmoid"), saves=OUT)
unary("relu", lambda x: np.maximum(x, 0), "a > 0 ? a : 0", lambda g, y, a: _act_grad("relu", g, y), ints=True,
      lib=activation("relu"), saves=OUT)
unary("softrelu", lambda x: np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))),
      "a > 20 ? a : log1p(exp(a))", lambda g, y, a: g * sigmoid(a))
unary("softsign", lambda x: x / (1 + np.abs(x)), "a / (1 + (a < 0 ? -a : a))",
      lambda g, y, a: g / square(abs(a) + 1.0))
unary("logical_not", lambda x: (x == 0), "a == 0", _zero, ints=True)

unary("arcsinh", np.arcsinh, "asinh(a)", lambda g, y, a: g * rsqrt(a * a + 1.0))
unary("arccosh", np.arccosh, "acosh(a)", lambda g, y, a: g * rsqrt(a * a - 1.0))
unary("arctanh", np.arctanh, "atanh(a)", lambda g, y, a: g / (1.0 - a * a))
unary("degrees", np.degrees, "a * (180.0 / 3.14159265358979323846)", lambda g, y, a: g * (180.0 / math.pi), saves=())
unary("radians", np.radians, "a * (3.14159265358979323846 / 180.0)", lambda g, y, a: g * (math.pi / 180.0), saves=())
unary("rcbrt", lambda x: 1.0 / np.cbrt(x), "1 / cbrt(a)", lambda g, y, a: -(g * y) / (a * 3.0))
unary("gamma", lambda x: np.asarray(_gamma(x), dtype=np.result_type(x)), "tgamma(a)",
      lambda g, y, a: g * y * _digamma(a))
unary("gammaln", lambda x: np.asarray(_lgamma(x), dtype=np.result_type(x)), "lgamma(a)",
      lambda g, y, a: g * _digamma(a))
# MXNet's hard_sigmoid: clip(alpha * x + beta, 0, 1), alpha and beta parameters of its kernel
register(Op("hard_sigmoid", "map", lambda x, alpha=0.2, beta=0.5: np.clip(alpha * x + beta, 0, 1),
            expr="(alpha * a + beta) < 0 ? 0 : ((alpha * a + beta) > 1 ? 1 : alpha * a + beta)",
            grad=lambda g, y, a, alpha=0.2, beta=0.5: g * (((a * alpha + beta) > 0) * ((a * alpha + beta) < 1)) * alpha,
            params=("alpha", "beta"), methods=()))


def _digamma(x):
    """The digamma function composed of table ops (the gradient of gamma and gammaln; NVRTC has no digamma):
    psi(x) = psi(x + 6) - sum 1/(x + k), k < 6, with the asymptotic series at x + 6 >= 6 (error below 1e-9),
    and the reflection psi(x) = psi(1 - x) - pi / tan(pi x) for x < 0.5."""
    neg = x < 0.5
    z = where(neg, 1.0 - x, x)
    shift = z * 0.0
    for k in range(6):
        shift = shift + 1.0 / (z + float(k))
    w = z + 6.0
    inv2 = 1.0 / (w * w)
    series = log(w) - 0.5 / w - inv2 * (1.0 / 12 - inv2 * (1.0 / 120 - inv2 * (1.0 / 252 - inv2 * (1.0 / 240))))
    psi = series - shift
    return where(neg, psi - math.pi / tan(x * math.pi), psi)


_gamma = np.frompyfunc(lambda v: math.gamma(v) if v == v and not (v <= 0 and v == int(v)) else math.nan, 1, 1)
_lgamma = np.frompyfunc(lambda v: math.lgamma(v) if v == v and not (v <= 0 and v == int(v)) else math.inf, 1, 1)


# The activations' backward from their output, one kernel each (what cudnnActivationBackward does), so an eager
# training step pays one launch per activation gradient, not two.
def _act_grad(kind, g, y):
    from ._registry import call
    return call("_" + kind + "_backward", g, y)


binary("_relu_backward", lambda g, y: np.where(y > 0, g, 0), "b > 0 ? a : 0",
       lambda gg, out, g, y: (_b(g, lambda: _act_grad("relu", gg, y)), None), nd=(), lib=relu_backward)
binary("_sigmoid_backward", lambda g, y: g * y * (1 - y), "a * b * (1 - b)",
       lambda gg, out, g, y: (_b(g, lambda: gg * y * (1.0 - y)), _b(y, lambda: gg * g * (1.0 - y * 2.0))), nd=())
binary("_tanh_backward", lambda g, y: g * (1 - y * y), "a * (1 - b * b)",
       lambda gg, out, g, y: (_b(g, lambda: gg * (1.0 - y * y)), _b(y, lambda: gg * g * y * -2.0)), nd=())

# -- binary, broadcasting (MXNet's broadcast_* and elemwise_* names, and the NDArray operators) ------------------

binary("add", np.add, "a + b", lambda g, y, a, b: (g, _b(b, lambda: g)),
       nd=("broadcast_add", "broadcast_plus", "elemwise_add", "_plus"), lib=optensor("add"), saves=())
binary("subtract", np.subtract, "a - b", lambda g, y, a, b: (_b(a, lambda: g), _b(b, lambda: -g)),
       nd=("broadcast_sub", "broadcast_minus", "elemwise_sub", "_minus"), saves=())
binary("multiply", np.multiply, "a * b", lambda g, y, a, b: (_b(a, lambda: g * b), _b(b, lambda: g * a)),
       nd=("broadcast_mul", "elemwise_mul", "_mul"), lib=optensor("mul"), saves=(0, 1))
binary("divide", lambda a, b: np.divide(a, b) if np.result_type(a).kind == "f" else np.trunc(np.divide(a, b)),
       "a / b", lambda g, y, a, b: (_b(a, lambda: g / b), _b(b, lambda: -(g * y) / b)),
       nd=("broadcast_div", "elemwise_div", "true_divide", "_div"))
binary("modulo", lambda a, b: np.where(np.asarray(b) == 0, 0, np.mod(a, np.where(np.asarray(b) == 0, 1, b))),
       "(b == 0 ? 0 : a - b * floor((double)a / (double)b))",
       lambda g, y, a, b: (_b(a, lambda: g), _b(b, lambda: -(g * floor(a / b)))), nd=("broadcast_mod", "mod", "_mod"))
binary("power", np.power, "pow((double)a, (double)b)",
       lambda g, y, a, b: (_b(a, lambda: g * b * power(a, b - 1.0)), _b(b, lambda: g * y * _log_of(a))),
       nd=("broadcast_power", "pow", "_power"))
binary("maximum", np.maximum, "a > b ? a : (b > a ? b : (a != a ? a : b))",
       lambda g, y, a, b: (_b(a, lambda: g * (a >= b)), _b(b, lambda: g * (a < b))), nd=("broadcast_maximum", "_maximum"),
       lib=optensor("max"))
binary("minimum", np.minimum, "a < b ? a : (b < a ? b : (a != a ? a : b))",
       lambda g, y, a, b: (_b(a, lambda: g * (a <= b)), _b(b, lambda: g * (a > b))), nd=("broadcast_minimum", "_minimum"),
       lib=optensor("min"))
binary("hypot", np.hypot, "sqrt((double)a * a + (double)b * b)",
       lambda g, y, a, b: (_b(a, lambda: g * a / y), _b(b, lambda: g * b / y)), nd=("broadcast_hypot",))
binary("arctan2", np.arctan2, "atan2((double)a, (double)b)",
       lambda g, y, a, b: (_b(a, lambda: g * b / (a * a + b * b)), _b(b, lambda: -(g * a) / (a * a + b * b))))
for _name, _fn, _c, _aliases in (
        ("equal", np.equal, "a == b", ("broadcast_equal", "_equal")),
        ("not_equal", np.not_equal, "a != b", ("broadcast_not_equal", "_not_equal")),
        ("greater", np.greater, "a > b", ("broadcast_greater", "_greater")),
        ("greater_equal", np.greater_equal, "a >= b", ("broadcast_greater_equal", "_greater_equal")),
        ("lesser", np.less, "a < b", ("broadcast_lesser", "less", "_lesser")),
        ("lesser_equal", np.less_equal, "a <= b", ("broadcast_lesser_equal", "less_equal", "_lesser_equal")),
        ("logical_and", np.logical_and, "(a != 0) && (b != 0)", ("broadcast_logical_and",)),
        ("logical_or", np.logical_or, "(a != 0) || (b != 0)", ("broadcast_logical_or",)),
        ("logical_xor", np.logical_xor, "(a != 0) != (b != 0)", ("broadcast_logical_xor",))):
    binary(_name, _fn, _c, _zero, nd=_aliases)

register(Op("where", "map", lambda c, x, y: np.where(c != 0, x, y), expr="a != 0 ? b : c",
            grad=lambda g, out, c, x, y: (None, _b(x, lambda: g * (c != 0)), _b(y, lambda: g * (c == 0))),
            arity=3, same=(1, 2), methods=(), dtype=typed(own=(0,))))
register(Op("clip", "map", lambda x, a_min, a_max: np.clip(x, a_min, a_max),
            expr="a < a_min ? a_min : (a > a_max ? a_max : a)", ints=True, methods=("clip",), params=("a_min", "a_max"),
            grad=lambda g, y, a, a_min, a_max: g * ((a >= a_min) * (a <= a_max))))
# LeakyReLU's 'leaky' mode (nd.LeakyReLU, gluon.nn.LeakyReLU) in one kernel; the other modes compose ops.
register(Op("_leaky_relu", "map", lambda x, slope=0.25: np.where(x > 0, x, x * slope), expr="a > 0 ? a : slope * a",
            grad=lambda g, y, a, slope=0.25: g * ((a > 0) * (1.0 - slope) + slope), params=("slope",), nd=()))
# (sigma = scalar = 0, as in MXNet: every |x| is below 1/sigma^2 = inf, so the loss is 0; numpy's float64 division
# gives that inf where Python's would raise ZeroDivisionError.)
register(Op("smooth_l1", "map", lambda x, scalar=1.0: np.where(np.abs(x) < np.float64(1) / scalar ** 2,
                                                                  0.5 * (scalar * x) ** 2,
                                                                  np.abs(x) - np.float64(0.5) / scalar ** 2),
            expr="(a < 0 ? -a : a) < 1 / (scalar * scalar) ? 0.5 * scalar * scalar * a * a "
                 ": (a < 0 ? -a : a) - 0.5 / (scalar * scalar)",
            grad=lambda g, y, a, scalar=1.0: g * clip(a * (scalar * scalar), -1.0, 1.0), params=("scalar",)))

def _log_of(a):
    """log(a) for an array operand or a Python scalar (the base of ``2.0 ** x``): NaN/-inf as the array op gives."""
    if isinstance(a, (NDArray, autograd.Released)):
        return log(a)
    with np.errstate(all="ignore"):
        return float(np.log(np.float64(a)))


# -- reductions: axis (int/tuple/None), keepdims, exclude ----------------------------------------------------------


def _spread(g, x, axis, keepdims, exclude):
    """g (the reduced shape) broadcast back over x's shape: the gradient of a sum."""
    axes = norm_axes("sum", x.ndim, axis, exclude)
    return broadcast_to(g.reshape(keepdims_shape(x.shape, axes)), x.shape), axes


def _sum_grad(g, y, x, axis=None, keepdims=False, exclude=False):
    return _spread(g, x, axis, keepdims, exclude)[0]


def _mean_grad(g, y, x, axis=None, keepdims=False, exclude=False):
    s, axes = _spread(g, x, axis, keepdims, exclude)
    return s * (1.0 / max(reduced_size(x.shape, axes), 1))


def _extreme_grad(g, y, x, axis=None, keepdims=False, exclude=False):
    axes = norm_axes("max", x.ndim, axis, exclude)
    yb = broadcast_to(y.reshape(keepdims_shape(x.shape, axes)), x.shape)
    return _spread(g, x, axis, keepdims, exclude)[0] * (x == yb)


def _prod_grad(g, y, x, axis=None, keepdims=False, exclude=False):
    axes = norm_axes("prod", x.ndim, axis, exclude)
    yb = broadcast_to(y.reshape(keepdims_shape(x.shape, axes)), x.shape)
    return _spread(g, x, axis, keepdims, exclude)[0] * yb / x


def reduction(name, numpy, kind, grad, map_expr="a", post_expr="acc", out_dtype=None, ints=True, nd=None,
              params=("axis", "keepdims", "exclude")):
    return register(Op(name, "reduce", numpy, reduce=kind, grad=grad, map_expr=map_expr, post_expr=post_expr,
                       out_dtype=out_dtype, ints=ints, methods=(name,) if nd != () else (), nd=nd, params=params))


reduction("sum", lambda x, axes: np.sum(x, axis=axes), "sum", _sum_grad, nd=("sum", "sum_axis"))
reduction("mean", lambda x, axes: np.mean(x, axis=axes) if x.size else np.zeros(()), "mean", _mean_grad)
reduction("prod", lambda x, axes: np.prod(x, axis=axes), "prod", _prod_grad)
reduction("max", lambda x, axes: np.max(x, axis=axes), "max", _extreme_grad, nd=("max", "max_axis"))
reduction("min", lambda x, axes: np.min(x, axis=axes), "min", _extreme_grad, nd=("min", "min_axis"))
reduction("nanprod", lambda x, axes: np.nanprod(x, axis=axes), "prod",
          lambda g, y, x, **k: _prod_grad(g, y, where(x == x, x, 1.0), **k) * (x == x), map_expr="(a != a ? 1 : a)")
reduction("nansum", lambda x, axes: np.nansum(x, axis=axes), "sum",
          lambda g, y, x, **k: _sum_grad(g, y, x, **k) * (x == x), map_expr="(a != a ? 0 : a)")
reduction("_norm2", lambda x, axes: np.sqrt(np.sum(np.square(x, dtype=np.float64), axis=axes)), "sum",
          lambda g, y, x, axis=None, keepdims=False, exclude=False:
          _spread(g / y, x, axis, keepdims, exclude)[0] * x, map_expr="(double)a * a", post_expr="sqrt(acc)",
          nd=())
# MXNet's arg-reductions give the index in the input's own type (float16 data, float16 indices) and take no
# ``exclude``.
reduction("argmax", lambda x, axes: _arg(np.argmax, x, axes), "argmax", None, params=("axis", "keepdims"))
reduction("argmin", lambda x, axes: _arg(np.argmin, x, axes), "argmin", None, params=("axis", "keepdims"))


def _arg(fn, x, axes):
    """numpy arg-reduction over several axes: move them last, flatten them, reduce the flat axis."""
    if len(axes) == 1:
        return fn(x, axis=axes[0])
    keep = [i for i in range(x.ndim) if i not in axes]
    moved = np.transpose(x, keep + list(axes)).reshape([x.shape[i] for i in keep] + [-1])
    return fn(moved, axis=-1)


# -- composites: ops MXNet declares that compose the entries above ------------------------------------------------

def norm(data, ord=2, axis=None, out_dtype=None, keepdims=False):
    """``nd.norm``: ord 2 is sqrt(sum(x*x)), ord 1 sum(|x|) (compositions: their gradients come for free), in
    ``out_dtype`` where one is given."""
    if ord == 2:
        out = call("_norm2", data, axis=axis, keepdims=keepdims)
    elif ord == 1:
        out = call("sum", call("abs", data), axis=axis, keepdims=keepdims)
    else:
        raise DnnbindValueError(f"norm: ord must be 1 or 2, got {ord!r}")
    if out_dtype is not None and np.dtype(out_dtype) != out.dtype:
        out = call("cast", out, dtype=np.dtype(out_dtype))
    return out


def _scalar_of(data, scalar):
    """MXNet's scalar operators compute in the array's type: the scalar is cast to it (an int array plus "2.5"
    adds 2, truncated as C casts)."""
    if getattr(data, "dtype", np.dtype(np.float32)).kind in "iub":
        return int(scalar)
    return float(scalar)


def _scalar_op(name: str, op: str, reverse: bool = False):
    """The internal operator a symbol's ``x + 2`` / ``2 - x`` writes (``_plus_scalar``, ``_rminus_scalar``)."""
    def fn(data, scalar=1.0, is_int=True):
        s = _scalar_of(data, scalar)
        return call(op, s, data) if reverse else call(op, data, s)
    fn.__name__ = name
    fn.__doc__ = f"MXNet's internal {name}: {'scalar ' + op + ' data' if reverse else 'data ' + op + ' scalar'}."
    composite(name, fn, nd=())


for _name, _op, _rev in (("_plus_scalar", "add", False), ("_minus_scalar", "subtract", False),
                         ("_rminus_scalar", "subtract", True), ("_mul_scalar", "multiply", False),
                         ("_div_scalar", "divide", False), ("_rdiv_scalar", "divide", True),
                         ("_mod_scalar", "modulo", False), ("_rmod_scalar", "modulo", True),
                         ("_power_scalar", "power", False), ("_rpower_scalar", "power", True),
                         ("_maximum_scalar", "maximum", False), ("_minimum_scalar", "minimum", False),
                         ("_equal_scalar", "equal", False), ("_not_equal_scalar", "not_equal", False),
                         ("_greater_scalar", "greater", False), ("_greater_equal_scalar", "greater_equal", False),
                         ("_lesser_scalar", "lesser", False), ("_lesser_equal_scalar", "lesser_equal", False)):
    _scalar_op(_name, _op, _rev)

composite("norm", norm, dtype=typed(out=lambda p, t: [np.dtype(p["out_dtype"]) if p.get("out_dtype") else t]))


# Names the rules above use; bound after the nd namespace is built (they are table ops themselves).
def bind_nd_functions(ns: dict) -> None:
    """Bind the nd functions the rules above call (``ns``: the built nd namespace)."""
    for n in ("sign", "cos", "sin", "cosh", "sinh", "rsqrt", "exp", "sigmoid", "square", "abs", "power", "log",
              "floor", "clip", "broadcast_to", "where", "tan"):
        globals()[n] = ns[n]


sign = cos = sin = cosh = sinh = rsqrt = exp = sigmoid = square = abs = power = log = floor = clip = None  # noqa
broadcast_to = where = tan = None
REGISTRY  # noqa: B018
