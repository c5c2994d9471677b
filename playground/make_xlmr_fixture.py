"""Make tests/fixtures/bert/tiny-xlmr.gguf/.json: a tiny XLM-RoBERTa-style encoder (bge-m3,
bge-reranker-v2-m3: arch `bert`, a SentencePiece unigram vocabulary, `tokenizer.ggml.model` "t5")
and llama-server's answers on it.

    PYTHONPATH=<sentencepiece's dir> .venv/bin/python playground/make_xlmr_fixture.py

The vocabulary is a unigram model that sentencepiece trains here on a small multilingual text
(`nmt_nfkc` normalization: a real precompiled charsmap; dummy prefix, extra whitespace removed, as
XLM-R's own model), laid out as llama.cpp's converter lays out XLM-R's (conversion/bert.py:
`<s> <pad> </s> <unk>` first, scores and types from the model). The weights are
make_bert_fixture.py's (every bias, the classifier head: a reranker). `tiny-xlmr.json` has
llama-server's /tokenize of tricky texts, /embeddings (mean, cls) and /rerank.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as spm_model

sys.path.insert(0, str(Path(__file__).parent))
from make_bert_fixture import OUT, _rounded, encoder_writer, finish, llama_server, tensors  # noqa: E402
from local_server import post  # noqa: E402

CORPUS = ("the quick brown fox jumps over the lazy dog. machine learning is fun. "
          "le café est très bon à paris. die straße ist schön und grün. "
          "東京は日本の首都です。 中文 测试 文本。 ＡＢＣ ｆｕｌｌ ｗｉｄｔｈ １２３. "
          "hello world, this is a test of the tokenizer with numbers 2024 and 3.14! ")
TEXTS = ["hello world", "  leading and trailing  ", "many     spaces\there", "Ｆｕｌｌ ｗｉｄｔｈ １２３",
         "café naïve résumé", "東京 中文", "emoji 🙂 unknown ✓✓ runs", "the</s>inside <s> tags",
         "ﬁ ligature and ① circled", "", "x", "machine learning is fun"]
QUERY, DOCS = "machine learning", ["learning machines", "paris est une ville", "hello world", "東京"]


def train_vocab(folder: Path) -> spm_model.ModelProto:
    text = folder / "corpus.txt"
    text.write_text("\n".join([CORPUS] * 20))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(folder / "m"), model_type="unigram",
                                   vocab_size=160, hard_vocab_limit=False, normalization_rule_name="nmt_nfkc",
                                   character_coverage=0.98, bos_id=0, pad_id=1, eos_id=2, unk_id=3,
                                   minloglevel=2)
    proto = spm_model.ModelProto()
    proto.ParseFromString((folder / "m.model").read_bytes())
    return proto


def vocab(proto: spm_model.ModelProto) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, types) as conversion/bert.py writes XLM-R's."""
    kinds = {1: gguf.TokenType.NORMAL, 2: gguf.TokenType.UNKNOWN, 3: gguf.TokenType.CONTROL,
             4: gguf.TokenType.USER_DEFINED, 5: gguf.TokenType.UNUSED, 6: gguf.TokenType.BYTE}
    pieces = list(proto.pieces)
    tokens = [p.piece for p in pieces]
    scores = [p.score for p in pieces]
    types = [int(kinds[p.type]) for p in pieces]
    return tokens, scores, types


def write(path: Path, proto: spm_model.ModelProto, seed: int = 37) -> Path:
    tokens, scores, types = vocab(proto)
    w = encoder_writer(path, "bert", "tiny-xlmr", 1e-5, gguf.PoolingType.CLS)
    w.add_classifier_output_labels(["relevant"])
    w.add_token_type_count(1)
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_add_space_prefix(proto.normalizer_spec.add_dummy_prefix)
    w.add_remove_extra_whitespaces(proto.normalizer_spec.remove_extra_whitespaces)
    w.add_precompiled_charsmap(proto.normalizer_spec.precompiled_charsmap)
    for key, tid in (("bos", 0), ("eos", 2), ("unk", 3), ("sep", 2), ("pad", 1)):
        getattr(w, f"add_{key}_token_id")(tid)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    t = tensors(np.random.default_rng(seed), len(tokens))
    t["token_types.weight"] = t["token_types.weight"][:1]
    t["cls.output.weight"], t["cls.output.bias"] = t["cls.output.weight"][:1], t["cls.output.bias"][:1]
    return finish(w, t, path)


def record(path: Path) -> dict:
    out: dict = {"texts": TEXTS, "query": QUERY, "documents": DOCS, "embeddings": {}}
    for pooling in ("cls", "mean"):
        with llama_server(path, "--embedding", "--pooling", pooling) as port:
            if pooling == "cls":
                out["tokenize"] = [post(port, "/tokenize", {"content": t, "add_special": True}, timeout_s=120)["tokens"]
                                   for t in TEXTS]
                out["tokenize_plain"] = [post(port, "/tokenize", {"content": t, "add_special": False},
                                              timeout_s=120)["tokens"] for t in TEXTS]
            texts = [t for t in TEXTS if t]
            rows = post(port, "/embeddings", {"content": texts}, timeout_s=120)
            out["embeddings"][pooling] = [r["embedding"] for r in sorted(rows, key=lambda r: r["index"])]
    with llama_server(path, "--reranking") as port:
        res = post(port, "/rerank", {"query": QUERY, "documents": DOCS}, timeout_s=120)
        out["rerank"] = {"scores": [r["relevance_score"] for r in sorted(res["results"], key=lambda r: r["index"])],
                         "prompt_tokens": res["usage"]["prompt_tokens"]}
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proto = train_vocab(Path(tmp))
    path = write(OUT / "tiny-xlmr.gguf", proto)
    print(f"{path}: {path.stat().st_size} bytes, {len(proto.pieces)} pieces, "
          f"charsmap {len(proto.normalizer_spec.precompiled_charsmap)} bytes")
    path.with_suffix(".json").write_text(json.dumps(_rounded(record(path))) + "\n")
    print(f"{path.with_suffix('.json')} written")


if __name__ == "__main__":
    main()
