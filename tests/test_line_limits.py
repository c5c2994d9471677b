"""llama-server's line rules (engine/line_limits.py), token by token: where `n_indent` ends a
completion and cuts its text, the check trailing the text by a line, and `t_max_predict_ms`
ending only on a line break."""

from __future__ import annotations

from slotserver.engine.line_limits import LineLimits


def run(pieces: list[str], n_indent: int = 0, t_max: int = 0, ms: float = 0.0) -> tuple[int, str, int]:
    """-> (tokens taken before the stop, or len(pieces); the whole answer; characters sent)."""
    lines = LineLimits(n_indent, t_max)
    sent = ""
    for i, piece in enumerate(pieces):
        cut = lines.feed(piece)
        sent += piece
        timed = lines.sent(piece, ms)
        if cut or timed:
            return i + 1, sent[:len(sent) - lines.dropped()], len(sent)
    return len(pieces), sent, len(sent)


def test_a_line_indented_less_than_n_indent_ends_the_text_where_its_code_starts():
    pieces = ["foo()", "\n", "    bar", "\n", "baz", "()"]
    # "baz" starts a line with 0 < 4 spaces: the stop comes with that token, the text keeps its line break
    assert run(pieces, n_indent=4) == (5, "foo()\n    bar\n", 17)
    assert run(pieces, n_indent=2)[:2] == (5, "foo()\n    bar\n")
    assert run(pieces, n_indent=0) == (6, "foo()\n    bar\nbaz()", 19)


def test_the_indentation_kept_is_the_cut_lines_own():
    assert run(["a", "\n", "      b", "\n", "  c", "d"], n_indent=4)[1] == "a\n      b\n  "


def test_the_check_trails_by_a_line_so_an_empty_line_ends_the_text():
    # the token after "\n\n" moves the check to the empty line, the next one stops there (llama-server)
    assert run(["x", "\n\n", "    y", "z"], n_indent=2) == (4, "x\n", 9)


def test_tabs_count_as_one_character_of_indentation():
    assert run(["if x:", "\n", "\t\tgo", "\n", "\tback"], n_indent=2)[1] == "if x:\n\t\tgo\n\t"


def test_the_first_line_is_never_checked():
    assert run(["b = 1", " + 2"], n_indent=8) == (2, "b = 1 + 2", 9)


def test_the_time_limit_ends_on_a_line_break_only():
    assert run(["a", "b", "\n", "c"], t_max=100, ms=150.0) == (3, "ab\n", 3)
    assert run(["a", "b", "\n", "c"], t_max=100, ms=50.0) == (4, "ab\nc", 4)
    assert run(["a", "b", "c"], t_max=100, ms=150.0)[0] == 3
    assert LineLimits.of(0, -1) is None and LineLimits.of(0, 0) is None and LineLimits.of(3, -1) is not None
