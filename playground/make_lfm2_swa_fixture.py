"""tests/fixtures/archs/lfm2_swa: the converted LFM2 fixture (make_moe_fixtures.py lfm2) with a
sliding window of 5 cells in its metadata (`lfm2.attention.sliding_window`: llama.cpp's lfm2 then
windows every attention layer, iSWA), and llama-server's outputs on it. The HF config of the public
LFM2 models has no window; llama.cpp reads one where a file has it, so slotserver does too, and
this holds it to llama.cpp's numbers. Run once after make_moe_fixtures.py lfm2:

    .venv/bin/python playground/make_lfm2_swa_fixture.py
"""

from __future__ import annotations

import json

import gguf

from make_arch_fixtures import OUT, run_llama
from gguf_rewrite import rewrite   # noqa: E402 - in tests/, which make_arch_fixtures puts on the path

WINDOW = 5




def main() -> None:
    key = ("lfm2.attention.sliding_window", (WINDOW, gguf.GGUFValueType.UINT32))
    out = rewrite(OUT / "lfm2.gguf", OUT / "lfm2_swa.gguf", keys=dict([key]))
    rows = run_llama(out)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=None) + "\n")
    out.with_suffix(".log").unlink(missing_ok=True)
    print(f"{out}: greedy {[r['generated_ids'][:6] for r in rows]}")


if __name__ == "__main__":
    main()
