"""Streamed chunks filled into templates (server/sse_template.py) are byte for byte the chunks the
formatters build and `sse.event` encodes, for any text: what a client receives does not change."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from slotserver.engine.request import FinalEvent, Request, TokenEvent
from slotserver.server import sse
from slotserver.server.formats import llama
from slotserver.server.formats.openai import OpenAIFormatter
from slotserver.server.params import CompletionJob
from slotserver.server.reasoning import ReasoningMode
from slotserver.server.sse_template import SSETemplate, hole, json_ints, json_str

AWKWARD = ["", "a", 'say "hi"\\n', "\x00\x1f\x7f", "é😀中", "\u2028\u2029", "\ud800 lone", "</think>",
           hole(0), "\\u0000", "\n\r\t"]


class FakeTokenizer:
    """token_bytes and eog_ids: all the formatters ask of a tokenizer for logprobs."""

    eog_ids = frozenset({0})

    def token_bytes(self, token: int, special: bool = True) -> bytes:
        return b"" if token == 0 and not special else f"<{token}>".encode()


def _timings() -> FinalEvent:
    return FinalEvent("none", "", False, 0, 5, 1, 2, 3.0, 4.0, 7)


def _events(n: int, timings: bool = False) -> list[TokenEvent]:
    return [TokenEvent(10 + i, "x", -0.5, ((3, -1.0), (4, -2.0)), _timings() if timings else None) for i in range(n)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(), st.sampled_from(AWKWARD)), min_size=1, max_size=3))
def test_a_filled_template_is_the_encoded_object(texts):
    obj = {"a": 1, "s": hole(0), "nested": [{"t": hole(1)}], "n": hole(2)}
    template = SSETemplate.make(obj, 3)
    ids = [len(t) for t in texts]
    filled = template.fill(json_str(texts[0]), json_str(texts[-1]), json_ints(ids))
    assert filled == sse.event({"a": 1, "s": texts[0], "nested": [{"t": texts[-1]}], "n": ids})


def test_a_template_whose_marker_appears_twice_is_not_made():
    assert SSETemplate.make({"model": hole(0), "x": hole(0)}, 1) is None
    assert SSETemplate.make({"x": "no hole here"}, 1) is None


def _openai_pair(chat: bool, **job) -> tuple[OpenAIFormatter, OpenAIFormatter]:
    j = CompletionJob(Request((1, 2)), stream=True, **job)
    a = OpenAIFormatter(j, 'model "q"', FakeTokenizer(), chat, None, ReasoningMode("deepseek"))
    b = a.sibling(j)
    return a, b


def test_openai_stream_events_equal_the_encoded_stream_pieces():
    """Chat and legacy completions; plain deltas, reasoning deltas, logprobs, timings_per_token."""
    cases = [dict(), dict(want_logprobs=True, n_probs=2)]
    for chat in (True, False):
        for job in cases:
            for timings in (False, True):
                a, b = _openai_pair(chat, **job)
                pieces = ["<think>", "why", "</think>", *AWKWARD, "end"]
                for k, text in enumerate(pieces):
                    events = _events(1 + k % 2, timings)
                    got = a.stream_events(text, events, final=k == len(pieces) - 1)
                    want = [sse.event(c) for c in b.stream_pieces(text, events, final=k == len(pieces) - 1)]
                    assert got == want, (chat, job, timings, text)


def test_openai_plain_delta_is_what_a_client_parses():
    a, _ = _openai_pair(True)
    [event] = a.stream_events('tricky "é"\n', _events(1))
    chunk = json.loads(event.removeprefix(b"data: "))
    assert chunk["object"] == "chat.completion.chunk" and chunk["model"] == 'model "q"'
    assert chunk["choices"] == [{"index": 0, "logprobs": None, "finish_reason": None, "delta": {"content": 'tricky "é"\n'}}]


def test_llama_stream_events_equal_the_encoded_stream_chunks():
    tok = FakeTokenizer()
    for n_probs in (0, 2):
        job = CompletionJob(Request((5, 6, 7)), stream=True, n_probs=n_probs, index=3)
        stream = llama.StreamEvents(job, tok)
        for k, text in enumerate(AWKWARD):
            for timings in (False, True):
                events = _events(k % 3, timings)
                want = sse.event(llama.stream_chunk(job, text, events, tok, k + 1))
                assert stream.event(text, events, k + 1) == want, (n_probs, text, timings)
