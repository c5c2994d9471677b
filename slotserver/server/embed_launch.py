"""Loading an embedding-only server's model (launch.py's `load` hands over here with `--embedding`).

The model thread loads the `Embedder` (a BERT encoder, or a decoder's hidden states), publishes an
`EmbedWorker` in the server state (from then on `/health` says ok), prints the summary line and
returns the worker, whose `run` the model thread then runs in place of the engine loop. No slot
engine and no KV cache are made: an embedding server computes no completions (state.py answers
those routes 501, as a server started with `--embedding` should).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from slotserver.server.embed_worker import EmbedWorker
from slotserver.server.state import ServerState

if TYPE_CHECKING:
    from slotserver.server.launch import LaunchPlan


def load_embedder(state: ServerState, plan: "LaunchPlan", address: str) -> EmbedWorker:
    """Load, publish and announce; -> the worker, not yet running."""
    from slotserver.model.encoder.embedder import Embedder
    from slotserver.model.progress import stage

    config = state.config.embedding
    assert config is not None, "load_embedder needs an embedding server's config"
    name = plan.model.model_path.name
    if plan.check_tensors:
        from slotserver.model.gguf_file import GGUFFile

        with stage("checking every tensor's data for NaN/inf (--check-tensors)", "tensor data checked"):
            GGUFFile.open(plan.model.model_path).check_tensors()
    with stage(f"loading {name} for embeddings", f"loaded {name}"):
        embedder = Embedder.load(plan.model, config.pooling)
    embedder.max_batch_tokens = config.max_batch_tokens
    if plan.warmup:   # the math libraries' first-call set-up, before /health says ok (as llama-server)
        with stage("warming up (--no-warmup skips it)", "warmed up"):
            embedder.run([embedder.tokenizer.encode("warm up", True, False) or [0]])
    worker = EmbedWorker(embedder, config)
    state.embedder = worker
    what = "reranking" if config.rank else "embeddings"
    print(f"slotserver: {name} ({embedder.arch}, {what}, pooling {embedder.pooling}, {embedder.dims} dims, "
          f"inputs up to {worker.max_tokens} tokens), listening on {address}", file=sys.stderr, flush=True)
    return worker
