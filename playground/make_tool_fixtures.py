"""Make tests/fixtures/tool_templates.json: llama-server's /apply-template for chats with tools.

Run once (the llama.cpp peer build and the gemma-3-270m file, as make_template_fixtures.py; tests
only read the output):

    .venv/bin/python playground/make_tool_fixtures.py [--gemma PATH]

For each template of `TEMPLATES` (llama.cpp's models/templates copies: Llama 3.1 / 3.2 / 3.3,
Mistral Nemo, and Qwen 2.5 for the Hermes format), llama-server (`--jinja`,
`--chat-template-file`) renders every conversation of `CONVERSATIONS`: the request's `tools`, an
assistant turn with a call (OpenAI's string arguments), the `tool` result, and the same history
without `tools`. Call ids are 9 letters and digits, what Mistral Nemo's template demands. The
file keeps each template's source, so the tests need nothing else.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from make_template_fixtures import LLAMA_CPP, KWARGS, _request, gemma_arg, llama_server, write_fixture

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "tool_templates.json"

TEMPLATES = {
    "llama3.1": "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "llama3.2": "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "llama3.3": "meta-llama-Llama-3.3-70B-Instruct.jinja",
    "mistral-nemo": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "qwen2.5": "Qwen-Qwen2.5-7B-Instruct.jinja",
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a time zone",
    "parameters": {"type": "object", "required": ["zone"], "properties": {"zone": {"type": "string"}}}}}
ASK = {"role": "user", "content": "What is the weather like in Paris?"}
CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "abc123XYZ", "type": "function", "function": {
    "name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"c\"}"}}]}
RESULT = {"role": "tool", "tool_call_id": "abc123XYZ", "content": "{\"temp\": 21}"}
CONVERSATIONS = [
    {"messages": [ASK], "tools": [WEATHER, TIME]},
    {"messages": [{"role": "system", "content": "Be brief."}, ASK], "tools": [WEATHER]},
    {"messages": [ASK, CALL, RESULT], "tools": [WEATHER, TIME]},
    {"messages": [ASK, CALL, RESULT, {"role": "assistant", "content": "It is 21 degrees."},
                  {"role": "user", "content": "And the time?"}], "tools": [WEATHER, TIME]},
    {"messages": [ASK, CALL, RESULT]},
]


def render_all(gemma: Path, source: str, tmp: Path) -> list[dict]:
    """llama-server's prompt (or error) for every conversation."""
    with llama_server(gemma, source, tmp) as port:
        return [_request(port, "/apply-template", {**c, "chat_template_kwargs": KWARGS}) for c in CONVERSATIONS]


def main() -> None:
    gemma = gemma_arg(__doc__)
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, file in TEMPLATES.items():
            source = (LLAMA_CPP / "models" / "templates" / file).read_text()
            results = render_all(gemma, source, Path(tmp))
            cases.append({"name": name, "source": source, "kwargs": KWARGS,
                          "conversations": [{**c, **r} for c, r in zip(CONVERSATIONS, results, strict=True)]})
            print(name, "".join("." if "prompt" in r else "E" for r in results))
    write_fixture(OUT, cases)


if __name__ == "__main__":
    main()
