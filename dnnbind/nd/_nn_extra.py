"""Layer nd: MXNet's ``LeakyReLU`` family, ``Embedding`` and the pooling convention cuDNN has no mode for
(``pooling_convention='full'``). Imports numpy, autograd, runtime and nd's own modules.

Everything here is a composition of registered ops (where, expm1, erf, take, concat, multiply), so each gets
its gradient and its GPU lowering from the table; nothing has hand-written backward code.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import math

from .. import autograd
from ..runtime.array import NDArray
from ._params import array_arg, bool_arg, choice_arg, dtype_name, float_arg, int_arg, into, reject, required
from ._registry import as_array, call

__all__ = ["Embedding", "LeakyReLU"]

# MXNet's constants (src/operator/mshadow_op.h).
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_LAMBDA = 1.0507009873554804934193349852946
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


def _neg_expm1(x: NDArray, scale: float) -> NDArray:
    """scale * expm1(min(x, 0)): the negative branch of ELU/SELU. The min keeps exp from overflowing where the
    positive branch is taken (an inf there would turn the masked gradient 0 * inf into NaN)."""
    return call("expm1", call("minimum", x, 0.0)) * scale


_LEAKY_TYPES = ("elu", "gelu", "leaky", "prelu", "rrelu", "selu")


def LeakyReLU(data=None, gamma=None, act_type: str = "leaky", slope: float = 0.25, lower_bound: float = 0.125,
              upper_bound: float = 0.334, out=None, name=None, **kwargs) -> NDArray:
    """MXNet's ``nd.LeakyReLU``: act_type 'leaky' (x or slope*x), 'prelu' (learned ``gamma`` per channel, axis 1),
    'elu' (slope*(exp(x)-1) below 0), 'selu', 'gelu' (erf form), 'rrelu' (random slope in [lower, upper] while
    training, their mean otherwise). ``name`` is ignored."""
    if kwargs:
        reject("LeakyReLU", kwargs)
    choice_arg("LeakyReLU", "act_type", act_type, _LEAKY_TYPES)
    slope, lower_bound, upper_bound = (float_arg("LeakyReLU", n, v) for n, v in (
        ("slope", slope), ("lower_bound", lower_bound), ("upper_bound", upper_bound)))
    data = array_arg("LeakyReLU", "data", data)
    if data.dtype.kind != "f":
        raise DnnbindTypeError(f"LeakyReLU: data must be a floating-point array, got {data.dtype} (shape "
                               f"{data.shape})")
    if gamma is not None:
        gamma = array_arg("LeakyReLU", "gamma", gamma, data)
    return into(out, _leaky_relu(data, gamma, act_type, slope, lower_bound, upper_bound))


def _leaky_relu(data, gamma, act_type, slope, lower_bound, upper_bound) -> NDArray:
    pos = data > 0
    if act_type == "leaky":
        return call("_leaky_relu", data, slope=float(slope))
    if act_type == "prelu":
        if gamma is None:
            raise DnnbindValueError("LeakyReLU(act_type='prelu'): needs gamma, the learned slopes (shape (1,) or (C,))")
        gamma = as_array("LeakyReLU", "gamma", gamma, data)
        if gamma.size != 1:
            if data.ndim < 2 or gamma.size != data.shape[1]:
                raise DnnbindValueError(f"LeakyReLU(act_type='prelu'): gamma has shape {gamma.shape}; expected (1,) or "
                                 f"({data.shape[1] if data.ndim > 1 else 1},) for data of shape {data.shape}")
            gamma = gamma.reshape((1, gamma.size) + (1,) * (data.ndim - 2))
        return call("where", pos, data, data * gamma)
    if act_type == "elu":
        return call("where", pos, data, _neg_expm1(data, float(slope)))
    if act_type == "selu":
        return call("where", pos, data, _neg_expm1(data, SELU_ALPHA)) * SELU_LAMBDA
    if act_type == "gelu":
        return data * (call("erf", data * _INV_SQRT2) + 1.0) * 0.5
    if act_type == "rrelu":
        if not autograd.is_training():
            return call("_leaky_relu", data, slope=(lower_bound + upper_bound) / 2.0)
        from .random import uniform
        slopes = uniform(lower_bound, upper_bound, shape=data.shape, dtype=data.dtype, ctx=data.device)
        return call("where", pos, data, data * slopes)
    raise DnnbindValueError(f"LeakyReLU: unknown act_type {act_type!r}; expected one of leaky, prelu, elu, selu, gelu, "
                     "rrelu")


_EMBED_DTYPES = ("bfloat16", "float16", "float32", "float64", "int32", "int64", "int8", "uint8")


def Embedding(data=None, weight=None, input_dim: int | None = None, output_dim: int | None = None,
              dtype="float32", sparse_grad: bool = False, out=None, name=None, **kwargs) -> NDArray:
    """weight[data]: (d0, ..., dk) indices -> (d0, ..., dk, output_dim); indices are clipped to the table like
    MXNet. ``input_dim`` and ``output_dim`` are required (MXNet's) and must match the weight (input_dim,
    output_dim). The gradient reaches ``weight`` through ``take``'s backward (a scatter-add). ``dtype`` (MXNet's
    type of the weight) is checked and the weight's own dtype used; ``sparse_grad`` is accepted and gives a dense
    gradient; ``name`` is ignored."""
    if kwargs:
        reject("Embedding", kwargs)
    op = "Embedding"
    if input_dim is None:
        raise required(op, "input_dim", "int")
    if output_dim is None:
        raise required(op, "output_dim", "int")
    input_dim, output_dim = int_arg(op, "input_dim", input_dim, 1), int_arg(op, "output_dim", output_dim, 1)
    dtype_name(op, dtype, _EMBED_DTYPES, none_ok=False)
    bool_arg(op, "sparse_grad", sparse_grad)
    data = array_arg(op, "data", data)
    weight = array_arg(op, "weight", weight, data)
    if weight.shape != (input_dim, output_dim):
        raise DnnbindValueError(f"Embedding: weight has shape {weight.shape} but input_dim={input_dim}, "
                                f"output_dim={output_dim} need ({input_dim}, {output_dim}) (data {data.shape})")
    return into(out, call("take", weight, data, axis=0, mode="clip"))
