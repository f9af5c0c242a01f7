"""A fresh machine: why no GPU is used (no driver, a driver too old for the runtime, no device), the install pins
that keep CUDA 12 drivers on the GPU, and d2l-zh's IPython call under the MXNet alias. All on the CPU: the
decision logic is a pure function fed each case; tests marked gpu check the real answer on a device."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from pathlib import Path

import pytest

from dnnbind._lib import cudart

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the pin test skips on 3.10

ROOT = Path(__file__).resolve().parents[1]


def test_no_driver_says_so_and_not_insufficient_driver():
    # What a machine without libcuda reports: cudaDriverGetVersion gives 0 and cudaGetDeviceCount
    # cudaErrorInsufficientDriver (35), whose own text ("CUDA driver version is insufficient") misleads.
    why = cudart.explain_no_gpu(0, 13000, "cuda-bindings 13.0.0", 35, "cudaErrorInsufficientDriver - CUDA "
                                "driver version is insufficient for CUDA runtime version")
    assert "no NVIDIA driver" in why
    assert "insufficient" not in why


@pytest.mark.parametrize("driver, runtime", [(12040, 13000), (12090, 13040), (11080, 12080)])
def test_old_driver_names_both_versions_and_the_pip_line(driver, runtime):
    why = cudart.explain_no_gpu(driver, runtime, "cuda-bindings 13.0.0", 35, "cudaErrorInsufficientDriver - x")
    assert f"CUDA {driver // 1000}.{(driver % 1000) // 10}" in why
    assert f"CUDA {runtime // 1000}.{(runtime % 1000) // 10}" in why
    assert "cuda-bindings 13.0.0" in why
    assert cudart.FIX_OLD_DRIVER in why


@pytest.mark.parametrize("driver, runtime", [(13000, 12080), (12090, 12060), (13000, 13000)])
def test_a_newer_or_equal_driver_is_never_called_too_old(driver, runtime):
    why = cudart.explain_no_gpu(driver, runtime, "cuda-bindings 12.8.0", 100,
                                "cudaErrorNoDevice - no CUDA-capable device is detected")
    assert "no CUDA device found" in why
    assert cudart.FIX_OLD_DRIVER not in why


def test_other_errors_keep_cudas_own_text():
    why = cudart.explain_no_gpu(13000, 13000, "cuda-bindings 13.0.0", 999, "cudaErrorUnknown - unknown error")
    assert "cudaErrorUnknown - unknown error" in why and "driver CUDA 13.0" in why


class _FakeRuntime:
    def __init__(self, count_err, count, driver, runtime):
        self.r = (count_err, count), (0, driver), (0, runtime)

    def cudaGetDeviceCount(self):
        return self.r[0]

    def cudaDriverGetVersion(self):
        return self.r[1]

    def cudaRuntimeGetVersion(self):
        return self.r[2]

    def cudaGetErrorString(self, err):
        return 0, b"CUDA driver version is insufficient for CUDA runtime version"


@pytest.mark.parametrize("fake, expect", [
    (_FakeRuntime(35, 0, 0, 13000), "no NVIDIA driver"),
    (_FakeRuntime(35, 0, 12040, 13000), cudart.FIX_OLD_DRIVER),
    (_FakeRuntime(0, 0, 13000, 13000), "no CUDA device found"),
])
def test_device_count_feeds_what_it_found_to_the_explanation(monkeypatch, fake, expect):
    monkeypatch.setattr(cudart, "rt", lambda: fake)
    count, why = cudart.device_count()
    assert count == 0 and expect in why


def test_device_count_counts_devices(monkeypatch):
    monkeypatch.setattr(cudart, "rt", lambda: _FakeRuntime(0, 2, 13000, 12080))
    assert cudart.device_count() == (2, "")


def test_default_install_pins_the_runtime_that_runs_on_cuda_12_and_13_drivers():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = meta["dependencies"]
    assert any(d.replace(" ", "").startswith("cuda-python") and "<13" in d for d in deps), deps
    extras = meta["optional-dependencies"]
    # No extra may demand the CUDA 13 runtime: it would conflict with the pin (pip refuses) or undo it.
    for name, reqs in extras.items():
        for r in reqs:
            assert not r.replace(" ", "").startswith(("cuda-python>=13", "cuda-bindings>=13")), (name, r)
    # cupti-python pins cuda-bindings of its own release (12.8.0 or 13.x): an extra with it can't resolve.
    assert not any(r.startswith("cupti-python") for reqs in extras.values() for r in reqs), extras
    assert any(r.replace(" ", "") == "pandas<3" for r in extras["d2l"])


def test_d2l_use_svg_display_runs_under_the_alias_with_an_ipython_that_lacks_the_call(tmp_path):
    # Stand-ins for IPython 9 (no set_matplotlib_formats) and for matplotlib-inline, which records the call.
    (tmp_path / "IPython").mkdir()
    (tmp_path / "IPython" / "__init__.py").write_text("")
    (tmp_path / "IPython" / "display.py").write_text("def display(*a):\n    pass\n")
    (tmp_path / "matplotlib_inline").mkdir()
    (tmp_path / "matplotlib_inline" / "__init__.py").write_text("")
    (tmp_path / "matplotlib_inline" / "backend_inline.py").write_text(
        "calls = []\ndef set_matplotlib_formats(*f, **k):\n    calls.append((f, k))\n")
    code = textwrap.dedent("""
        import dnnbind
        dnnbind.install_mxnet_alias()
        from IPython import display             # d2lzh 1.0.0's import, made after the alias
        display.set_matplotlib_formats('svg')   # d2lzh.use_svg_display()
        from matplotlib_inline import backend_inline
        assert backend_inline.calls == [(('svg',), {})], backend_inline.calls
        print("forwarded")
    """)
    env_path = f"{tmp_path}:{ROOT}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and "forwarded" in out.stdout, out.stderr


def test_an_ipython_that_has_the_call_is_left_alone(tmp_path):
    (tmp_path / "IPython").mkdir()
    (tmp_path / "IPython" / "__init__.py").write_text("")
    (tmp_path / "IPython" / "display.py").write_text("def set_matplotlib_formats(*f):\n    return 'own'\n")
    code = ("import dnnbind; from IPython import display; dnnbind.install_mxnet_alias(); "
            "assert display.set_matplotlib_formats('svg') == 'own'; print('own')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and "own" in out.stdout, out.stderr


@pytest.mark.gpu
def test_the_installed_runtime_finds_the_gpu():
    count, why = cudart.device_count()
    assert count >= 1 and why == ""
