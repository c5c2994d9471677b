"""Shared test fixtures: the embedded model path, its metadata and the llama.cpp reference data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# Property tests run a fixed, seeded search by default, so a run's verdict is reproducible and CI
# never fails on a draw the developer could not see. HYPOTHESIS_PROFILE=explore searches afresh
# (new seeds each run) when hunting for bugs; whatever it finds becomes an @example.
settings.register_profile("default", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

from slotserver.model.default_model import default_model_path

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def smollm_metadata(smollm_path) -> dict:
    """The GGUF key/value metadata of the default model as plain Python values."""
    import gguf

    reader = gguf.GGUFReader(smollm_path)
    return {key: field.contents() for key, field in reader.fields.items()}


@pytest.fixture(scope="session")
def tokenize_fixture() -> list[dict]:
    return json.loads((FIXTURES / "tokenize.json").read_text())


@pytest.fixture(scope="session")
def greedy_fixture() -> list[dict]:
    return json.loads((FIXTURES / "greedy_f32.json").read_text())


@pytest.fixture(scope="session")
def model_f32(smollm_path):
    from slotserver.model.model import LlamaModel

    return LlamaModel.load(smollm_path, torch.float32, max_pos=1024)


@pytest.fixture(scope="session")
def model_bf16(smollm_path):
    from slotserver.model.model import LlamaModel

    return LlamaModel.load(smollm_path, torch.bfloat16, max_pos=1024)


@pytest.fixture(scope="session")
def tokenizer(smollm_metadata):
    from slotserver.model.text.tokenizer import Tokenizer

    return Tokenizer.from_metadata(smollm_metadata)
