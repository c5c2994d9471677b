"""Make tests/fixtures/harmony_templates.json: llama-server's /apply-template of gpt-oss's chat template
(llama.cpp's models/templates/openai-gpt-oss-120b.jinja, the harmony format) for chats with tools,
reasoning_effort, a developer message, and assistant turns with reasoning_content and calls.

    .venv/bin/python playground/make_harmony_fixture.py [--gemma PATH]

llama-server only renders here (any GGUF serves; `--gemma` as the other template scripts, the
default SmolLM2 file when that is absent). The file keeps the template's source, so the tests need
nothing else. The template prints today's date (strftime_now): the test compares that line by form.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from make_template_fixtures import LLAMA_CPP, _request, gemma_arg, llama_server, write_fixture
from make_tool_fixtures import ASK, CALL, RESULT, TIME, WEATHER

from slotserver.model.default_model import default_model_path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "harmony_templates.json"
TEMPLATE = "openai-gpt-oss-120b.jinja"
THOUGHT_CALL = {**CALL, "reasoning_content": "The user wants the weather; call get_weather."}
CONVERSATIONS = [
    {"messages": [ASK], "tools": [WEATHER, TIME], "chat_template_kwargs": {"reasoning_effort": "high"}},
    {"messages": [{"role": "system", "content": "Be brief."}, ASK], "tools": [WEATHER]},
    {"messages": [{"role": "developer", "content": "Answer in French."}, ASK],
     "chat_template_kwargs": {"reasoning_effort": "low"}},
    {"messages": [ASK, THOUGHT_CALL, RESULT], "tools": [WEATHER, TIME]},
    {"messages": [ASK, CALL, RESULT, {"role": "assistant", "content": "It is 21 degrees."},
                  {"role": "user", "content": "And the time?"}], "tools": [WEATHER, TIME]},
    {"messages": [ASK, {"role": "assistant", "content": "Sunny, 21 C.", "reasoning_content": "Easy."},
                  {"role": "user", "content": "Thanks!"}]},
    # no description: the template's `"// " + tool.description` is "// " (llama.cpp's null concat)
    {"messages": [ASK], "tools": [{"type": "function", "function": {"name": "ping", "parameters": {
        "type": "object", "properties": {"host": {"type": "string"}}}}}]},
]


def main() -> None:
    model = gemma_arg(__doc__)
    model = model if model.exists() else default_model_path()
    source = (LLAMA_CPP / "models" / "templates" / TEMPLATE).read_text()
    with tempfile.TemporaryDirectory() as tmp, llama_server(model, source, Path(tmp)) as port:
        results = [_request(port, "/apply-template", c) for c in CONVERSATIONS]
    print("gpt-oss", "".join("." if "prompt" in r else "E" for r in results))
    write_fixture(OUT, [{"name": "gpt-oss", "source": source,
                         "conversations": [{**c, **r} for c, r in zip(CONVERSATIONS, results, strict=True)]}])


if __name__ == "__main__":
    main()
