"""What one benchmark request recorded: when it started, when each token chunk came, how it ended.

Times are `time.perf_counter()` seconds. A "token chunk" is a streamed event that carries at
least one generated token (text or token ids); events without a token (the OpenAI finish chunk
with empty text, llama-server's closing `stop: true` summary, usage-only chunks) are not token
chunks, so they never create a spurious inter-token gap.

One chunk may carry several tokens (a token whose text is held back rides with the next one).
ITLs are still per chunk, as in vLLM; token counts come from the server (`usage`,
`tokens_predicted`) when it reports them, else from the chunks' own token lists, else one token
per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    index: int
    prompt_tokens: int | None = None          # known from the dataset (token-id prompts)
    start: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int | None] = field(default_factory=list)   # tokens per chunk if known
    end: float | None = None
    reported_output: int | None = None         # server's count of generated tokens
    reported_input: int | None = None          # server's count of prompt tokens
    success: bool = False
    error: str = ""

    def add_chunk(self, t: float, n_tokens: int | None) -> None:
        self.chunk_times.append(t)
        self.chunk_tokens.append(n_tokens)

    def fail(self, message: str) -> None:
        self.success, self.error = False, message or "unknown error"

    def finish(self, t: float) -> None:
        """The stream ended properly at `t`; a stream that carried no token counts as failed."""
        self.end = t
        if not self.chunk_times:
            self.fail("the stream ended without any generated token")
        else:
            self.success = True

    @property
    def output_tokens(self) -> int:
        if self.reported_output is not None:
            return self.reported_output
        if self.chunk_tokens and all(n is not None for n in self.chunk_tokens):
            return sum(self.chunk_tokens)  # type: ignore[arg-type]
        return len(self.chunk_times)

    @property
    def input_tokens(self) -> int:
        """Server's count, else the dataset's; 0 when neither is known."""
        if self.reported_input is not None:
            return self.reported_input
        return self.prompt_tokens or 0
