"""CPU tests of the NCCL binding (dnnbind._lib.nccl): the declarations and enum values against the installed wheel's
nccl.h, the version query, error mapping with NCCL's own text, the dtype/op tables, show_config's line and import
hygiene. libnccl opens and answers these calls without a GPU; only the tests marked ``gpu`` create communicators."""

from __future__ import annotations

import ctypes
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dnnbind
from dnnbind._lib import errors, loader
from dnnbind._lib import nccl as N
from dnnbind._lib.cfunc import STATUS, P, cstr, i32, size_t, vp

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def libnccl():
    try:
        N.version()
    except errors.LibraryNotFoundError as exc:
        pytest.skip(f"NCCL is not installed (pip install nvidia-nccl-cu12): {exc}")
    return N.lib


@pytest.fixture(scope="module")
def header() -> str:
    try:
        import nvidia.nccl
    except ImportError:
        pytest.skip("the nvidia-nccl wheel (and its nccl.h) is not installed")
    path = Path(next(iter(nvidia.nccl.__path__))) / "include" / "nccl.h"
    if not path.exists():
        pytest.skip(f"no nccl.h under {path.parent}")
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", path.read_text(errors="replace"), flags=re.DOTALL)


# C type in nccl.h (const and parameter name stripped) -> what our table must say.
C_ARG = {"int": i32, "int*": P(i32), "size_t": size_t, "void*": vp, "ncclComm_t": vp, "ncclComm_t*": P(vp),
         "ncclUniqueId": N.ncclUniqueId, "ncclUniqueId*": P(N.ncclUniqueId), "ncclDataType_t": i32,
         "ncclRedOp_t": i32, "ncclResult_t": i32, "ncclResult_t*": P(i32), "cudaStream_t": vp}
C_RET = {"ncclResult_t": STATUS, "const char*": cstr}


def _prototype(text: str, name: str) -> tuple[str, list[str]]:
    m = re.search(r"^[ \t]*((?:const\s+)?\w+\s*\*?)\s*\b" + name + r"\s*\(([^)]*)\)\s*;", text, re.MULTILINE)
    assert m, f"{name} is not declared in nccl.h"
    ret = re.sub(r"\s+", "", m.group(1)).replace("const", "const ")
    args = []
    for param in (p.strip() for p in m.group(2).split(",")):
        if param in ("", "void"):
            continue
        param = re.sub(r"\bconst\b", " ", param)
        param = re.sub(r"\w+\s*$", "", param)  # the parameter's name
        args.append(re.sub(r"\s+", "", param))
    return ret, args


def test_declarations_match_the_header(header):
    assert len(N._TABLE) == 15
    wrong = {}
    for name, (restype, argtypes) in N._TABLE.items():
        ret, args = _prototype(header, name)
        want = (C_RET[ret], [C_ARG[a] for a in args])
        if want != (restype, argtypes):
            wrong[name] = (f"nccl.h: {ret} ({', '.join(args)})", want, (restype, argtypes))
    assert not wrong, wrong


def test_enum_values_and_unique_id_size_match_the_header(header):
    values = {k: int(v) for k, v in re.findall(r"\b(nccl[A-Z]\w*)\s*=\s*(\d+)\s*[,}]", header)}
    ours = {k: v for k, v in vars(N).items() if re.match(r"nccl[A-Z]", k) and type(v) is int}
    assert len(ours) == 9 + 5 + 10, sorted(ours)
    # ncclTimeout (8) is newer than NCCL 2.28's header (the cu13 wheel on the GPU machine); older libraries report
    # the code as unknown, which result_name handles
    newer = {"ncclTimeout"}
    missing = sorted(set(ours) - set(values) - newer)
    assert not missing, f"not in nccl.h: {missing}"
    assert {k: v for k, v in ours.items() if k in values and values[k] != v} == {}
    assert {values[name]: name for name in N.RESULT_NAMES.values() if name in values} == \
        {k: v for k, v in N.RESULT_NAMES.items() if v in values}
    size = int(re.search(r"#define\s+NCCL_UNIQUE_ID_BYTES\s+(\d+)", header).group(1))
    assert size == N.NCCL_UNIQUE_ID_BYTES == ctypes.sizeof(N.ncclUniqueId)


def test_every_declared_function_binds_with_its_prototype(libnccl):
    for name, (restype, argtypes) in N._TABLE.items():
        fn = getattr(libnccl, name)
        assert fn.argtypes == argtypes and fn.restype is restype, name
        assert (fn.errcheck is not None) == (restype is STATUS), name
    # NOTE: the unique id goes BY VALUE to ncclCommInitRank (128 bytes), by pointer to ncclGetUniqueId
    assert libnccl.ncclCommInitRank.argtypes[2] is N.ncclUniqueId
    assert libnccl.ncclGetUniqueId.argtypes[0] is P(N.ncclUniqueId)
    with pytest.raises(AttributeError, match="not declared"):
        libnccl.ncclBcast  # the legacy in-place broadcast is not bound


def test_unique_id_round_trips_as_bytes():
    raw = bytes(range(128))
    uid = N.ncclUniqueId.from_buffer_copy(raw)
    assert bytes(uid) == raw and ctypes.sizeof(uid) == 128


def test_version_query_needs_no_gpu(libnccl):
    v = N.version()
    major, minor, patch = N.version_tuple(v)
    assert major == 2 and minor >= 18 and v == major * 10000 + minor * 100 + patch
    assert "nccl" in loader.path("nccl")


def test_version_parsing():
    assert N.version_tuple(23203) == (2, 32, 3)
    assert N.version_tuple(22809) == (2, 28, 9)
    assert N.version_tuple(2708) == (2, 7, 8)  # before 2.9: MAJOR*1000 + MINOR*100 + PATCH


@pytest.mark.parametrize("status", sorted(N.RESULT_NAMES))
def test_error_string_for_every_code(libnccl, status):
    text = libnccl.ncclGetErrorString(status).decode()
    assert text
    if status == N.ncclSuccess:
        assert text == "no error"
    elif status < N.ncclTimeout:  # ncclTimeout is newer than some libraries we accept
        assert text != "unknown result code", N.RESULT_NAMES[status]
    assert N.error_string(status) == text


def test_nccl_error_names_function_status_and_text(libnccl):
    e = errors.NcclError(N.ncclInvalidUsage, "ncclAllReduce", N.error_message(N.ncclInvalidUsage))
    text = str(e)
    assert "ncclAllReduce" in text and "NCCL status 5" in text and "ncclInvalidUsage" in text
    assert libnccl.ncclGetErrorString(5).decode() in text
    assert isinstance(e, dnnbind.DnnbindError) and dnnbind.NcclError is errors.NcclError
    back = pickle.loads(pickle.dumps(e.add_info("dtype=float32, count=10")))
    assert type(back) is errors.NcclError and str(back) == str(e) and "count=10" in str(back)


def test_result_names_without_the_library():
    assert N.result_name(1) == "ncclUnhandledCudaError" and N.result_name(7) == "ncclInProgress"
    assert N.result_name(99) == "ncclResult_t 99"
    assert "ncclAllGather failed with NCCL status 3: x" in str(errors.NcclError(3, "ncclAllGather", "x"))


def test_a_failing_call_raises_with_ncclGetLastError_text(libnccl):
    # NCCL checks the communicator before touching CUDA, so this fails the same way with or without a GPU
    with pytest.raises(errors.NcclError) as info:
        libnccl.ncclCommGetAsyncError(None, ctypes.byref(ctypes.c_int()))
    e = info.value
    assert e.status == N.ncclInvalidArgument and e.function == "ncclCommGetAsyncError"
    assert "ncclInvalidArgument" in str(e) and libnccl.ncclGetErrorString(4).decode() in str(e)
    assert "NULL" in str(e)  # ncclGetLastError(NULL): "ncclGetAsyncError : comm argument is NULL"


@pytest.mark.parametrize("dtype,code", [(np.int8, 0), (np.uint8, 1), (np.int32, 2), (np.uint32, 3), (np.int64, 4),
                                        (np.uint64, 5), (np.float16, 6), (np.float32, 7), (np.float64, 8),
                                        ("float32", 7)])
def test_dtype_mapping(dtype, code):
    assert N.nccl_dtype(dtype) == code
    assert N.nccl_dtype(np.zeros(2, dtype).dtype) == code


def test_bfloat16_maps_by_name():
    assert N.nccl_dtype("bfloat16") == N.ncclBfloat16
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="numpy has no bfloat16 without ml_dtypes")
    assert N.nccl_dtype(ml_dtypes.bfloat16) == N.ncclBfloat16


@pytest.mark.parametrize("dtype", [np.bool_, np.int16, np.uint16, np.complex64, np.longdouble, object])
def test_unsupported_dtype_is_a_type_error_naming_it(dtype):
    with pytest.raises(TypeError, match="no data type for dtype None"):
        N.nccl_dtype(None)
    with pytest.raises(TypeError, match=f"NCCL has no data type for dtype {np.dtype(dtype).name}; supported: int8"):
        N.nccl_dtype(dtype)


@pytest.mark.parametrize("op,code", [("sum", 0), ("prod", 1), ("max", 2), ("min", 3), ("avg", 4), ("SUM", 0)])
def test_op_mapping(op, code):
    assert N.nccl_op(op) == code


@pytest.mark.parametrize("op", ["mean", "product", "", None, 0])
def test_unsupported_op_is_a_value_error_naming_it_and_the_dtype(op):
    with pytest.raises(ValueError, match=re.escape(f"NCCL has no reduction op {op!r} (dtype float16); supported: sum")):
        N.nccl_op(op, np.float16)
    with pytest.raises(ValueError, match=re.escape(f"no reduction op {op!r}; supported: sum, prod, max, min, avg")):
        N.nccl_op(op)


def test_show_config_reports_nccl(libnccl, capsys):
    info = dnnbind.show_config()
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("nccl"))
    major, minor, patch = N.version_tuple(N.version())
    assert info["nccl"]["version"] == f"{major}.{minor}.{patch}" in line and loader.path("nccl") in line


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120)


def test_show_config_says_why_nccl_is_missing(tmp_path):
    r = _run("import dnnbind, io\nf = io.StringIO()\ndnnbind.show_config(f)\n"
             "print([x for x in f.getvalue().splitlines() if x.strip().startswith('nccl')][0])",
             DNNBIND_NCCL_PATH=str(tmp_path / "libnccl.so.2"))
    assert r.returncode == 0, r.stderr
    assert "unavailable (LibraryNotFoundError" in r.stdout and "pip install nvidia-nccl-cu12" in r.stdout
    assert "DNNBIND_NCCL_PATH" in r.stdout


def test_nccl_path_override_is_used(libnccl):
    real = loader.path("nccl")
    r = _run("from dnnbind._lib import nccl, loader\nprint(nccl.version(), loader.path('nccl'))",
             DNNBIND_NCCL_PATH=real)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(N.version()), real]


def test_import_loads_no_nccl():
    r = _run("import dnnbind._lib.nccl\nfrom dnnbind._lib import loader\n"
             "print(loader.loaded(), 'libnccl' in open('/proc/self/maps').read())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["{}", "False"]


@pytest.mark.gpu
def test_single_rank_communicator_on_gpu0(libnccl):
    # ncclCommInitAll(ndev=1, devlist NULL) creates one communicator on device 0; no other process is needed.
    comm = (ctypes.c_void_p * 1)()
    libnccl.ncclCommInitAll(comm, 1, None)
    try:
        async_error = ctypes.c_int(-1)
        libnccl.ncclCommGetAsyncError(comm[0], ctypes.byref(async_error))
        assert async_error.value == N.ncclSuccess
    finally:
        libnccl.ncclCommDestroy(comm[0])
