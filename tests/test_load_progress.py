"""What loading tells the user: each stage of `serve`'s start-up (reading the file, the weights,
warming up, the KV cache) is a log line, so a server whose stderr is a file or a journal is not
silent for seconds; and the terminal's progress bar never shows `0/None`."""

from __future__ import annotations

import io
import logging
import sys

from tiny_gguf import write_tiny_gguf

from slotserver.engine.config import EngineConfig
from slotserver.model.config import ModelConfig
from slotserver.model.progress import load_progress
from slotserver.server.launch import LaunchPlan, load
from slotserver.server.state import ServerState


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_serve_logs_each_load_stage_as_a_line(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())   # not a terminal: no bar, the lines are all there is
    plan = LaunchPlan(ModelConfig(write_tiny_gguf(tmp_path / "tiny.gguf")), EngineConfig(n_parallel=2, ctx_size=64),
                      watch=False)
    caplog.set_level(logging.INFO, logger="slotserver.load")
    state = ServerState()
    load(state, plan, "http://test")
    assert state.ready
    lines = [r.getMessage() for r in caplog.records if r.name == "slotserver.load"]
    expected = ["loading tiny.gguf...", "tiny.gguf: llama, ", "reading weights (", "weights read in ",
                "loaded tiny.gguf in ", "warming up: ", "warmed up in ", "allocating the KV cache (2 slots x 32 cells)",
                "KV cache allocated in "]
    assert len(lines) == len(expected) and all(line.startswith(want) for line, want in zip(lines, expected)), lines


def test_no_warmup_logs_no_warmup_stage(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    plan = LaunchPlan(ModelConfig(write_tiny_gguf(tmp_path / "tiny.gguf")), EngineConfig(n_parallel=1, ctx_size=32),
                      watch=False, warmup=False)
    caplog.set_level(logging.INFO, logger="slotserver.load")
    load(ServerState(), plan, "http://test")
    assert not any("warm" in r.getMessage() for r in caplog.records)


def test_the_bar_shows_no_count_until_the_total_is_known(monkeypatch):
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    handler = logging.StreamHandler(terminal)
    logging.getLogger().addHandler(handler)
    try:
        with load_progress("loading tiny.gguf") as tick:
            assert handler.stream is not terminal          # log lines go above the bar meanwhile
            logging.getLogger("slotserver.load").warning("a stage line")
            tick(3, 10)
        assert handler.stream is terminal                  # and straight to stderr again after
    finally:
        logging.getLogger().removeHandler(handler)
    shown = terminal.getvalue()
    assert "loading tiny.gguf" in shown and "3/10" in shown and "a stage line" in shown
    assert "None" not in shown, shown
