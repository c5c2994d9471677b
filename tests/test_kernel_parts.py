"""A kernel's parts (runtime/kernel_parts.py): `_<name>.py` files beside it that it loads. They are
read, versioned and executed with it (the bytes validated are the bytes swapped in), never listed
as modules of their own, and a broken one is refused at its own file and line."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from slotserver.runtime.loader import ModuleLoadError, load_source, lab_files, module_names, read_source, users_of

KERNEL = textwrap.dedent('''
    from slotserver.runtime import kernel_parts

    fast = kernel_parts.load(__file__, "_fast.py")
    common = kernel_parts.load(__file__, "_common.py")
    OP = "k"

    def triton(x):
        return fast.launch(x)
''')
FAST = textwrap.dedent('''
    from slotserver.runtime import kernel_parts

    _common = kernel_parts.load(__file__, "_common.py")

    def launch(x):
        return _common.SCALE * x
''')
COMMON = "SCALE = 3\n"


def _folder(tmp_path: Path) -> Path:
    tmp_path.mkdir(exist_ok=True)
    for name, text in (("k.py", KERNEL), ("_fast.py", FAST), ("_common.py", COMMON), ("other.py", "OP = 'o'\n")):
        (tmp_path / name).write_text(text)
    return tmp_path


def test_a_part_is_read_with_its_module_and_in_its_version_but_never_listed(tmp_path):
    folder = _folder(tmp_path)
    src = read_source(folder / "k.py")
    assert src.files() == ["_common.py", "_fast.py"]          # _common through _fast, once
    assert module_names(folder) == ["k", "other"]             # a part is no op a request may name
    assert users_of(folder, "_common.py") == ["k"] and users_of(folder, "_fast.py") == ["k"]
    assert lab_files(folder) == sorted(folder / n for n in ("k.py", "_fast.py", "_common.py", "other.py"))
    (folder / "_common.py").write_text("SCALE = 4\n")
    assert read_source(folder / "k.py").version != src.version   # an edit to a part is an edit to the kernel


def test_the_module_runs_the_parts_bytes_it_was_read_with(tmp_path):
    """A part saved between the read (validation) and the load (swap) cannot slip in."""
    folder = _folder(tmp_path)
    src = read_source(folder / "k.py")
    (folder / "_common.py").write_text("SCALE = 5\n")
    module = load_source(src, ("OP", "triton")).module
    assert module.triton(2) == 6
    assert module.common is module.fast._common            # one load, one object per part
    again = load_source(read_source(folder / "k.py"), ("OP", "triton"))
    assert again.module.triton(2) == 10 and again.parts == ("_common.py", "_fast.py")
    assert again.module.common is not module.common        # every load executes its parts afresh


@pytest.mark.parametrize("text,where", [("SCALE = (\n", "_common.py:1: syntax error"),
                                        ("X = 1\nSCALE = 1 / 0\n", "_common.py:2: import failed: ZeroDivisionError")])
def test_a_broken_part_is_refused_at_its_own_line(tmp_path, text, where):
    folder = _folder(tmp_path)
    (folder / "_common.py").write_text(text)
    with pytest.raises(ModuleLoadError, match=where):
        load_source(read_source(folder / "k.py"), ("OP",))


def test_a_part_outside_the_folder_or_missing_is_refused(tmp_path):
    folder = _folder(tmp_path / "kernels")
    outside = tmp_path / "elsewhere.py"
    outside.write_text("SCALE = 7\n")
    (folder / "_common.py").unlink()
    with pytest.raises(ModuleLoadError, match="cannot read _common.py"):
        read_source(folder / "k.py")
    os.symlink(outside, folder / "_common.py")
    with pytest.raises(ModuleLoadError, match="resolves outside"):
        read_source(folder / "k.py")


def test_a_name_that_is_no_part_name_is_refused(tmp_path):
    (tmp_path / "k.py").write_text("from slotserver.runtime import kernel_parts\n"
                                   "p = kernel_parts.load(__file__, '../x.py')\nOP = 'k'\n")
    with pytest.raises(ModuleLoadError, match="not a part name"):
        load_source(read_source(tmp_path / "k.py"), ("OP",))


def test_a_part_named_other_than_by_a_literal_is_refused_not_read_unvalidated(tmp_path):
    """Only the literal form is read with the module (and validated): a computed name would run
    whatever the file holds at load time, so the loader refuses it."""
    folder = _folder(tmp_path)
    (folder / "k.py").write_text("from slotserver.runtime import kernel_parts\n"
                                 "p = kernel_parts.load(__file__, '_com' + 'mon.py')\nOP = 'k'\n")
    with pytest.raises(ModuleLoadError, match="not read with it"):
        load_source(read_source(folder / "k.py"), ("OP",))


def test_an_exception_in_a_validation_call_names_the_parts_line(tmp_path):
    """The lab's validation of an edit whose part raises when called: the reason says where, in the
    part (the module's own line is only its call)."""
    import types

    import torch

    from slotserver.lab.validate import kernel_numerics

    folder = _folder(tmp_path)
    broken = FAST.replace("return _common.SCALE * x", "return _common.SCALE * x + None")
    (folder / "_fast.py").write_text(broken)
    line = broken[: broken.index("+ None")].count("\n") + 1
    module = load_source(read_source(folder / "k.py"), ("OP",)).module
    trusted = types.SimpleNamespace(TOL={torch.float32: 1e-6}, reference=lambda x: 3 * x,
                                    example_inputs=lambda gen, dtype: (torch.ones(2, dtype=dtype),))
    res = kernel_numerics(module.triton, trusted, torch.float32, torch.Generator(), 1, "cpu", folder / "k.py")
    assert not res.ok and f"(at _fast.py:{line})" in res.reason, res
