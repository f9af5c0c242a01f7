"""Write dnnbind/nd/_mxnet_params.py: MXNet 1.9.1's declared inputs and parameters of the operators dnnbind
implements or symbol files commonly use, as MXNet's C API describes them (``MXSymbolGetAtomicSymbolInfo``: each argument's name and type-info
string). Run with the real MXNet (Python 3.8, ``pip install mxnet==1.9.1 "numpy<1.24"``):

    /tmp/mx/bin/python scripts/gen_mxnet_params.py > dnnbind/nd/_mxnet_params.py

With no --names the default list below is used: the operators of dnnbind's nd namespace that MXNet has, the layer
operators symbol files use, and the scalar/element-wise internals MXNet's symbol arithmetic writes into them.

Layer: script (tooling; imports mxnet, not dnnbind).
"""

from __future__ import annotations

import argparse
import ctypes
import sys

DEFAULT_OPS = """
Activation BatchNorm BlockGrad Cast Concat Convolution Deconvolution Dropout Embedding Flatten FullyConnected
InstanceNorm LayerNorm LeakyReLU LinearRegressionOutput LogisticRegressionOutput MAERegressionOutput MakeLoss Pad
Pooling Reshape SliceChannel SoftmaxActivation SoftmaxOutput SwapAxis UpSampling L2Normalization LRN
abs arccos arccosh arcsin arcsinh arctan arctanh argmax argmin argsort batch_dot broadcast_add broadcast_axis
broadcast_div broadcast_equal broadcast_greater broadcast_greater_equal broadcast_lesser broadcast_lesser_equal
broadcast_like broadcast_maximum broadcast_minimum broadcast_minus broadcast_mod broadcast_mul broadcast_not_equal
broadcast_plus broadcast_power broadcast_sub broadcast_to cbrt ceil clip cos cosh degrees dot elemwise_add
elemwise_div elemwise_mul elemwise_sub erf exp expand_dims expm1 fix flip floor gamma gammaln identity log log10
log1p log2 log_softmax max mean min nanprod nansum negative norm one_hot ones_like pick prod radians rcbrt
reciprocal relu repeat reshape_like reverse rint round rsqrt shape_array sigmoid sign sin sinh size_array slice
slice_axis slice_like softmax softmin softsign sort split sqrt square squeeze stack sum swapaxes take tan tanh
_rnn_param_concat
tile topk transpose trunc where zeros_like add_n hard_sigmoid
_copy _zeros _ones _full _arange _plus_scalar _minus_scalar _rminus_scalar _mul_scalar _div_scalar _rdiv_scalar
_power_scalar _rpower_scalar _maximum_scalar _minimum_scalar _mod_scalar _rmod_scalar _equal_scalar
_not_equal_scalar _greater_scalar _greater_equal_scalar _lesser_scalar _lesser_equal_scalar _Plus _Minus _Mul
_Div _Power _Maximum _Minimum _Mod _plus _minus _mul _div _power _maximum _minimum _mod _equal _not_equal _greater
_greater_equal _lesser _lesser_equal _random_uniform _random_normal _random_randint _shuffle
GroupNorm RNN CTCLoss SequenceMask SequenceLast SequenceReverse softmax_cross_entropy
_contrib_MultiBoxPrior _contrib_MultiBoxTarget _contrib_MultiBoxDetection _contrib_box_nms _contrib_box_iou
_contrib_box_encode _contrib_box_decode _contrib_bipartite_matching ROIPooling _contrib_ROIAlign
_contrib_PSROIPooling _contrib_BilinearResize2D _contrib_AdaptiveAvgPooling2D _contrib_DeformableConvolution
_contrib_ModulatedDeformableConvolution _contrib_boolean_mask _contrib_index_copy gather_nd scatter_nd
_contrib_SyncBatchNorm _linalg_gemm _linalg_gemm2 _linalg_potrf _linalg_potri _linalg_trsm _linalg_trmm
_linalg_syrk _linalg_sumlogdiag _linalg_inverse _linalg_det _linalg_slogdet _linalg_extractdiag _linalg_makediag
_linalg_extracttrian _linalg_maketrian
""".split()


def describe(lib, name: str):
    from mxnet.base import c_str, check_call, py_str
    handle = ctypes.c_void_p()
    check_call(lib.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
    real, desc, n = ctypes.c_char_p(), ctypes.c_char_p(), ctypes.c_uint()
    names, types, descs = (ctypes.POINTER(ctypes.c_char_p)() for _ in range(3))
    key_var, ret = ctypes.c_char_p(), ctypes.c_char_p()
    check_call(lib.MXSymbolGetAtomicSymbolInfo(handle, ctypes.byref(real), ctypes.byref(desc), ctypes.byref(n),
                                               ctypes.byref(names), ctypes.byref(types), ctypes.byref(descs),
                                               ctypes.byref(key_var), ctypes.byref(ret)))
    args = tuple((py_str(names[i]), py_str(types[i])) for i in range(n.value))
    return py_str(real.value), args, py_str(key_var.value) if key_var.value else ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--names", default=None, help="space-separated operator names (default: the built-in list)")
    args = p.parse_args(argv)
    import mxnet
    from mxnet.base import _LIB
    names = args.names.split() if args.names else DEFAULT_OPS
    declared, aliases, var_args, missing = {}, {}, {}, []
    for name in names:
        try:
            real, entries, key_var = describe(_LIB, name)
        except Exception:  # noqa: BLE001  (not an MXNet 1.9.1 operator)
            missing.append(name)
            continue
        if real != name:
            aliases[name] = real
        declared[real] = entries
        if key_var:
            var_args[real] = key_var
    # every other name MXNet answers to for these operators (Flatten's "flatten", add_n's "ElementWiseSum", ...):
    # the names whose operator handle is one of theirs
    from mxnet.base import c_str, check_call, py_str

    def handle(op_name):
        h = ctypes.c_void_p()
        check_call(_LIB.NNGetOpHandle(c_str(op_name), ctypes.byref(h)))
        return h.value

    owners = {handle(real): real for real in declared}
    size, plist = ctypes.c_uint(), ctypes.POINTER(ctypes.c_char_p)()
    check_call(_LIB.MXListAllOpNames(ctypes.byref(size), ctypes.byref(plist)))
    for i in range(size.value):
        other = py_str(plist[i])
        if other in declared:
            continue
        try:
            real = owners.get(handle(other))
        except Exception:  # noqa: BLE001  (a listed name that is no operator)
            continue
        if real is not None:
            aliases[other] = real
    out = sys.stdout
    out.write('"""MXNet %s\'s declared inputs and parameters of the operators dnnbind implements or symbol files use:\n'
              'for each operator, (name, MXNet\'s type-info string) in MXNet\'s order, as its C API lists them\n'
              '(MXSymbolGetAtomicSymbolInfo).\n'
              'Read by nd/_schema.py. Generated by scripts/gen_mxnet_params.py from MXNet %s; do not edit by hand.\n'
              '"""\n\n' % (mxnet.__version__, mxnet.__version__))
    out.write("# name -> ((argument, type info), ...)\nDECLARED = {\n")
    for real in sorted(declared):
        out.write(f"    {real!r}: (\n")
        for arg, info in declared[real]:
            out.write(f"        ({arg!r}, {info!r}),\n")
        out.write("    ),\n")
    out.write("}\n\n# an alias MXNet accepts -> the operator's own name\nALIASES = {\n")
    for a in sorted(aliases):
        out.write(f"    {a!r}: {aliases[a]!r},\n")
    out.write("}\n\n# operators whose variadic input count is this parameter (key_var_num_args)\nVAR_ARGS = {\n")
    for r in sorted(var_args):
        out.write(f"    {r!r}: {var_args[r]!r},\n")
    out.write("}\n")
    if missing:
        print(f"not MXNet {mxnet.__version__} operators, left out: {' '.join(missing)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
