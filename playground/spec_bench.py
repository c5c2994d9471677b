"""Issue 37's speculation benchmark, side by side: slotserver and llama-server, with and without
speculative decoding, same model, same requests, concurrency 1.

Code edit: the model is asked to rewrite a ~1k-token Python function with two small changes
(rename a variable, add a comment), greedy, up to --n-predict tokens or EOS: an answer that
mostly repeats its prompt, what n-gram drafting is for. Decode speed is the server's own
`timings.predicted_per_second`. Plain chat: short questions, ~200-token greedy answers, where
drafts mostly miss and speculation must cost next to nothing. Each chat question is asked once:
ngram-mod's table is shared by all requests (as llama.cpp's), so a repeated question is drafted
from its own earlier answer (100% accepted, 2-3x faster: not plain chat any more). The code edit
is repeated; there ngram-mod's second pass accepts a little more (931 vs 908 of ~1000 drafted).

Every server stays up the whole run (an idle one costs nothing) and each repetition sends the
same request to each of them in turn, starting one further along the list each time, so a slow
spell of this noisy machine hits all alike; the table shows medians. Greedy output must not depend
on speculation: each server's answers are compared with its no-speculation twin's and printed.

    .venv/bin/python playground/spec_bench.py [--reps 3] [--chat-questions 6] [--model F.gguf]
    .venv/bin/python playground/spec_bench.py --slot-spec "ngram-simple" \\
        --slot-spec "ngram-simple --spec-ngram-simple-size-n 8 --spec-ngram-simple-size-m 32"
        (each --slot-spec is one more slotserver: --spec-type's value, then any more flags)

Default model: Qwen2.5-Coder-0.5B (SLOTSERVER_MODELS/qwen/model.gguf) when present, else the
embedded SmolLM2-135M. Needs the llama.cpp peer (playground/local_server.py says where).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_server import MODELS, PEER, free_port, post, wait_healthy  # noqa: E402

FUNCTION = '''def summarize_orders(orders, customers, products, start_date=None, end_date=None, currency="USD",
                     exchange_rates=None, min_total=0.0, include_refunds=False, group_by="customer"):
    """Aggregate a list of orders into per-group totals, with optional date filtering,
    currency conversion, refunds handling and a minimum total threshold."""
    if exchange_rates is None:
        exchange_rates = {"USD": 1.0}
    if group_by not in ("customer", "product", "month", "country"):
        raise ValueError(f"unknown group_by: {group_by}")
    customer_index = {}
    for customer in customers:
        customer_index[customer["id"]] = customer
    product_index = {}
    for product in products:
        product_index[product["sku"]] = product
    groups = {}
    skipped = []
    for order in orders:
        order_date = order.get("date")
        if start_date is not None and order_date < start_date:
            skipped.append((order["id"], "before start"))
            continue
        if end_date is not None and order_date > end_date:
            skipped.append((order["id"], "after end"))
            continue
        if order.get("status") == "refunded" and not include_refunds:
            skipped.append((order["id"], "refunded"))
            continue
        customer = customer_index.get(order["customer_id"])
        if customer is None:
            skipped.append((order["id"], "unknown customer"))
            continue
        rate = exchange_rates.get(order.get("currency", "USD"))
        if rate is None:
            skipped.append((order["id"], "unknown currency"))
            continue
        target_rate = exchange_rates.get(currency, 1.0)
        order_total = 0.0
        item_count = 0
        for item in order.get("items", []):
            product = product_index.get(item["sku"])
            if product is None:
                skipped.append((order["id"], "unknown product " + item["sku"]))
                continue
            quantity = item.get("quantity", 1)
            unit_price = item.get("unit_price", product["price"])
            discount = item.get("discount", 0.0)
            line_total = quantity * unit_price * (1.0 - discount)
            if order.get("status") == "refunded":
                line_total = -line_total
            order_total += line_total * rate / target_rate
            item_count += quantity
            if group_by == "product":
                key = product["sku"]
                entry = groups.setdefault(key, {"total": 0.0, "count": 0, "orders": set()})
                entry["total"] += line_total * rate / target_rate
                entry["count"] += quantity
                entry["orders"].add(order["id"])
        shipping = order.get("shipping", 0.0) * rate / target_rate
        tax = order.get("tax", 0.0) * rate / target_rate
        order_total += shipping + tax
        if group_by == "customer":
            key = customer["id"]
        elif group_by == "month":
            key = order_date[:7]
        elif group_by == "country":
            key = customer.get("country", "unknown")
        else:
            continue
        entry = groups.setdefault(key, {"total": 0.0, "count": 0, "orders": set()})
        entry["total"] += order_total
        entry["count"] += item_count
        entry["orders"].add(order["id"])
    result = []
    for key, entry in groups.items():
        if entry["total"] < min_total:
            continue
        average = entry["total"] / len(entry["orders"]) if entry["orders"] else 0.0
        result.append({
            "key": key,
            "total": round(entry["total"], 2),
            "items": entry["count"],
            "orders": len(entry["orders"]),
            "average_order": round(average, 2),
            "currency": currency,
        })
    result.sort(key=lambda row: row["total"], reverse=True)
    grand_total = sum(row["total"] for row in result)
    for row in result:
        row["share"] = round(row["total"] / grand_total, 4) if grand_total else 0.0
    return {"groups": result, "grand_total": round(grand_total, 2), "skipped": skipped}
'''

EDIT_ASK = ("Rewrite this function with two small changes: rename the variable `order_total` to `running_total` "
            "everywhere, and add a one-line comment above the `for order in orders:` loop. Keep everything else "
            "exactly the same. Output the whole function in one ```python block and nothing else.")

CHAT = ("What are three good habits for staying healthy while working at a desk all day?",
        "Explain in simple words how a rainbow forms.",
        "Give me a short plan for learning to cook basic meals in a month.",
        "Why do cats purr? Give a few possible reasons.",
        "What should I pack for a three-day hiking trip?",
        "Describe the water cycle for a ten-year-old.")

DEFAULT_SLOT_SPECS = (
    "ngram-simple",
    "ngram-simple --spec-ngram-simple-size-n 12 --spec-ngram-simple-size-m 64",
    "ngram-mod",
    "ngram-mod --spec-ngram-mod-n-match 16 --spec-ngram-mod-n-min 32 --spec-ngram-mod-n-max 96",
)


@dataclass
class Server:
    name: str            # as the table shows it
    family: str          # "slotserver" or "llama-server": whose no-spec twin its output must match
    spec: bool
    cmd: list[str]
    port: int = 0
    proc: subprocess.Popen | None = None
    runs: dict[str, list[dict]] = field(default_factory=dict)   # workload -> one record per request


def spec_label(spec: str) -> str:
    """'ngram-mod --spec-ngram-mod-n-match 16 ...' -> 'ngram-mod 16/...': the type and its sizes."""
    words = shlex.split(spec)
    sizes = [w for w in words[1:] if not w.startswith("-")]
    return words[0] + (" " + "/".join(sizes) if sizes else "")


def build_servers(a: argparse.Namespace) -> list[Server]:
    """slotserver without and with each --slot-spec, llama-server without and with --peer-spec."""
    common = ["-m", a.model, "-np", "1", "-c", str(a.ctx), "-t", str(a.threads)]
    slot = [sys.executable, "-m", "slotserver.cli.main", "serve", *common, "--no-watch", "--metrics",
            *shlex.split(a.slot_flags)]
    peer = [str(PEER / "llama-server"), *common, "--metrics"]
    servers = [Server("slotserver", "slotserver", False, slot)]
    for s in a.slot_spec or DEFAULT_SLOT_SPECS:
        flags = [*slot, "--spec-type", *shlex.split(s)]
        servers.append(Server(f"slotserver {spec_label(s)}", "slotserver", True, flags))
    servers.append(Server("llama-server", "llama-server", False, peer))
    if a.peer_spec:
        label = spec_label(shlex.split(a.peer_spec)[1] if a.peer_spec.startswith("--spec-type") else a.peer_spec)
        servers.append(Server(f"llama-server {label}", "llama-server", True, [*peer, *shlex.split(a.peer_spec)]))
    return servers


def start_all(servers: list[Server], out: Path) -> None:
    """Start every server, then wait until each answers /health (they load side by side)."""
    for s in servers:
        s.port = free_port()
        log = (out / (s.name.replace(" ", "_").replace("/", "-") + ".log")).open("w")
        s.proc = subprocess.Popen([*s.cmd, "--port", str(s.port)], stdout=log, stderr=subprocess.STDOUT)
    for s in servers:
        wait_healthy(s.port, s.name, s.proc, timeout_s=600)


def stop_all(servers: list[Server]) -> None:
    for s in servers:
        if s.proc is not None and s.proc.poll() is None:
            s.proc.terminate()
            s.proc.wait()


def ask(s: Server, messages: list[dict], max_tokens: int) -> dict:
    """One greedy chat completion -> its record: decode tok/s, tokens, drafted/accepted, the text."""
    r = post(s.port, "/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
                                              "cache_prompt": True}, timeout_s=3600)
    t = r["timings"]
    return {"tps": float(t["predicted_per_second"]), "n": int(t["predicted_n"]), "ms": float(t["predicted_ms"]),
            "draft_n": int(t.get("draft_n", 0)), "accepted": int(t.get("draft_n_accepted", 0)),
            "text": r["choices"][0]["message"]["content"], "finish": r["choices"][0]["finish_reason"]}


def round_robin(servers: list[Server], workload: str, jobs: list[tuple[list[dict], int]], reps: int) -> None:
    """Each job (messages, max_tokens) `reps` times on every server, one server after another,
    the starting server moving one along each time; records go to server.runs[workload]."""
    k = 0
    for rep in range(reps):
        for j, (messages, max_tokens) in enumerate(jobs):
            for i in range(len(servers)):
                s = servers[(k + i) % len(servers)]
                rec = ask(s, messages, max_tokens)
                rec.update(rep=rep, job=j)
                s.runs.setdefault(workload, []).append(rec)
                print(f"  {workload} rep {rep + 1} job {j + 1}: {s.name:<42} {rec['tps']:7.2f} tok/s, "
                      f"{rec['n']} tokens, drafted/accepted {rec['draft_n']}/{rec['accepted']}", flush=True)
            k += 1


def median_tps(s: Server, workload: str) -> float:
    return statistics.median(r["tps"] for r in s.runs[workload])


def identical(s: Server, twin: Server, workload: str) -> bool:
    """Whether every answer of s equals its twin's to the same job (and s's own answers agree)."""
    ref = {r["job"]: r["text"] for r in twin.runs[workload]}
    return all(r["text"] == ref[r["job"]] for r in s.runs[workload])


def divergence(servers: list[Server], workload: str) -> None:
    """For each answer unlike its no-spec twin's: where the two first differ."""
    twins = {s.family: s for s in servers if not s.spec}
    for s in (s for s in servers if s.spec and not identical(s, twins[s.family], workload)):
        ref = {r["job"]: r["text"] for r in twins[s.family].runs[workload]}
        for r in (r for r in s.runs[workload] if r["text"] != ref[r["job"]]):
            a, b = r["text"], ref[r["job"]]
            i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
            print(f"  {s.name} ({workload} rep {r['rep'] + 1} job {r['job'] + 1}) differs at char {i}: "
                  f"{a[max(0, i - 30):i + 30]!r} vs no-spec {b[max(0, i - 30):i + 30]!r}")


def save(servers: list[Server], path: Path) -> None:
    path.write_text(json.dumps({s.name: s.runs for s in servers}, indent=1))


def print_table(servers: list[Server], workload: str) -> None:
    twins = {s.family: s for s in servers if not s.spec}
    print(f"\n{workload}: median decode tok/s over {len(servers[0].runs[workload])} requests each")
    print(f"{'server':<44} {'tok/s':>7} {'x no-spec':>9} {'tokens':>7} {'accepted/drafted':>17} {'greedy same':>11}")
    for s in servers:
        twin = twins[s.family]
        rs = s.runs[workload]
        drafted, acc = sum(r["draft_n"] for r in rs), sum(r["accepted"] for r in rs)
        rate = f"{acc}/{drafted} {acc / drafted:4.0%}" if drafted else "-"
        same = "yes" if identical(s, twin if s.spec else s, workload) else "NO"
        tps = median_tps(s, workload)
        print(f"{s.name:<44} {tps:7.2f} {tps / median_tps(twin, workload):9.2f} "
              f"{statistics.median(r['n'] for r in rs):7.0f} {rate:>17} {same:>11}")


def paired(s: Server, base: Server, workload: str) -> list[float]:
    """s's tok/s over base's for the same (rep, job): the ratio each round measured."""
    ref = {(r["rep"], r["job"]): r["tps"] for r in base.runs[workload]}
    return [r["tps"] / ref[(r["rep"], r["job"])] for r in s.runs[workload]]


def print_ratios(servers: list[Server], chat: bool) -> None:
    """The issue's goals: spec / no-spec >= 2x on the code edit, >= 1.5x llama-server's ngram-mod,
    chat spec / no-spec >= 0.95x. Ratios of medians, then the median of the paired per-round ratios."""
    base = next(s for s in servers if s.family == "slotserver" and not s.spec)
    peer_spec = next((s for s in servers if s.family == "llama-server" and s.spec), None)
    print("\nratios (of medians; [median of paired per-round ratios])")
    for s in (s for s in servers if s.family == "slotserver" and s.spec):
        line = [_ratio(s, base, "code edit", 2.0)]
        if peer_spec is not None:
            line.append(_ratio(s, peer_spec, "code edit", 1.5))
        if chat:
            line.append(_ratio(s, base, "chat", 0.95))
        print(f"  {s.name:<42} " + "; ".join(line))
    if peer_spec is not None:
        print(f"  {peer_spec.name:<42} " + _ratio(peer_spec, next(s for s in servers if s.name == "llama-server"),
                                                 "code edit", None))


def _ratio(s: Server, base: Server, workload: str, goal: float | None) -> str:
    r = median_tps(s, workload) / median_tps(base, workload)
    p = statistics.median(paired(s, base, workload))
    verdict = "" if goal is None else (" ok" if r >= goal else f" < goal {goal}")
    return f"{workload} vs {base.name}: {r:.2f}x [{p:.2f}x]{verdict}"


def cpu_flags() -> str:
    text = Path("/proc/cpuinfo").read_text()
    keys = ("avx2", "avx512", "amx", "avx_vnni")
    found = {w for line in text.splitlines() if line.startswith("flags") for w in line.split()
             if w.startswith(keys)}
    return " ".join(sorted(found))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    qwen = MODELS / "qwen" / "model.gguf"
    ap.add_argument("--model", default=str(qwen) if qwen.is_file() else None,
                    help="GGUF (default: Qwen2.5-Coder-0.5B when present, else the embedded default model)")
    ap.add_argument("--reps", type=int, default=3, help="code-edit requests per server")
    ap.add_argument("--chat-questions", type=int, default=len(CHAT),
                    help=f"chat: the first N of {len(CHAT)} questions, each once on every server (0: no chat)")
    ap.add_argument("--n-predict", type=int, default=1024, help="code edit: at most this many tokens")
    ap.add_argument("--chat-tokens", type=int, default=200)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slot-spec", action="append", help="one more slotserver: '--spec-type value [more flags]'")
    ap.add_argument("--peer-spec", default="--spec-type ngram-mod", help="llama-server's flags ('' : none)")
    ap.add_argument("--slot-flags", default="", help="more flags for every slotserver")
    ap.add_argument("--no-peer-chat", action="store_true", help="chat on the slotservers only")
    ap.add_argument("--out", type=Path, default=Path("playground/out/spec_bench"))
    a = ap.parse_args()
    if a.model is None:
        from slotserver.model.default_model import default_model_path
        a.model = str(default_model_path())
    return a


def main() -> None:
    a = parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    servers = build_servers(a)
    print(f"model {a.model}; -np 1 -c {a.ctx} -t {a.threads}; CPU flags: {cpu_flags()}", flush=True)
    edit = [{"role": "system", "content": "You are a careful coding assistant. Reply with code only."},
            {"role": "user", "content": f"{EDIT_ASK}\n\n```python\n{FUNCTION}```"}]
    chat_jobs = [([{"role": "user", "content": q}], a.chat_tokens) for q in CHAT[:a.chat_questions]]
    try:
        start_all(servers, a.out)
        print(f"all {len(servers)} servers up; load average {os.getloadavg()[0]:.1f}", flush=True)
        t0 = time.monotonic()
        round_robin(servers, "code edit", [(edit, a.n_predict)], a.reps)
        if chat_jobs:
            chatters = [s for s in servers if s.family == "slotserver" or not a.no_peer_chat]
            round_robin(chatters, "chat", chat_jobs, 1)
    finally:
        stop_all(servers)
    print(f"\n{(time.monotonic() - t0) / 60:.0f} min; load average now {os.getloadavg()[0]:.1f}; "
          f"CPU flags: {cpu_flags()}")
    print_table(servers, "code edit")
    if chat_jobs:
        print_table([s for s in servers if "chat" in s.runs], "chat")
    print_ratios(servers, bool(chat_jobs))
    save(servers, a.out / "runs.json")
    for w in ("code edit", "chat"):
        divergence([s for s in servers if w in s.runs], w)
    peer = next(s for s in servers if s.name == "llama-server")
    same = servers[0].runs["code edit"][0]["text"] == peer.runs["code edit"][0]["text"]
    print(f"\nslotserver's greedy code edit is {'the same as' if same else 'NOT the same as'} llama-server's "
          "(informational: two implementations may round differently)")


if __name__ == "__main__":
    main()
