"""tests/fixtures/archs/lfm2_swa: the converted LFM2 fixture (make_moe_fixtures.py lfm2) with a
sliding window of 5 cells in its metadata (`lfm2.attention.sliding_window`: llama.cpp's lfm2 then
windows every attention layer, iSWA), and llama-server's outputs on it. The HF config of the public
LFM2 models has no window; llama.cpp reads one where a file has it, so slotserver does too, and
this holds it to llama.cpp's numbers. Run once after make_moe_fixtures.py lfm2:

    .venv/bin/python playground/make_lfm2_swa_fixture.py
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

from make_arch_fixtures import OUT, run_llama

WINDOW = 5


def with_window(src: Path, dst: Path, window: int) -> Path:
    """src's metadata and tensors, plus `{arch}.attention.sliding_window = window`."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(name, field.contents())
        else:
            w.add_key_value(name, field.contents(), field.types[0])
    w.add_uint32(f"{arch}.attention.sliding_window", window)
    for t in reader.tensors:
        w.add_tensor(t.name, np.asarray(t.data).reshape([int(n) for n in reversed(t.shape.tolist())]),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def main() -> None:
    out = with_window(OUT / "lfm2.gguf", OUT / "lfm2_swa.gguf", WINDOW)
    rows = run_llama(out)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=None) + "\n")
    out.with_suffix(".log").unlink(missing_ok=True)
    print(f"{out}: greedy {[r['generated_ids'][:6] for r in rows]}")


if __name__ == "__main__":
    main()
