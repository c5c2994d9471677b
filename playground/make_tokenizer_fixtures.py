"""Make tests/fixtures/tokenizers/: real vocabularies and llama.cpp's token ids for a text corpus.

Run once (it needs the llama.cpp peer build; the tests only read what it writes):

    .venv/bin/python playground/make_tokenizer_fixtures.py [--gemma PATH] [--check-only]

Vocabularies (`VOCABS`): gemma3 (taken from the real gemma-3-270m Q4_K_M file: every key/value,
no tensors), llama-spm (llama 2), phi-3 and qwen2 (llama.cpp's own vocab-only test files,
models/ggml-vocab-*.gguf). Each is written xz-compressed as `<name>.gguf.xz` (the tests
decompress it), and `llama-tokenize` runs on exactly that file for every text of `corpus()`:

- `ids`: `llama-tokenize --no-parse-special` (BOS added when the model asks for it),
- `ids_parse_special`: `llama-tokenize --no-bos` (special-token text becomes the token).

`--check-only` writes nothing and compares slotserver's tokenizer with llama-tokenize on more of
llama.cpp's vocab files (`EXTRA`), printing the rows that differ.
"""

from __future__ import annotations

import argparse
import json
import lzma
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gguf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from slotserver.model.gguf_file import GGUFFile  # noqa: E402
from slotserver.model.text.tokenizer import Tokenizer  # noqa: E402

sys.path.insert(0, str(ROOT / "playground"))
from local_server import LLAMA_CPP  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "tokenizers"
GEMMA = Path("/tmp/gemma-3-270m-q4_k_m.gguf")
REFERENCE = "llama-tokenize of llama.cpp as vendored in llama-cpp-python 0.3.36 (CPU build)"
VOCABS = ("gemma3", "llama-spm", "phi-3", "qwen2", "minicpm5")
EXTRA = ("llama-bpe", "qwen35", "gpt-2", "starcoder", "refact", "falcon", "mpt", "command-r",
         "deepseek-coder", "deepseek-llm", "gpt-neox", "aquila", "baichuan")

_SPECIAL_TEXTS = [
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<bos><bos>text<eos>", "<pad><mask>[multimodal]<unused0><unused6241>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "<|endoftext|>after", "<|fim_prefix|>def f(<|fim_suffix|>)<|fim_middle|>",
    "<s>[INST] hi [/INST] hello</s>", "<unk>x</s>y<s>",
    "<|user|>\nhi<|end|>\n<|assistant|>\nyo<|end|>", "<|user|>   \n  spaced <|end|>  \n\n<|assistant|>",
    "<|system|>\tx<|end|>\t", "text<|end|>", "</s> and <s> as text", "<table><tr><td>1</td></tr></table>",
    "<b>bold</b> <i>it</i> <code>x = 1</code> <start_of_image>",
]


_LONG = ("Tokenizers split text into pieces a model has seen in training. " * 8 + "\n\n" +
         "Ein Tokenizer zerlegt Text; 分词器把文本切成片段；トークナイザーは文章を分割する。 " * 4 +
         "\n```python\nfor i in range(10):\n    print(f'{i:>4} -> {i * i}')\n```\n" * 3)


def corpus() -> list[str]:
    """Texts that exercise what tokenizers get wrong: whitespace runs, byte fallback, digits,
    contractions, scripts without spaces, emoji sequences, code, and special-token text."""
    texts = [
        "", "Hello world", " Hello world", "Hello World!", "hello  world", " ", "  ", "   ",
        "\t", "\n", "\n\n", "\n\n\n", "\t\n", " \n \n\t\n", "a  b   c    d", " " * 40, "\n" * 70,
        "\t" * 35, "line1\nline2\r\nline3\rline4", "   leading", "trailing   ", "x \n y",
        "1", "12", "123", "1234567890", "3.14159", "1,000,000", "in 2024 there were 365 days",
        "٣٤٥ ١٢", "१२३", "½ ¾ ⅞", "3333", "333333333",
        "Äpfel", "naïve café résumé", "Привет мир", "нещо на Български", "日本語のテキスト",
        "中文测试", "한국어 텍스트", "مرحبا بالعالم", "שלום", "ελληνικά", "हिन्दी", "ไทย",
        "កាន់តែពិសេសអាចខលចេញ", "Cửa Việt", "e\u0301 vs é", "a\u200db", "🦙🚀👨‍👩‍👧‍👦", "🏳️‍🌈 ✅",
        "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ (only emoji that has its own token)",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\u2581 lower one-eighth block \u2581\u2581", "\ue000\uffff", "ᐊᐃᐅ",
        " this is 🦙.cpp", "w048 7tuijk dsdfhu", "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～",
        "I'm don't you're we've they'll it's She'D", "'s 't ''' \"quoted\"", "(", "\n =", "' era",
        "!!!!!!", "...", " discards", "   Hello\n    Hello",
        "def f(x):\n    return x ** 2  # square\n\n\nprint(f(3))\n",
        "int main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v[0] != 0 ? 1 : 0;\n}\n",
        '{"key": [1, 2.5, null, true], "nested": {"a": "b\\n"}}',
        "## Title\n- item **bold** `code` [link](https://example.com/a?b=c&d=e)\n",
        "email@example.com a|b\\d+ $PATH C:\\Users\\x",
        "The quick brown fox jumps over the lazy dog. " * 3
        + "Numbers 1 22 333 4444, symbols @#$%^&*()_+-=[]{};':\",./<>?~` and tabs\tand\nnewlines.",
        _LONG,
    ]
    return texts + _SPECIAL_TEXTS


def llama_tokenize(vocab: Path, text: str, parse_special: bool, bos: bool) -> list[int]:
    args = [str(LLAMA_CPP / "build/bin/llama-tokenize"), "-m", str(vocab), "--stdin", "--ids",
            "--log-disable", "--no-escape"]
    args += [] if parse_special else ["--no-parse-special"]
    args += [] if bos else ["--no-bos"]
    out = subprocess.run(args, input=text.encode(), capture_output=True, check=True,
                         env={"LD_LIBRARY_PATH": str(LLAMA_CPP / "build/bin")}).stdout.decode()
    return json.loads([line for line in out.splitlines() if line.startswith("[")][-1])


def vocab_only(src: Path, dst: Path) -> None:
    """Every key/value of `src` (its tokenizer and hyper-parameters), none of its tensors."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# vocab files llama.cpp has none of: another vocab file with its pre-tokenizer renamed, so llama-tokenize
# and slotserver split its texts by that pre-tokenizer's rules (MiniCPM5's: digits in threes first,
# where qwen2's split them one by one); only `<name>.json` is written, the tests rename the pre
# of `<source>.gguf.xz` themselves (tests/tokenizer_fixtures.py RENAMED)
RENAMED_PRE = {"minicpm5": "qwen2"}


def source(name: str, gemma: Path, workdir: Path) -> Path:
    """The vocab-only GGUF for `name` (made from the gemma file for gemma3)."""
    if name in RENAMED_PRE:
        sys.path.insert(0, str(ROOT / "tests"))
        from gguf_rewrite import rewrite
        return rewrite(LLAMA_CPP / "models" / f"ggml-vocab-{RENAMED_PRE[name]}.gguf", workdir / f"{name}.gguf",
                       {"tokenizer.ggml.pre": (name, gguf.GGUFValueType.STRING)})
    if name != "gemma3":
        return LLAMA_CPP / "models" / f"ggml-vocab-{name}.gguf"
    path = workdir / "gemma3.gguf"
    vocab_only(gemma, path)
    return path


def rows_for(vocab: Path) -> list[dict]:
    rows = []
    for text in corpus():
        rows.append({"text": text, "ids": llama_tokenize(vocab, text, False, True),
                     "ids_parse_special": llama_tokenize(vocab, text, True, False)})
    return rows


def write_fixture(name: str, vocab: Path) -> None:
    data = vocab.read_bytes()
    if name not in RENAMED_PRE:
        (OUT / f"{name}.gguf.xz").write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    start = time.perf_counter()
    rows = rows_for(vocab)
    (OUT / f"{name}.json").write_text(dump(name, rows))
    print(f"{name}: {len(data) / 1e6:.2f} MB vocab, {len(rows)} rows in "
          f"{time.perf_counter() - start:.0f} s")


def dump(name: str, rows: list[dict]) -> str:
    """The fixture JSON, one row per line (readable diffs)."""
    head = json.dumps({"vocab": f"{name}.gguf.xz", "reference": REFERENCE})[:-1]
    lines = ",\n".join(json.dumps(row, ensure_ascii=False) for row in rows)
    return f'{head}, "rows": [\n{lines}\n]}}\n'


def check(name: str, vocab: Path) -> None:
    """Compare slotserver with llama-tokenize on one vocab file, printing differing rows."""
    try:
        tok = Tokenizer.from_metadata(GGUFFile.open(vocab).metadata)
    except Exception as exc:  # an unsupported tokenizer is a result too
        print(f"{name}: not loaded: {exc}")
        return
    bad = 0
    for row in rows_for(vocab):
        mine = (tok.encode(row["text"]), tok.encode(row["text"], False, True))
        if mine != (row["ids"], row["ids_parse_special"]):
            bad += 1
            print(f"  {name} differs on {row['text']!r}: {mine} vs {row['ids']}, "
                  f"{row['ids_parse_special']}")
    print(f"{name}: {len(corpus()) - bad}/{len(corpus())} texts identical")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gemma", type=Path, default=GEMMA, help="gemma-3-270m GGUF")
    parser.add_argument("--check-only", action="store_true")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.check_only:
            for name in args.names or VOCABS + EXTRA:
                check(name, source(name, args.gemma, Path(tmp)))
            return
        OUT.mkdir(parents=True, exist_ok=True)
        for name in args.names or VOCABS:
            write_fixture(name, source(name, args.gemma, Path(tmp)))


if __name__ == "__main__":
    main()
