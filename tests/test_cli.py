"""`slotserver generate` streams text to the terminal, and `--chat` holds a conversation on stdin."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tiny_gguf import write_tiny_gguf

from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.generate import GenRequest, generate


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("cli") / "tiny.gguf")


def _run(*args, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slotserver.cli.main", *args], input=stdin, capture_output=True,
                          text=True, timeout=120)


def test_generate_prints_the_greedy_continuation(tiny):
    out = _run("generate", "-m", str(tiny), "-n", "6", "--temp", "0", "--dtype", "float32", "--weights", "dense", "Hello world")
    assert out.returncode == 0, out.stderr
    b = ModelBundle.load(ModelConfig(model_path=tiny))
    ids = b.tokenizer.encode("Hello world", parse_special=True)
    want = generate(b.model, [GenRequest(ids, 6)], b.tokenizer.eog_ids)[0].tokens
    assert out.stdout == b.tokenizer.decode([t for t in want if t not in b.tokenizer.eog_ids]) + "\n"


def test_chat_answers_each_line_until_eof(tiny):
    out = _run("generate", "--chat", "-m", str(tiny), "-n", "4", "--temp", "0", "--dtype", "float32",
               "--weights", "dense", stdin="Hello\nHow are you\n")
    assert out.returncode == 0, out.stderr
    b = ModelBundle.load(ModelConfig(model_path=tiny))
    messages, want = [], ""
    for line in ("Hello", "How are you"):  # the same conversation, turn by turn, with the history
        messages.append({"role": "user", "content": line})
        ids = b.tokenizer.encode(b.template.render(messages), parse_special=True)
        reply = b.tokenizer.decode(generate(b.model, [GenRequest(ids, 4)], b.tokenizer.eog_ids)[0].tokens)
        messages.append({"role": "assistant", "content": reply})
        want += reply + "\n"
    assert out.stdout == want


def test_bad_arguments_are_one_line_errors(tiny, tmp_path):
    missing = _run("generate", "-m", str(tmp_path / "nope.gguf"), "hi")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "nope.gguf" in missing.stderr
    no_prompt = _run("generate", "-m", str(tiny))
    assert no_prompt.returncode == 2 and "give a prompt" in no_prompt.stderr
    bad_flag = _run("generate", "--dtype", "float8", "hi")
    assert bad_flag.returncode == 2 and "invalid choice" in bad_flag.stderr


@pytest.mark.parametrize("argv", [["generate", "--foo"], ["serve", "--foo"], ["top", "--foo"], ["bench", "--foo"],
                                  ["lab", "check", "--foo"], ["lab", "init", "d", "--foo"], ["generate", "--dtype", "x"]])
def test_every_sub_command_refuses_a_bad_flag_pointing_to_its_own_help(capsys, argv):
    from slotserver.cli import main as cli
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    command = "slotserver " + " ".join(a for a in argv[:2] if not a.startswith("-") and a != "d" and a != "x")
    assert e.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"{command}: error: ") and lines[0].endswith(f"(see {command} --help)"), lines


def test_a_directory_as_model_says_it_is_a_directory(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"")
    out = _run("generate", "-m", str(tmp_path), "hi")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "is a directory" in out.stderr and f"-m {tmp_path / 'm.gguf'}" in out.stderr
    assert "not found" not in out.stderr
