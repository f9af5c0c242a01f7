"""MXNet 1.9.1's ``gluon.contrib.cnn`` layers: a plain convolution of the input predicts each output pixel's
offsets (and, for v2, masks), then ``nd.contrib.DeformableConvolution`` / ``ModulatedDeformableConvolution`` samples
the input there. Layer: gluon; imports nd, gluon.block, gluon.nn.

MXNet's parameter names, shapes and initializers: ``offset_weight`` (2 * kh * kw * num_deformable_group outputs,
3 * ... for v2; in_channels / groups inputs) and ``offset_bias`` start at zero, so a new layer samples the plain grid;
``deformable_conv_weight`` takes the global initializer, ``deformable_conv_bias`` zeros. As in MXNet the deformable
weight's input axis is unknown (0) until the first forward even when ``in_channels`` is given, and the offset layer
shares ``groups``. v2's mask is 2 * sigmoid of the last kh * kw * num_deformable_group offset channels. Only NCHW
runs: MXNet's layers accept layout='NHWC' and its operators then refuse it, and so do dnnbind's.
"""

from __future__ import annotations

from numbers import Number

from ...._lib.errors import DnnbindValueError
from .... import nd
from ...block import Block
from ...nn.basic_layers import Activation

__all__ = ["DeformableConvolution", "ModulatedDeformableConvolution"]


def _pair(value) -> tuple:
    return (value,) * 2 if isinstance(value, Number) else tuple(value)


class _Deformable(Block):
    """What both versions share: the arguments, the offset layer's parameters, the deformable weight and bias."""
    _array_input = True
    _modulated = False

    def __init__(self, channels, kernel_size=(1, 1), strides=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
                 num_deformable_group=1, layout="NCHW", use_bias=True, in_channels=0, activation=None,
                 weight_initializer=None, bias_initializer="zeros", offset_weight_initializer="zeros",
                 offset_bias_initializer="zeros", offset_use_bias=True, op_name=None, adj=None, prefix=None,
                 params=None):
        super().__init__(prefix=prefix, params=params)
        if layout not in ("NCHW", "NHWC"):  # MXNet's assert
            raise DnnbindValueError(f"{type(self).__name__}: Only supports 'NCHW' and 'NHWC' layout for now, got "
                                    f"{layout!r}")
        kernel = _pair(kernel_size)
        strides, padding, dilation = (tuple(v) if not isinstance(v, Number) else (v,) * len(kernel)
                                      for v in (strides, padding, dilation))
        self._channels, self._in_channels, self._groups = channels, in_channels, groups
        self._op_name = op_name or type(self).__name__
        kk = kernel[0] * kernel[1]
        offset_channels = (3 if self._modulated else 2) * kk * num_deformable_group
        self._split = 2 * kk * num_deformable_group  # v2: offsets first, then the masks
        self._kwargs_offset = {"kernel": kernel, "stride": strides, "dilate": dilation, "pad": padding,
                               "num_filter": offset_channels, "num_group": groups, "no_bias": not offset_use_bias,
                               "layout": layout}
        self._kwargs_deformable_conv = {"kernel": kernel, "stride": strides, "dilate": dilation, "pad": padding,
                                        "num_filter": channels, "num_group": groups,
                                        "num_deformable_group": num_deformable_group, "no_bias": not use_bias,
                                        "layout": layout}
        if adj:  # as MXNet passes it on (and its operators then refuse it)
            self._kwargs_offset["adj"] = adj
            self._kwargs_deformable_conv["adj"] = adj
        with self.name_scope():
            # MXNet's order of creation, so collect_params() lists them as it does
            if self._modulated:
                self._deformable_params(channels, kernel, weight_initializer, bias_initializer, use_bias)
                self._offset_params(offset_channels, kernel, layout, in_channels, groups, offset_weight_initializer,
                                    offset_bias_initializer, offset_use_bias)
            else:
                self._offset_params(offset_channels, kernel, layout, in_channels, groups, offset_weight_initializer,
                                    offset_bias_initializer, offset_use_bias)
                self._deformable_params(channels, kernel, weight_initializer, bias_initializer, use_bias)
            self.act = Activation(activation, prefix=activation + "_") if activation else None

    def _offset_params(self, offset_channels, kernel, layout, in_channels, groups, weight_init, bias_init, use_bias):
        # MXNet infers the shape from a Convolution symbol on data with in_channels (0: unknown) channels
        shape = (offset_channels,) + ((kernel + (in_channels // groups,)) if layout == "NHWC"
                                      else ((in_channels // groups,) + kernel))
        self.offset_weight = self.params.get("offset_weight", shape=shape, init=weight_init,
                                             allow_deferred_init=True)
        self.offset_bias = self.params.get("offset_bias", shape=(offset_channels,), init=bias_init,
                                           allow_deferred_init=True) if use_bias else None

    def _deformable_params(self, channels, kernel, weight_init, bias_init, use_bias):
        # (channels, 0, kh, kw): MXNet leaves the input axis to the first forward, in_channels or not
        self.deformable_conv_weight = self.params.get("deformable_conv_weight", shape=(channels, 0) + kernel,
                                                      init=weight_init, allow_deferred_init=True)
        self.deformable_conv_bias = self.params.get("deformable_conv_bias", shape=(channels,), init=bias_init,
                                                    allow_deferred_init=True) if use_bias else None

    def _infer(self, x) -> None:
        """First forward: the input axes of both weights from x's channels, then the deferred initializations."""
        if x.ndim != 4:
            raise DnnbindValueError(f"{self.name}: {type(self).__name__} expects 4-D input (N, C, H, W), got shape "
                                    f"{x.shape}")
        c = x.shape[-1 if self._kwargs_offset["layout"] == "NHWC" else 1]
        if c % self._groups:
            raise DnnbindValueError(f"{self.name}: input channels {c} not divisible by groups {self._groups}")
        kernel = self._kwargs_offset["kernel"]
        w = self.offset_weight
        if not w._shape_known():
            nhwc = self._kwargs_offset["layout"] == "NHWC"
            w.shape = (w.shape[0],) + ((kernel + (c // self._groups,)) if nhwc else ((c // self._groups,) + kernel))
        if not self.deformable_conv_weight._shape_known():
            self.deformable_conv_weight.shape = (self._channels, c // self._groups) + kernel
        for p in (self.offset_weight, self.offset_bias, self.deformable_conv_weight, self.deformable_conv_bias):
            if p is not None:
                p._finish_deferred_init()

    def forward(self, x):
        if any(p is not None and p._data is None for p in (self.offset_weight, self.offset_bias,
                                                              self.deformable_conv_weight, self.deformable_conv_bias)):
            self._infer(x)
        params = {name: p.data() for name, p in self._reg_params.items()}
        return self.hybrid_forward(nd, x, **params)

    def _offset(self, F, x, offset_weight, offset_bias):
        if offset_bias is None:
            return F.Convolution(x, offset_weight, cudnn_off=True, **self._kwargs_offset)
        return F.Convolution(x, offset_weight, offset_bias, cudnn_off=True, **self._kwargs_offset)


class DeformableConvolution(_Deformable):
    """2-D deformable convolution v1 (Dai et al., 2017): MXNet's arguments, parameters and initializers."""

    def hybrid_forward(self, F, x, offset_weight, deformable_conv_weight, offset_bias=None,
                       deformable_conv_bias=None):
        offset = self._offset(F, x, offset_weight, offset_bias)
        bias = {} if deformable_conv_bias is None else {"bias": deformable_conv_bias}
        act = F.contrib.DeformableConvolution(data=x, offset=offset, weight=deformable_conv_weight, **bias, name="fwd",
                                              **self._kwargs_deformable_conv)
        return self.act(act) if self.act is not None else act

    def _alias(self) -> str:
        return "deformable_conv"

    def __repr__(self) -> str:  # MXNet's own
        k = self._kwargs_deformable_conv
        n = len(k["kernel"])
        s = f"{type(self).__name__}({{mapping}}, kernel_size={k['kernel']}, stride={k['stride']}"
        if k["pad"] != (0,) * n:
            s += f", padding={k['pad']}"
        if k["dilate"] != (1,) * n:
            s += f", dilation={k['dilate']}"
        if k["num_group"] != 1:
            s += f", groups={k['num_group']}"
        if self.deformable_conv_bias is None:
            s += ", bias=False"
        if self.act is not None:
            s += f", {self.act!r}"
        shape = self.deformable_conv_weight.shape
        return (s + ")").format(mapping=f"{shape[1] if shape[1] else None} -> {shape[0]}")


class ModulatedDeformableConvolution(_Deformable):
    """2-D deformable convolution v2 (Zhu et al., 2018): offsets and masks (2 * sigmoid) from one convolution."""
    _modulated = True

    def hybrid_forward(self, F, x, offset_weight, deformable_conv_weight, offset_bias=None,
                       deformable_conv_bias=None):
        offset = self._offset(F, x, offset_weight, offset_bias)
        offset_t = F.slice_axis(offset, axis=1, begin=0, end=self._split)
        mask = F.sigmoid(F.slice_axis(offset, axis=1, begin=self._split, end=None)) * 2
        bias = {} if deformable_conv_bias is None else {"bias": deformable_conv_bias}
        act = F.contrib.ModulatedDeformableConvolution(data=x, offset=offset_t, mask=mask,
                                                       weight=deformable_conv_weight, **bias, name="fwd",
                                                       **self._kwargs_deformable_conv)
        return self.act(act) if self.act is not None else act

    def _alias(self) -> str:
        return "modulated_deformable_conv"
