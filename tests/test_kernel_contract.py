"""Every kernel module has the same parts (OP, reference, cpu, triton, example_inputs, TOL): a
module that lacks one is refused with its file and the missing name, by `slotserver lab check`
and when the model loads its kernels (the live reload's refusal is in test_lab.py)."""

from __future__ import annotations

import shutil

import pytest

from slotserver.lab.check import check_numerics, kernel_files
from slotserver.runtime.kernel_set import KERNEL_CONTRACT, KernelSet
from slotserver.runtime.loader import ModuleLoadError, default_dir


def test_every_bundled_kernel_keeps_the_whole_contract():
    for path in kernel_files(default_dir("kernels")):
        results = check_numerics(path, "cpu", n_cases=1)
        assert results and all(r.ok for r in results), (path, [r.detail for r in results])


@pytest.fixture(scope="module")
def kernels_copy(tmp_path_factory):
    """One copy of the bundled kernels for every case: the other modules' C, compiled once for
    this folder (a build is keyed on its file's path), is reused by each case's KernelSet.load."""
    folder = tmp_path_factory.mktemp("contract") / "kernels"
    shutil.copytree(default_dir("kernels"), folder)
    return folder


@pytest.mark.parametrize("name", [n for n in KERNEL_CONTRACT if n != "OP"])
def test_a_module_missing_a_part_is_refused_with_file_and_name(kernels_copy, name):
    path = kernels_copy / "silu_mul.py"
    original = (default_dir("kernels") / "silu_mul.py").read_text()
    path.write_text(original + f"\ndel {name}\n")
    try:
        [result] = check_numerics(path, "cpu", n_cases=1)
        assert not result.ok and str(path) in result.detail and f"missing contract name(s): {name}" in result.detail
        with pytest.raises(ModuleLoadError, match=f"silu_mul.py: missing contract name\\(s\\): {name}"):
            KernelSet.load(kernels_copy)
    finally:
        path.write_text(original)


def test_op_must_name_its_file(tmp_path):
    folder = tmp_path / "kernels"
    shutil.copytree(default_dir("kernels"), folder)
    path = folder / "rope.py"
    path.write_text(path.read_text() + "\nOP = 'silu_mul'\n")
    [result] = check_numerics(path, "cpu", n_cases=1)
    assert not result.ok and "OP is 'silu_mul', expected 'rope'" in result.detail
