"""Make tests/fixtures/tokenizers/templates.json: llama-server's /apply-template for chat templates.

Run once (it needs the llama.cpp peer build and the real gemma-3-270m file; tests only read the
output):

    .venv/bin/python playground/make_template_fixtures.py [--gemma PATH]

llama-server runs the gemma-3-270m Q4_K_M file with `--jinja` and each template of `TEMPLATES`
(`--chat-template-file`; "file" means the file's own, which this GGUF lacks, so ChatML), and
`POST /apply-template` renders every conversation of `CONVERSATIONS`. The model's BOS/EOS texts
(`<bos>`, `<eos>`) are what the templates see. Templates: Gemma 3's (google/gemma-3-*-it
tokenizer_config.json, which this GGUF does not carry) and llama.cpp's models/templates copies
of Gemma 2, Qwen 3, Qwen 2.5, Phi-3.5, Granite 3.3 and Llama 3.2.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "tokenizers" / "templates.json"
LLAMA_CPP = Path.home() / ".cache/slotserver-peer/llama_cpp_python-0.3.36/vendor/llama.cpp"
GEMMA = Path("/tmp/gemma-3-270m-q4_k_m.gguf")

GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

TEMPLATES = {
    "file": None,
    "gemma3": GEMMA3_TEMPLATE,
    "gemma2": "google-gemma-2-2b-it.jinja",
    "qwen3": "Qwen-Qwen3-0.6B.jinja",
    "qwen2.5": "Qwen-Qwen2.5-7B-Instruct.jinja",
    "phi3.5": "microsoft-Phi-3.5-mini-instruct.jinja",
    "granite3.3": "ibm-granite-granite-3.3-2B-Instruct.jinja",
    "llama3.2": "meta-llama-Llama-3.2-3B-Instruct.jinja",
}
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "  padded text \n"}],
    [{"role": "user", "content": "Line1\nLine2 with <b>tags</b>, émojis 🦙 and \"quotes\""}],
    [{"role": "user", "content": [{"type": "text", "text": "parts "}, {"type": "text", "text": "two"}]}],
]
KWARGS = {"date_string": "26 Jul 2024"}  # llama 3.x templates print today's date otherwise


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return {"error": json.loads(exc.read())}


def render_all(gemma: Path, source: str | None, tmp: Path) -> list[dict]:
    """llama-server's prompt (or error) for every conversation with one template."""
    port = _free_port()
    args = [str(LLAMA_CPP / "build/bin/llama-server"), "-m", str(gemma), "--jinja", "--port",
            str(port), "-c", "512", "-t", "2", "-np", "1"]
    if source is not None:
        (tmp / "t.jinja").write_text(source)
        args += ["--chat-template-file", str(tmp / "t.jinja")]
    with open(tmp / "server.log", "w") as log:
        server = subprocess.Popen(args, stdout=log, stderr=log,
                                  env={"LD_LIBRARY_PATH": str(LLAMA_CPP / "build/bin")})
        try:
            _wait_healthy(port, server)
            return [_post(port, "/apply-template", {"messages": messages,
                                                    "chat_template_kwargs": KWARGS})
                    for messages in CONVERSATIONS]
        finally:
            server.terminate()
            server.wait(timeout=30)


def _wait_healthy(port: int, server: subprocess.Popen) -> None:
    for _ in range(300):
        if server.poll() is not None:
            raise RuntimeError("llama-server exited; see its log")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("llama-server did not become healthy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gemma", type=Path, default=GEMMA)
    args = parser.parse_args()
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, template in TEMPLATES.items():
            source = template
            if template is not None and template.endswith(".jinja"):
                source = (LLAMA_CPP / "models" / "templates" / template).read_text()
            results = render_all(args.gemma, source, Path(tmp))
            cases.append({"name": name, "source": source, "kwargs": KWARGS,
                          "conversations": [{"messages": m, **r}
                                            for m, r in zip(CONVERSATIONS, results)]})
            print(name, [("prompt" in r) for r in results])
    OUT.write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>", "cases": cases},
                              ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
