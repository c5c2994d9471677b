"""Make tests/fixtures/tokenizers/templates.json: llama-server's /apply-template for chat templates.

Run once (it needs the llama.cpp peer build and the real gemma-3-270m file; tests only read the
output):

    .venv/bin/python playground/make_template_fixtures.py [--gemma PATH]

llama-server runs the gemma-3-270m Q4_K_M file with `--jinja` and each template of `TEMPLATES`
(`--chat-template-file`; "file" means the file's own, which this GGUF lacks, so ChatML), and
`POST /apply-template` renders every conversation of `CONVERSATIONS` (the prompt, or the error
with its HTTP status); `/props` gives the template's `chat_template_caps` as llama.cpp probed them.
The model's BOS/EOS texts (`<bos>`, `<eos>`) are what the templates see, and as it adds BOS
itself, a template's leading `<bos>` is cut. Templates: those of template_sources.py (Gemma 3,
which this GGUF does not carry, Mistral v0.1, Llama 2, Phi-3-medium) and llama.cpp's
models/templates copies of Gemma 2, Qwen 3, Qwen 2.5, Phi-3.5, Granite 3.3, Llama 3.2, Mistral
Nemo and Mistral Small 3.2. `date` is the day it ran (Granite prints today's date).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from contextlib import contextmanager
import urllib.request
from datetime import date
from pathlib import Path

from local_server import LLAMA_CPP, free_port, wait_healthy
from template_sources import GEMMA3, LLAMA2, MISTRAL_V01, PHI3_MEDIUM

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "tokenizers" / "templates.json"
GEMMA = Path("/tmp/gemma-3-270m-q4_k_m.gguf")

TEMPLATES = {
    "file": None,
    "gemma3": GEMMA3,
    "gemma2": "google-gemma-2-2b-it.jinja",
    "qwen3": "Qwen-Qwen3-0.6B.jinja",
    "qwen2.5": "Qwen-Qwen2.5-7B-Instruct.jinja",
    "phi3.5": "microsoft-Phi-3.5-mini-instruct.jinja",
    "granite3.3": "ibm-granite-granite-3.3-2B-Instruct.jinja",
    "llama3.2": "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "mistral-v0.1": MISTRAL_V01,
    "mistral-nemo": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "mistral-small3.2": "Mistral-Small-3.2-24B-Instruct-2506.jinja",
    "llama2": LLAMA2,
    "phi3-medium": PHI3_MEDIUM,
}


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "  padded text \n"}],
    [{"role": "user", "content": "Line1\nLine2 with <b>tags</b>, émojis 🦙 and \"quotes\""}],
    [{"role": "user", "content": [{"type": "text", "text": "parts "}, {"type": "text", "text": "two"}]}],
    # 5-10: system-only, parts on every role, developer role, null content, empty parts, two users
    [{"role": "system", "content": "Only a system message."}],
    [{"role": "system", "content": [_text("Rule one."), _text("Rule two.")]},
     {"role": "user", "content": [_text(" Hi "), _text("there")]},
     {"role": "assistant", "content": [_text("Hello"), _text("again")]},
     {"role": "user", "content": "Bye"}],
    [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": None}],
    [{"role": "user", "content": [_text(""), _text("x"), _text("")]}],
    [{"role": "user", "content": "A"}, {"role": "user", "content": "B"}],
]
KWARGS = {"date_string": "26 Jul 2024"}  # llama 3.x templates print today's date otherwise


def _request(port: int, path: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return {"error": json.loads(exc.read())["error"], "status": exc.code}


@contextmanager
def llama_server(gemma: Path, source: str | None, tmp: Path):
    """llama-server (`--jinja`) on `gemma` with the chat template `source` (None: the file's own),
    its log in `tmp`; yields its port once healthy."""
    port = free_port()
    args = [str(LLAMA_CPP / "build/bin/llama-server"), "-m", str(gemma), "--jinja", "--port",
            str(port), "-c", "512", "-t", "1", "-np", "1"]
    if source is not None:
        (tmp / "t.jinja").write_text(source)
        args += ["--chat-template-file", str(tmp / "t.jinja")]
    with open(tmp / "server.log", "w") as log:
        server = subprocess.Popen(args, stdout=log, stderr=log,
                                  env={"LD_LIBRARY_PATH": str(LLAMA_CPP / "build/bin")})
        try:
            wait_healthy(port, "llama-server (see its log)", server)
            yield port
        finally:
            server.terminate()
            server.wait(timeout=30)


def render_all(gemma: Path, source: str | None, tmp: Path) -> tuple[dict, list[dict]]:
    """llama-server's template caps, and its prompt (or error) for every conversation."""
    with llama_server(gemma, source, tmp) as port:
        caps = _request(port, "/props")["chat_template_caps"]
        return caps, [_request(port, "/apply-template", {"messages": messages, "chat_template_kwargs": KWARGS})
                      for messages in CONVERSATIONS]


def gemma_arg(doc: str) -> Path:
    """The `--gemma PATH` of the command line (a script whose docstring is `doc`)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--gemma", type=Path, default=GEMMA)
    return parser.parse_args().gemma


def write_fixture(out: Path, cases: list[dict]) -> None:
    """`cases`, with the BOS/EOS texts the templates saw and today's date, as the JSON file `out`."""
    out.write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>", "add_bos": True,
                               "date": date.today().isoformat(), "cases": cases},
                              ensure_ascii=False, indent=1) + "\n")


def main() -> None:
    gemma = gemma_arg(__doc__)
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, template in TEMPLATES.items():
            source = template
            if template is not None and template.endswith(".jinja"):
                source = (LLAMA_CPP / "models" / "templates" / template).read_text()
            caps, results = render_all(gemma, source, Path(tmp))
            cases.append({"name": name, "source": source, "kwargs": KWARGS, "caps": caps,
                          "conversations": [{"messages": m, **r}
                                            for m, r in zip(CONVERSATIONS, results)]})
            print(name, "".join("." if "prompt" in r else "E" for r in results))
    write_fixture(OUT, cases)


if __name__ == "__main__":
    main()
