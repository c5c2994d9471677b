"""`slotserver.runtime.native`: C sources compile once and are cached, compile errors carry the
compiler's message at the source file's own lines, a missing compiler or SLOTSERVER_NATIVE=0
means None (torch serves), loading the kernels leaves the process's float behaviour alone, and
each CPU variant (SLOTSERVER_CPU) builds its own library with no instruction above the variant."""

from __future__ import annotations

import ast
import ctypes
import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from slotserver.runtime import cpu_features

from slotserver.runtime import native
from slotserver.runtime import native_cache
from slotserver.lab.check import kernel_files
from slotserver.runtime.kernel_set import KERNEL_CONTRACT
from slotserver.runtime.loader import default_dir, load_by_path

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
def test_two_builders_of_one_library_compile_it_once(tmp_path, monkeypatch):
    """Two processes (test workers, tensor-parallel ranks) asking at once for a library not yet
    built: the second waits on the first's lock and loads what it built. Two threads here hold
    separate open files of the lock, which flock treats as two processes."""
    import threading

    monkeypatch.setenv("SLOTSERVER_CACHE", str(tmp_path))
    native.compile_library("probe", native.PRELUDE + native_cache.PROBE)
    compiled, real, started = [], native_cache._compile, threading.Barrier(2)

    def counted_compile(*args):
        compiled.append(args[2])
        real(*args)

    monkeypatch.setattr(native_cache, "_compile", counted_compile)
    paths = []

    def build():
        started.wait()
        paths.append(native.compile_library("twice", native.PRELUDE + ADD))

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert compiled == ["twice"] and len(paths) == 2 and paths[0] == paths[1] and paths[0].exists()


@needs_cc
def test_a_compile_error_points_at_the_line_of_its_origin_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOTSERVER_CACHE", str(tmp_path))
    monkeypatch.delenv("SLOTSERVER_NATIVE", raising=False)
    broken = "int add(int64_t a, int64_t b) { return (int)(a + b) }\n"
    origin = tmp_path / "kernel.py"
    origin.write_text(f'"""doc"""\nX = 1\nSRC = r"""{broken}"""\n')
    with pytest.raises(native.NativeError, match=r"C compile error(.|\n)*kernel\.py:3:"):
        native.build("broken", broken, origin=str(origin), strict=True)
    assert native.build("broken", broken, origin=str(origin)) is None  # not strict: one warning, None


@needs_cc
def test_a_compile_error_in_a_c_file_points_at_its_line(tmp_path, monkeypatch):
    """What a kernel module does (`c_source` + `c_path`): the message names the .c file's line."""
    monkeypatch.setenv("SLOTSERVER_CACHE", str(tmp_path))
    monkeypatch.delenv("SLOTSERVER_NATIVE", raising=False)
    (tmp_path / "k.c").write_text("/* k.c */\n#include <stdlib.h>\nint add(int64_t a, int64_t b) { return (int)(a + b) }\n")
    module = str(tmp_path / "k.py")
    with pytest.raises(native.NativeError, match=r"C compile error(.|\n)*k\.c:3:"):
        native.build("broken_c", native.c_source(module, "k.c"), origin=native.c_path(module, "k.c"), strict=True)
    # the file saved again since its text was read (the lab compiles the bytes it validated): still k.c's lines
    read = native.c_source(module, "k.c").replace("a + b", "a + b + 0")
    (tmp_path / "k.c").write_text("/* another save */\n")
    with pytest.raises(native.NativeError, match=r"C compile error(.|\n)*k\.c:3:"):
        native.build("broken_c", read, origin=native.c_path(module, "k.c"), strict=True)
    # no origin: named by the library, never at the prelude's lines
    with pytest.raises(native.NativeError, match=r"C compile error(.|\n)*<broken_c>:3:") as e:
        native.build("broken_c", read + "/* no origin */\n", strict=True)
    assert "prelude.h" not in str(e.value)


def test_the_prelude_is_prepended_from_prelude_h_at_its_lines(monkeypatch):
    """native.PRELUDE is slotserver/runtime/prelude.h, and what is compiled starts with a #line
    directive naming that file (a message about a prelude helper points at prelude.h)."""
    header = Path(native.__file__).with_name("prelude.h")
    assert native.PRELUDE == header.read_text() and "static inline float bf2f" in native.PRELUDE
    monkeypatch.delenv("SLOTSERVER_NATIVE", raising=False)
    seen = {}

    def record(name, source):
        seen[name] = source
        raise native.NativeError("recorded, not compiled")

    monkeypatch.setattr(native_cache, "compile_library", record)
    assert native.build("prelude_line", ADD + "/* prelude line */\n") is None
    assert seen["prelude_line"].startswith(f'#line 1 "{header}"\n{native.PRELUDE}')


def test_c_lives_in_c_files_not_in_python_strings():
    """Every C source of the tree is a .c (or .h) file: no module under kernels/, layouts/ or
    slotserver/ holds C in a string (the one-line toolchain probe, native_cache.PROBE, aside)."""
    root = Path(__file__).resolve().parent.parent
    c_like = re.compile(r"#include\s*<|\b(?:int|void|float|static)\s+[\w\s*]*\w+\s*\([^)]*\)\s*\{")
    found = []
    for path in sorted([*(root / "kernels").glob("*.py"), *(root / "layouts").glob("*.py"), *(root / "slotserver").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and c_like.search(node.value) \
                    and node.value != native_cache.PROBE:
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not found, f"move this C into a .c file beside its module (native.c_source / c_path): {found}"


@pytest.fixture(autouse=True)
def own_unavailable(monkeypatch):
    """Each test's failed builds stay its own: native.unavailable() turns the engine's tuner off."""
    monkeypatch.setattr(native, "_unavailable", set())


def test_a_library_that_cannot_be_built_here_is_named_unavailable(tmp_path, monkeypatch):
    """A machine's fault (here: the compiler's binary failing with OSError) leaves the torch form
    serving, and unavailable() says which library, so the thread tuner stays off (engine.py)."""
    monkeypatch.setenv("SLOTSERVER_CACHE", str(tmp_path))
    monkeypatch.delenv("SLOTSERVER_NATIVE", raising=False)
    assert native.unavailable() == []

    def broken(name, full):
        raise OSError("compiler crashed")

    monkeypatch.setattr(native, "_load", broken)
    assert native.build("add_broken", ADD + "/* broken */\n", strict=True) is None
    assert native.unavailable() == ["add_broken"]


def test_no_compiler_or_switched_off_means_torch_serves(monkeypatch):
    monkeypatch.setenv("SLOTSERVER_NATIVE", "0")
    assert native.build("add", ADD, strict=True) is None
    monkeypatch.setenv("SLOTSERVER_NATIVE", "1")
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    assert native.compiler() is None
    assert native.build("add_nocc", ADD + "/* other */\n", strict=True) is None  # no compiler is not an error


@needs_cc
@pytest.mark.skipif(os.environ.get("SLOTSERVER_NATIVE") == "0", reason="native kernels switched off")
def test_kernels_build_their_c_here_and_leave_subnormals_alone():
    """With a compiler, every kernel with C source uses it (so test_kernels checks the C, not only
    the fallback); and no library switched the process to flush-to-zero (`-ffast-math` would)."""
    mods = []
    for path in kernel_files(default_dir("kernels")):
        mod = load_by_path(path, KERNEL_CONTRACT).module   # as the lab loads them
        if getattr(mod, "NATIVE_C", None) is not None:
            mods.append(mod)
            assert mod._LIB is not None, path.stem
    assert {m.OP for m in mods} >= {"attention", "rms_norm", "rope", "silu_mul", "gelu_mul", "qmatmul"}
    assert sys.float_info.min / 2 > 0.0
    assert torch.tensor(1e-40, dtype=torch.float32).item() > 0.0


@needs_cc
def test_a_toolchain_that_cannot_build_the_probe_is_no_compiler(tmp_path, monkeypatch):
    """A compiler without OpenMP (or without a flag we use) must not make the kernels refuse to
    load: it counts as no compiler, and the torch forms serve."""
    monkeypatch.setenv("SLOTSERVER_CACHE", str(tmp_path))
    monkeypatch.delenv("SLOTSERVER_NATIVE", raising=False)
    monkeypatch.setattr(native_cache, "FLAGS", native_cache.FLAGS + ("-fno-such-flag-xyz",))
    with pytest.raises(native.NoCompiler, match="cannot build"):
        native.compile_library("add", native.PRELUDE + ADD)
    assert native.build("add_flags", ADD + "/* flags */\n", strict=True) is None


@needs_cc
def test_bf16_rounding_keeps_a_nan_a_nan(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOTSERVER_CACHE", str(tmp_path))
    src = "int conv(uint32_t u) { union { uint32_t u; float f; } x; x.u = u; return f2bf(x.f); }\n"
    lib = ctypes.CDLL(str(native.compile_library("conv", native.PRELUDE + src)))
    lib.conv.argtypes = [ctypes.c_uint32]
    for bits in (0x7F800001, 0xFFFFFFFF, 0xFFC00000):   # NaNs, including payloads rounding would turn into inf / 0
        out = lib.conv(bits) & 0xFFFF
        assert out & 0x7F80 == 0x7F80 and out & 0x7F, hex(bits)
    assert lib.conv(0x3F800000) == 0x3F80 and lib.conv(0x7F800000) == 0x7F80   # 1.0 and +inf unchanged


def test_the_attention_guard_keeps_mismatched_inputs_away_from_c():
    """Inputs the C kernel would read out of bounds with go to the torch form (which raises or
    copes), never to C: wrong head size, fewer q rows than sequences, a stream past the cache."""
    from slotserver.runtime.batch import Batch, SeqChunk
    from slotserver.runtime.kv_spec import StridedKV

    spec = importlib.util.spec_from_file_location("_guard_attention", default_dir("kernels") / "attention.py")
    att = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(att)
    if att._LIB is None:
        pytest.skip("no C compiler here")
    k = torch.randn(4, 16, 2, 8)
    meta = Batch.build([SeqChunk(0, 3, [1]), SeqChunk(2, 5, [1])]).attn
    assert att._native_ok(torch.randn(2, 4, 8), StridedKV(k, k.clone()), meta)
    assert not att._native_ok(torch.randn(2, 4, 6), StridedKV(k, k.clone()), meta)            # head size
    assert not att._native_ok(torch.randn(1, 4, 8), StridedKV(k, k.clone()), meta)            # q rows
    assert not att._native_ok(torch.randn(2, 4, 8), StridedKV(k[:2], k[:2].clone()), meta)    # stream 2 of 2
    assert not att._native_ok(torch.randn(2, 4, 8), StridedKV(k, k[:, :, :, :4].clone()), meta)  # v differs


@needs_cc
def test_a_copy_of_a_kernel_under_another_path_reuses_its_library(tmp_path, monkeypatch):
    """The cache key is the code, not where it came from: a lab folder's copy of a kernel (another
    `#line` origin) loads the library the original built; a changed body compiles anew."""
    monkeypatch.setenv("SLOTSERVER_CACHE", str(tmp_path))
    first = native.compile_library("copy", f'#line 1 "/a/x.c"\n{native.PRELUDE}{ADD}')
    again = native.compile_library("copy", f'#line 1 "/tmp/lab/kernels/x.c"\n{native.PRELUDE}{ADD}')
    edited = native.compile_library("copy", f'#line 1 "/a/x.c"\n{native.PRELUDE}{ADD}/* edited */ int z(void) {{ return 1; }}\n')
    assert again == first and edited != first


def test_old_builds_of_a_name_are_pruned(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOTSERVER_CACHE", str(tmp_path))
    monkeypatch.setattr(native_cache, "KEEP_PER_NAME", 3)   # the rule, not the number: 5 compiles, not 14
    n = native_cache.KEEP_PER_NAME + 2
    paths = [native.compile_library("edit", native.PRELUDE + ADD + f"/* edit {i} */\n") for i in range(n)]
    left = sorted((tmp_path / "native").glob("edit-*.so"))
    assert len(left) == native_cache.KEEP_PER_NAME and paths[-1] in left and paths[0] not in left


# which instruction sets the compiler targeted: a library above its variant would crash (SIGILL) there
TARGETS = r"""
int targets(void) { int t = 0;
#ifdef __AVX2__
t |= 1;
#endif
#ifdef __AVX512F__
t |= 2;
#endif
#ifdef __AMX_TILE__
t |= 4;
#endif
#ifdef SLOT_AVX512
t |= 8;
#endif
return t; }
float exp_at(float x) { return fast_exp(x); }
"""
NEEDS = {"avx2": "avx2", "avx512": "avx512f", "amx": "amx_tile"}


@needs_cc
@pytest.mark.parametrize("variant", cpu_features.VARIANTS)
def test_each_cpu_variant_builds_its_own_library_within_its_instruction_set(variant, tmp_path, monkeypatch):
    if not cpu_features.supports(variant):
        pytest.skip(f"needs {NEEDS[variant]}")
    monkeypatch.setenv("SLOTSERVER_CACHE", str(tmp_path))
    monkeypatch.setenv("SLOTSERVER_CPU", variant)
    path = native.compile_library("targets", native.PRELUDE + TARGETS)
    lib = ctypes.CDLL(str(path))
    lib.exp_at.argtypes, lib.exp_at.restype = [ctypes.c_float], ctypes.c_float
    assert abs(lib.exp_at(1.0) - 2.7182817) < 1e-5 and lib.exp_at(-100.0) >= 0.0
    t = lib.targets()
    assert t & 1 and bool(t & 2) == (variant != "avx2") and bool(t & 4) == (variant == "amx"), (variant, t)
    assert bool(t & 8) == (variant != "avx2" and "avx512_bf16" in cpu_features.host_flags())
    monkeypatch.setenv("SLOTSERVER_CPU", "avx2" if variant != "avx2" else "auto")
    other = native.compile_library("targets", native.PRELUDE + TARGETS)
    assert (other != path) == (cpu_features.current().variant != variant)  # the cache key holds the flags


def test_an_unknown_cpu_variant_is_refused(monkeypatch):
    monkeypatch.setenv("SLOTSERVER_CPU", "avx3")
    with pytest.raises(cpu_features.CpuVariantError, match="SLOTSERVER_CPU must be"):
        native_cache.compile_flags()
    from slotserver.model.config import ConfigError, ModelConfig

    with pytest.raises(ConfigError, match="SLOTSERVER_CPU must be"):   # refused at startup, before any build
        ModelConfig(Path("model.gguf"))
