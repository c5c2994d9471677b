"""`slotserver.native`: C sources compile once and are cached, compile errors carry the
compiler's message at the source file's own lines, a missing compiler or SLOTSERVER_NATIVE=0
means None (torch serves), and loading the kernels leaves the process's float behaviour alone."""

from __future__ import annotations

import ctypes
import importlib.util
import sys

import pytest
import torch

from slotserver import native
from slotserver.module_loader import default_dir

needs_cc = pytest.mark.skipif(native.compiler() is None, reason="no C compiler on this machine")
ADD = "int add(int64_t a, int64_t b) { return (int)(a + b); }\n"


@needs_cc
def test_a_source_is_compiled_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOTSERVER_CACHE", str(tmp_path))
    first = native.compile_library("add", native.PRELUDE + ADD)
    mtime = first.stat().st_mtime_ns
    again = native.compile_library("add", native.PRELUDE + ADD)
    assert again == first and again.stat().st_mtime_ns == mtime and first.parent == tmp_path / "native"
    lib = ctypes.CDLL(str(first))
    assert lib.add(ctypes.c_int64(40), ctypes.c_int64(2)) == 42


@needs_cc
def test_a_compile_error_points_at_the_line_of_its_origin_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOTSERVER_CACHE", str(tmp_path))
    broken = "int add(int64_t a, int64_t b) { return (int)(a + b) }\n"
    origin = tmp_path / "kernel.py"
    origin.write_text(f'"""doc"""\nX = 1\nSRC = r"""{broken}"""\n')
    with pytest.raises(native.NativeError, match=r"C compile error(.|\n)*kernel\.py:3:"):
        native.build("broken", broken, origin=str(origin), strict=True)
    assert native.build("broken", broken, origin=str(origin)) is None  # not strict: one warning, None


def test_no_compiler_or_switched_off_means_torch_serves(monkeypatch):
    monkeypatch.setenv("SLOTSERVER_NATIVE", "0")
    assert native.build("add", ADD, strict=True) is None
    monkeypatch.setenv("SLOTSERVER_NATIVE", "1")
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    assert native.compiler() is None
    assert native.build("add_nocc", ADD + "/* other */\n", strict=True) is None  # no compiler is not an error


@needs_cc
def test_kernels_build_their_c_here_and_leave_subnormals_alone():
    """With a compiler, every kernel with C source uses it (so test_kernels checks the C, not only
    the fallback); and no library switched the process to flush-to-zero (`-ffast-math` would)."""
    mods = []
    for path in sorted(default_dir("kernels").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"_native_check_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if getattr(mod, "NATIVE_C", None) is not None:
            mods.append(mod)
            assert mod._LIB is not None, path.stem
    assert {m.OP for m in mods} >= {"attention", "rms_norm", "rope", "silu_mul"}
    assert sys.float_info.min / 2 > 0.0
    assert torch.tensor(1e-40, dtype=torch.float32).item() > 0.0


@needs_cc
def test_a_toolchain_that_cannot_build_the_probe_is_no_compiler(tmp_path, monkeypatch):
    """A compiler without OpenMP (or without a flag we use) must not make the kernels refuse to
    load: it counts as no compiler, and the torch forms serve."""
    monkeypatch.setenv("SLOTSERVER_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "FLAGS", native.FLAGS + ("-fno-such-flag-xyz",))
    with pytest.raises(native.NoCompiler, match="cannot build"):
        native.compile_library("add", native.PRELUDE + ADD)
    assert native.build("add_flags", ADD + "/* flags */\n", strict=True) is None
