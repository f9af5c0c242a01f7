"""Layer kernels: the CUDA source template of strided reductions (pure text generation, no CUDA calls).

Imports numpy and the shared pieces of _strided_src. One kernel covers every layout: each output gets ``rt``
threads (a power of two), ``ot`` outputs share a block, and blockIdx.y splits a long reduction over several
blocks whose partial results the last-arriving block combines (a "last block" reduction: no second launch).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._strided_src import (
    PREAMBLE,
    RBLOCK,
    args_struct,
    c_load,
    c_store,
    c_types,
    check_kernel_name,
    decompose_index,
    indent,
    scalar_fields,
)

_ACC = r"""template <typename T> struct dn_acc { typedef long long type; };  // integers and bools add up in 64 bits
template <> struct dn_acc<float> { typedef float type; };
template <> struct dn_acc<double> { typedef double type; };
template <> struct dn_acc<unsigned long long> { typedef unsigned long long type; };
__device__ __forceinline__ float dn_lowest(float) { return -__int_as_float(0x7f800000); }
__device__ __forceinline__ float dn_highest(float) { return __int_as_float(0x7f800000); }
__device__ __forceinline__ double dn_lowest(double) { return -__longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ double dn_highest(double) { return __longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ long long dn_lowest(long long) { return -0x7fffffffffffffffLL - 1; }
__device__ __forceinline__ long long dn_highest(long long) { return 0x7fffffffffffffffLL; }
__device__ __forceinline__ unsigned long long dn_lowest(unsigned long long) { return 0ULL; }
__device__ __forceinline__ unsigned long long dn_highest(unsigned long long) { return 0xffffffffffffffffULL; }
"""

_IDENTITY = {"sum": "(dn_acc_t)0", "prod": "(dn_acc_t)1", "max": "dn_lowest(dn_acc_t())",
             "min": "dn_highest(dn_acc_t())", "argmax": "dn_lowest(dn_acc_t())", "argmin": "dn_highest(dn_acc_t())"}
# NaN propagates like numpy: max/min with a NaN is NaN; argmax/argmin pick the first NaN; ties keep the
# smaller index, which makes the combination order-independent (the tree and the split may combine in any order)
_COMBINE = {
    "sum": "acc += v;",
    "prod": "acc *= v;",
    "max": "if (v > acc || dn_isnan(v)) acc = v;",
    "min": "if (v < acc || dn_isnan(v)) acc = v;",
    "argmax": "if (dn_isnan(acc) ? (dn_isnan(v) && vi < idx) : (dn_isnan(v) || v > acc || (v == acc && vi < idx))) {"
              " acc = v; idx = vi; }",
    "argmin": "if (dn_isnan(acc) ? (dn_isnan(v) && vi < idx) : (dn_isnan(v) || v < acc || (v == acc && vi < idx))) {"
              " acc = v; idx = vi; }",
}


def _tree(arg: bool) -> str:
    """Combine the dn_rt partial results of each output into its dn_lane 0 (dn_rt is a power of two and the
    same for the whole block, so every thread reaches every shuffle and barrier).

    Row layout (p.red_fast): an output's lanes are adjacent and aligned, so a warp butterfly combines them,
    then shared memory combines the warps when dn_rt > 32. Column layout: a shared-memory tree."""
    def si(index: str, value: str) -> str:
        return f"dn_si[{index}] = {value};\n" if arg else ""

    shfl_i = "__shfl_xor_sync(dn_mask, idx, dn_h)" if arg else "0"
    return (
        "if (p.red_fast) {\n"
        "    for (int dn_h = (dn_rt < 32 ? dn_rt : 32) >> 1; dn_h > 0; dn_h >>= 1) {\n"
        "        const dn_acc_t dn_a = __shfl_xor_sync(dn_mask, acc, dn_h);\n"
        f"        const long long dn_i = {shfl_i};\n"
        "        dn_combine(acc, idx, dn_a, dn_i);\n"
        "    }\n"
        "    if (dn_rt > 32) {  // one value per warp; lane 0 of the output combines them\n"
        "        const int dn_w = dn_rt >> 5, dn_at = dn_olane * dn_w + (dn_lane >> 5);\n"
        "        if ((dn_lane & 31) == 0) {\n"
        "            dn_sv[dn_at] = acc;\n"
        + indent(si("dn_at", "idx"), " " * 12) +
        "        }\n"
        "        __syncthreads();\n"
        "        if (dn_lane == 0) {\n"
        "            for (int dn_k = 1; dn_k < dn_w; ++dn_k) {\n"
        f"                dn_combine(acc, idx, dn_sv[dn_at + dn_k], {'dn_si[dn_at + dn_k]' if arg else '0'});\n"
        "            }\n"
        "        }\n"
        "        __syncthreads();  // dn_sv is reused by the next output\n"
        "    }\n"
        "} else if (dn_rt > 1) {\n"
        "    const int dn_me = dn_olane + dn_lane * dn_ot;\n"
        "    dn_sv[dn_me] = acc;\n"
        + indent(si("dn_me", "idx"), "    ") +
        "    __syncthreads();\n"
        "    for (int dn_h = dn_rt >> 1; dn_h > 0; dn_h >>= 1) {\n"
        "        if (dn_lane < dn_h) {\n"
        "            const int dn_other = dn_me + dn_h * dn_ot;\n"
        f"            dn_combine(acc, idx, dn_sv[dn_other], {'dn_si[dn_other]' if arg else '0'});\n"
        "            dn_sv[dn_me] = acc;\n"
        + indent(si("dn_me", "idx"), " " * 12) +
        "        }\n"
        "        __syncthreads();\n"
        "    }\n"
        "}\n")


def _accumulate(ity: str, rr: int, x_load: str, xv: str, sargs: str) -> str:
    """The serial part: this thread's elements dn_rb + dn_lane, + dn_rt, ... below dn_re, four loads in flight
    per iteration (memory latency, not arithmetic, bounds a reduction)."""
    def one(k: str) -> str:
        return (f"long long dn_off{k} = dn_base;\n"
                + decompose_index(f"dn_r{k}", ity, "p.rshape", rr, [(f"dn_off{k}", "p.rst")])  # its own { } scope
                + f"const {xv} a{k} = {x_load.replace('OFF', f'dn_off{k}')};\n")
    quad = "".join(f"const {ity} dn_r{k} = dn_r + {k} * dn_step;\n" + one(str(k)) for k in range(4))
    combine = "".join(f"dn_combine(acc, idx, (dn_acc_t)dn_map(a{k}{sargs}), (long long)dn_r{k});\n" for k in range(4))
    return (f"const {ity} dn_step = ({ity})dn_rt, dn_end = ({ity})dn_re;\n"
            f"{ity} dn_r = ({ity})(dn_rb + dn_lane);\n"
            "for (; dn_r + 3 * dn_step < dn_end; dn_r += 4 * dn_step) {\n"
            + indent(quad + combine, "    ") +
            "}\n"
            "for (; dn_r < dn_end; dn_r += dn_step) {\n"
            + indent(f"const {ity} dn_rx = dn_r;\n" + one("x") +
                      f"dn_combine(acc, idx, (dn_acc_t)dn_map(ax{sargs}), (long long)dn_r);\n", "    ") +
            "}\n")


def reduce_source(name: str, op: str, map_expr: str, post_expr: str, x_dtype: Any, out_dtype: Any, rk: int, rr: int,
            sig: tuple):
    check_kernel_name(name)
    x_dtype, out_dtype = np.dtype(x_dtype), np.dtype(out_dtype)
    xs, xv = c_types(x_dtype, "strided_reduce x")
    os_ = c_types(out_dtype, "strided_reduce out")[0]
    arg = op.startswith("arg")
    fields = [(f"const {xs}*", "x", "Q"), (f"{os_}*", "out", "Q"), ("char*", "sval", "Q"), ("long long*", "sidx", "Q"),
              ("unsigned int*", "counters", "Q")]
    fields += [("long long", f, "q") for f in ("n_out", "n_red", "chunk", "rt", "ot", "red_fast")]
    fields += scalar_fields(sig, ("a", "acc"))
    if rk:
        fields += [("long long", f"kshape[{rk}]", "q" * rk), ("long long", f"kst[{rk}]", "q" * rk)]
    if rr:
        fields += [("long long", f"rshape[{rr}]", "q" * rr), ("long long", f"rst[{rr}]", "q" * rr)]
    struct_src, fmt = args_struct(fields)
    sparams = "".join(f", const {t} {n}" for n, t, _ in sig)
    sargs = "".join(f", p.s_{n}" for n, _, _ in sig)
    szero = "".join(f", ({t})0" for _, t, _ in sig)
    helpers = (f"__device__ __forceinline__ auto dn_map(const {xv} a{sparams}) {{\n    return ({map_expr});\n}}\n"
               f"typedef dn_acc<decltype(dn_map(({xv})0{szero}))>::type dn_acc_t;\n"
               "__device__ __forceinline__ void dn_combine(dn_acc_t& acc, long long& idx, const dn_acc_t v,"
               f" const long long vi) {{\n    {_COMBINE[op]}\n}}\n")
    if arg:
        write = f"p.out[dn_o] = {c_store(out_dtype, 'idx')};\n"
    else:
        helpers += (f"__device__ __forceinline__ auto dn_post(const dn_acc_t acc{sparams}) {{\n"
                    f"    return ({post_expr});\n}}\n")
        write = f"p.out[dn_o] = {c_store(out_dtype, f'dn_post(acc{sargs})')};\n"
    ident = _IDENTITY[op]
    x_load = c_load(x_dtype, "p.x[OFF]")
    accum = [_accumulate(ity, rr, x_load, xv, sargs) for ity in ("unsigned int", "long long")]
    loop = ("const long long dn_o = dn_ob * dn_ot + dn_olane;\n"
            "const bool dn_valid = dn_o < p.n_out;\n"
            f"dn_acc_t acc = {ident};\n"
            "long long idx = 0x7fffffffffffffffLL;\n"
            "if (dn_valid) {\n"
            "    long long dn_base = 0;\n"
            + indent(decompose_index("dn_o", "long long", "p.kshape", rk, [("dn_base", "p.kst")]), "    ")
            + "    if (dn_re <= 0x7fffffffLL) {\n" + indent(accum[0], " " * 8)
            + "    } else {\n" + indent(accum[1], " " * 8) + "    }\n}\n"
            + _tree(arg)
            + "if (gridDim.y == 1) {\n"
            f"    if (dn_valid && dn_lane == 0) {write}"
            "} else {  // split: park the partial result; the block that arrives last combines them all\n"
            "    const long long dn_slot = (long long)blockIdx.y * p.n_out + dn_o;\n"
            "    if (dn_valid && dn_lane == 0) {\n"
            "        ((dn_acc_t*)p.sval)[dn_slot] = acc;\n"
            + ("        p.sidx[dn_slot] = idx;\n" if arg else "")
            + "        __threadfence();\n"
            "    }\n"
            "    __syncthreads();\n"
            "    if (dn_tid == 0) dn_last = atomicAdd(&p.counters[dn_ob], 1u) == gridDim.y - 1;\n"
            "    __syncthreads();\n"
            "    if (dn_last) {\n"
            f"        acc = {ident};\n"
            "        idx = 0x7fffffffffffffffLL;\n"
            "        if (dn_valid) {\n"
            "            for (unsigned int dn_y = dn_lane; dn_y < gridDim.y; dn_y += dn_rt) {\n"
            "                const long long dn_k = (long long)dn_y * p.n_out + dn_o;  // volatile: skip stale L1\n"
            "                dn_combine(acc, idx, ((volatile dn_acc_t*)p.sval)[dn_k],"
            f" {'((volatile long long*)p.sidx)[dn_k]' if arg else '0'});\n"
            "            }\n"
            "        }\n"
            + indent(_tree(arg), " " * 8)
            + f"        if (dn_valid && dn_lane == 0) {write}"
            "        if (dn_tid == 0) p.counters[dn_ob] = 0;  // ready for the next launch on this stream\n"
            "    }\n"
            "}\n")
    kernel = (f'extern "C" __global__ void __launch_bounds__({RBLOCK}) {name}(const dn_args p) {{\n'
              f"    __shared__ dn_acc_t dn_sv[{RBLOCK}];\n"
              + (f"    __shared__ long long dn_si[{RBLOCK}];\n" if arg else "")
              + "    __shared__ bool dn_last;\n"
              "    const int dn_tid = threadIdx.x, dn_rt = (int)p.rt, dn_ot = (int)p.ot;\n"
              "    const int dn_lane = p.red_fast ? dn_tid % dn_rt : dn_tid / dn_ot;   // share of the reduction\n"
              "    const int dn_olane = p.red_fast ? dn_tid / dn_rt : dn_tid % dn_ot;  // output within the block\n"
              "    const unsigned int dn_mask = blockDim.x >= 32 ? 0xffffffffu : (1u << blockDim.x) - 1u;\n"
              "    const long long dn_rb = (long long)blockIdx.y * p.chunk;\n"
              "    const long long dn_re = dn_rb + p.chunk < p.n_red ? dn_rb + p.chunk : p.n_red;\n"
              "    for (long long dn_ob = blockIdx.x; dn_ob * dn_ot < p.n_out; dn_ob += gridDim.x) {\n"
              + indent(loop, " " * 8) + "    }\n}\n")
    return PREAMBLE + _ACC + struct_src + helpers + kernel, name, fmt
