"""llama-server's two line rules for code completion: `n_indent` and `t_max_predict_ms`.

Editor plugins (llama.vim, and others built like it) send both with every fill-in-the-middle request: the
indentation of the cursor's line as `n_indent`, so that the completion ends where the code would
leave that block, and a time budget after which the completion ends at the next line break.
The rules are llama-server's `process_token` (tools/server/server-context.cpp), kept to the letter
because a plugin's display depends on exactly where the text ends:

- `n_indent` > 0: once a line break has been sent, each token checks the line that starts after the
  line break last found (`last_nl`), and then moves `last_nl` past the next line break in the text
  (one a token, so the check trails the text by a line: a token "\\n\\n" followed by "def" is cut at
  the empty line). A line with a character other than ' ' or '\\t' after fewer than `n_indent` of
  them ends the generation ("limit"), and the text is cut where that character starts (the line
  break and the indentation stay). The tokens are not cut, and neither is what a stream has
  already sent: llama-server sends each token's text before it checks, so only the whole answer
  loses the cut text (`FinalEvent.cut`).
- `t_max_predict_ms` > 0: a token whose sent text holds a line break ends the generation ("limit")
  when more than that many milliseconds have passed since the first generated token.
"""

from __future__ import annotations


class LineLimits:
    """One sequence's state for the two rules. `feed` every decoded piece, then `sent` the text
    released for the client; `cut` is where the text ended by indentation is cut, None if not."""

    def __init__(self, n_indent: int, t_max_predict_ms: int) -> None:
        self.n_indent, self.t_max_ms = n_indent, t_max_predict_ms
        self.text = ""              # the generated text (llama-server's generated_text), kept for n_indent
        self.has_new_line = False   # a line break has been sent
        self.last_nl = 0            # where the line after the last line break found starts
        self.n_decoded = 0          # characters decoded (all sent by the end, unless a stop string cut them)
        self.cut: int | None = None

    @classmethod
    def of(cls, n_indent: int, t_max_predict_ms: int) -> LineLimits | None:
        return cls(n_indent, t_max_predict_ms) if n_indent > 0 or t_max_predict_ms > 0 else None

    def feed(self, piece: str) -> bool:
        """A token's decoded text. -> True when its indentation rule ends the generation."""
        self.n_decoded += len(piece)
        if self.n_indent <= 0:
            return False
        self.text += piece
        ended = False
        if self.has_new_line:
            if self.last_nl > 0:
                pos = self.last_nl
                while pos < len(self.text) and self.text[pos] in " \t":
                    pos += 1
                if pos < len(self.text) and pos - self.last_nl < self.n_indent:
                    self.text, self.cut, ended = self.text[:pos], pos, True
            nl = self.text.find("\n", self.last_nl)
            if nl >= 0:
                self.last_nl = nl + 1
        return ended

    def sent(self, text: str, generating_ms: float) -> bool:
        """The text released for the client after a token. -> True when the time rule ends the generation."""
        if "\n" not in text:
            return False
        self.has_new_line = True
        return 0 < self.t_max_ms < generating_ms

    def dropped(self) -> int:
        """Characters at the end of the sent text that the whole answer leaves out: the cut. At the
        end every decoded character has been sent (the held text is flushed), so it is counted
        from them. (A stop string at the cut's own token, or in the end token's --special text, stops
        first and nothing is dropped: postprocess.py's final_event.)"""
        return 0 if self.cut is None else max(0, self.n_decoded - self.cut)
