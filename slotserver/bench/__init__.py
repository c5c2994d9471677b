"""`slotserver bench`: a serving benchmark with `vllm bench serve`'s semantics.

It sends streaming completion requests to a running server (slotserver, llama-server, or any
OpenAI-compatible server), timestamps every streamed chunk, and reports TTFT, TPOT, ITL and
end-to-end latency with throughputs, as vLLM does. Failed requests are counted and shown with
their messages; they never enter an average.

One concept per module:

- `config`: the validated settings (`BenchConfig`),
- `dataset`: the prompts (seeded random token ids, or a JSON file of strings),
- `sse`: server-sent-event framing, bytes in, `data` payloads out,
- `streams`: what the two wire formats (OpenAI, llama-server) mean: request bodies and chunks,
- `record`: what one request recorded (`RequestRecord`),
- `client`: one streaming request over httpx,
- `server_info`: the model name and vocabulary size, asked of the server,
- `metrics`: pure arithmetic from records to the result's numbers,
- `runner`: arrivals, concurrency, warm-up, progress,
- `report`: the console table and the JSON file.
"""
