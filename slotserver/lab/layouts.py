"""Create a KV layout object from `layouts/<name>.py`.

A layout module defines `NAME` and `create(spec: KVSpec)`; the object it returns keeps the layout
contract documented in `docs/architecture.md` (write, view, copy_stream, export_stream,
import_stream, bytes_used).
"""

from __future__ import annotations

from pathlib import Path

from slotserver.lab.kv_spec import KVSpec
from slotserver.lab.loader import LoadedModule, ModuleLoadError, default_dir, load_by_path, module_names, resolve_in_folder

LAYOUT_CONTRACT = ("NAME", "create")
LAYOUT_METHODS = ("write", "view", "copy_stream", "export_stream", "import_stream", "bytes_used")


def available_layouts(folder: Path | None = None) -> list[str]:
    return module_names(Path(folder) if folder is not None else default_dir("layouts"))


def load_layout(name: str, folder: Path | None = None) -> LoadedModule:
    folder = Path(folder) if folder is not None else default_dir("layouts")
    return load_by_path(resolve_in_folder(folder, name, "layout"), LAYOUT_CONTRACT)


def create_layout(loaded: LoadedModule, spec: KVSpec):
    layout = loaded.module.create(spec)
    missing = [m for m in LAYOUT_METHODS if not callable(getattr(layout, m, None))]
    if missing:
        raise ModuleLoadError(f"{loaded.path}: layout object lacks {', '.join(missing)}")
    return layout
