"""Create a KV layout object from `layouts/<name>.py`.

A layout module defines `NAME` and `create(spec: KVSpec)`; the object it returns keeps the layout
contract documented in `docs/architecture.md` (write, view, copy_stream, export_stream,
import_stream, bytes_used). A layout whose view is paged also keeps the paged contract
(`PagedLayout` in slotserver/runtime/paged_contract.py: block_size, max_blocks, trim_stream,
free_stream), checked here so a layout missing part of it is refused when loaded.
"""

from __future__ import annotations

from pathlib import Path

from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.loader import LoadedModule, ModuleLoadError, default_dir, load_by_path, module_names, resolve_in_folder
from slotserver.runtime.paged_contract import is_paged, paged_missing

LAYOUT_CONTRACT = ("NAME", "create")
LAYOUT_METHODS = ("write", "view", "copy_stream", "export_stream", "import_stream", "bytes_used")


def available_layouts(folder: Path | None = None) -> list[str]:
    return module_names(Path(folder) if folder is not None else default_dir("layouts"))


def load_layout(name: str, folder: Path | None = None) -> LoadedModule:
    folder = Path(folder) if folder is not None else default_dir("layouts")
    return load_by_path(resolve_in_folder(folder, name, "layout"), LAYOUT_CONTRACT)


def create_layout(loaded: LoadedModule, spec: KVSpec):
    """The module's layout object, refused (ModuleLoadError naming what is missing) if it breaks the
    layout contract or, with a paged view, the paged one: at load time, not as a failure mid-step."""
    layout = loaded.module.create(spec)
    missing = [m for m in LAYOUT_METHODS if not callable(getattr(layout, m, None))]
    if missing:
        raise ModuleLoadError(f"{loaded.path}: layout object lacks {', '.join(missing)}")
    missing = paged_missing(layout) if is_paged(layout) else []
    if missing:
        raise ModuleLoadError(f"{loaded.path}: its view is paged, but the layout object lacks {', '.join(missing)} "
                              "(the paged contract, PagedLayout in slotserver/runtime/paged_contract.py)")
    return layout
