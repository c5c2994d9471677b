"""Every lab event (swap, refusal) is also a line in the server's own log, and every event's
`line` is one type: an int, or null when the refusal has no source line (a numeric one)."""

from __future__ import annotations

import json
import logging

import pytest
from tiny_gguf import write_tiny_gguf

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from lab_fixtures import RMS_NORM_VARIANT, lab_dirs

# the variant with its cpu wrong on purpose: twice the right answer
WRONG_RMS_NORM = RMS_NORM_VARIANT + "def cpu(x, weight, eps):\n    return 2 * reference(x, weight, eps)\n"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("lablog")
    k, lay = lab_dirs(root)
    bundle = ModelBundle.load(ModelConfig(model_path=write_tiny_gguf(root / "tiny.gguf"), kernels_dir=k,
                                          layouts_dir=lay))
    running = Engine(bundle, EngineConfig(n_parallel=1, ctx_size=64)).start()
    yield running
    running.stop()


def lab_lines(caplog, engine) -> list[logging.LogRecord]:
    """This engine's lab lines: each names a file of its lab folder. (Another module's engine
    stopping in the background may log a refusal of its own meanwhile.)"""
    root = str(engine.bundle.config.kernels_dir.parent)
    return [r for r in caplog.records if r.name == "slotserver.lab" and root in r.getMessage()]


def test_a_numeric_refusal_is_logged_and_its_line_is_null(engine, caplog, tmp_path):
    kfile = engine.bundle.config.kernels_dir / "rms_norm.py"
    original = kfile.read_text()
    caplog.set_level(logging.INFO, logger="slotserver.lab")
    try:
        kfile.write_text(WRONG_RMS_NORM)
        event = engine.lab.reload(str(kfile)).result(timeout=120)
    finally:
        kfile.write_text(original)
    assert event["result"] == "refused" and "wrong numerics" in event["reason"], event
    assert "line" in event and event["line"] is None
    [record] = lab_lines(caplog, engine)
    assert record.levelno == logging.WARNING
    text = record.getMessage()
    assert text.startswith("lab: refused kernel rms_norm") and "wrong numerics" in text and str(kfile) in text


def test_a_syntax_error_carries_an_int_line_and_is_logged_at_it(engine, caplog):
    kfile = engine.bundle.config.kernels_dir / "rms_norm.py"
    original = kfile.read_text()
    caplog.set_level(logging.INFO, logger="slotserver.lab")
    try:
        kfile.write_text("def broken(:\n")
        event = engine.lab.reload(str(kfile)).result(timeout=120)
    finally:
        kfile.write_text(original)
    assert event["result"] == "refused" and event["line"] == 1, event
    assert f"{kfile}:1" in lab_lines(caplog, engine)[-1].getMessage()


def test_a_layout_swap_is_logged(engine, caplog):
    caplog.set_level(logging.INFO, logger="slotserver.lab")
    current = engine.lab.snapshot()["layout"]["name"]
    target = "seq_head_dim" if current != "seq_head_dim" else "head_seq_dim"
    event = engine.lab.switch_layout(target).result(timeout=120)
    assert event["result"] == "swapped", event
    [record] = lab_lines(caplog, engine)
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith(f"lab: swapped layout {target} version ")


def test_every_event_line_is_an_int_or_null(engine):
    events = json.loads(json.dumps(engine.lab.events_since(0)))
    assert events and all(type(e["line"]) in (int, type(None)) for e in events), events
