"""An installed package works away from the source tree: the wheel carries the bundled kernels and
layouts inside the package, `slotserver generate` on it gives the source tree's tokens, and
`slotserver lab init DIR` copies out the same files that `serve --lab DIR` then uses."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from tiny_gguf import write_tiny_gguf

ROOT = Path(__file__).resolve().parent.parent


def _run(args: list[str], cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The repository built as a wheel and installed (no deps) into a folder of its own."""
    root = tmp_path_factory.mktemp("wheel")
    build = _run(["-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(ROOT)], root)
    if build.returncode and "No module named" in build.stderr:
        pytest.skip(f"cannot build a wheel here: {build.stderr.strip().splitlines()[-1]}")
    assert build.returncode == 0, build.stderr
    [wheel] = (root / "dist").glob("slotserver-*.whl")
    site = root / "site"
    inst = _run(["-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)], root)
    assert inst.returncode == 0, inst.stderr
    return site


def test_the_package_list_is_whole():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "slotserver").rglob("__init__.py")}
    assert found <= listed, f"add to pyproject.toml's packages: {sorted(found - listed)}"


def test_an_installed_wheel_generates_like_the_source_tree(installed, tmp_path):
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run(["-c", "import slotserver.runtime.loader as l; print(l.__file__); print(l.default_dir('kernels'))"],
                 elsewhere, str(installed))
    assert where.returncode == 0, where.stderr
    module_file, kernels = where.stdout.split()
    assert module_file.startswith(str(installed)) and kernels.startswith(str(installed)), where.stdout
    cmd = ["-m", "slotserver.cli.main", "generate", "-m", str(model), "--dtype", "float32", "-n", "8", "--temp", "0", "hello"]
    got = _run(cmd, elsewhere, str(installed))
    want = _run(cmd, ROOT)
    assert got.returncode == 0 and want.returncode == 0, got.stderr + want.stderr
    assert got.stdout == want.stdout and got.stdout.strip()


def test_lab_init_copies_the_bundled_modules_and_serve_takes_them(installed, tmp_path):
    lab = tmp_path / "mylab"
    r = _run(["-m", "slotserver.cli.main", "lab", "init", str(lab)], tmp_path, str(installed))
    assert r.returncode == 0 and f"serve --lab {lab}" in r.stdout, r.stderr
    for kind in ("kernels", "layouts"):
        copied = sorted(p.name for p in (lab / kind).glob("*.py"))
        assert copied and copied == sorted(p.name for p in (ROOT / kind).glob("*.py"))
        assert all((lab / kind / n).read_bytes() == (ROOT / kind / n).read_bytes() for n in copied)
    again = _run(["-m", "slotserver.cli.main", "lab", "init", str(lab)], tmp_path, str(installed))
    assert again.returncode == 2 and "--force" in again.stderr
    bad = _run(["-m", "slotserver.cli.main", "serve", "--lab", str(lab), "--kernels-dir", str(lab)], tmp_path, str(installed))
    assert bad.returncode == 2 and "--lab DIR replaces" in bad.stderr
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    gen = _run(["-m", "slotserver.cli.main", "generate", "-m", str(model), "--lab", str(lab), "--dtype", "float32",
                "-n", "4", "--temp", "0", "hi"], tmp_path, str(installed))
    assert gen.returncode == 0 and gen.stdout.strip(), gen.stderr
