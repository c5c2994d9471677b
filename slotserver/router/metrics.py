"""GET /metrics of a router: every loaded model's metrics in one exposition, labelled `model="NAME"`.

Each child keeps its own metrics (its server's /metrics: llama-server's `llamacpp:*` names and
`slotserver_*`); `/metrics?model=NAME` is that child's, proxied. Without `?model`, the router asks
every loaded model and merges the texts by family: one HELP/TYPE per family, then each model's
samples with a `model` label, so one scrape sees all models and a dashboard can split by model.
(llama-server's router answers 400 without `?model`.) Text-based on purpose: the children's
exposition is hand-written with llama-server's exact names, which prometheus_client's parser and
writer would rename (`x_total` counters).
"""

from __future__ import annotations

import asyncio

import httpx

from slotserver.router.instance import Instance


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def labelled(sample: str, model: str) -> str:
    """`name{a="b"} 1` -> `name{model="m",a="b"} 1`; `name 1` -> `name{model="m"} 1`."""
    label = f'model="{_escape(model)}"'
    name, brace, rest = sample.partition("{")
    if brace:
        return f"{name}{{{label}{',' if not rest.startswith('}') else ''}{rest}"
    name, _, value = sample.partition(" ")
    return f"{name}{{{label}}} {value}"


def merge(texts: dict[str, str]) -> str:
    """{model: its exposition text} -> one text, families kept together."""
    families: dict[str, tuple[list[str], list[str]]] = {}
    for model, text in texts.items():
        family = ""
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split()[2]
                meta, _ = families.setdefault(family, ([], []))
                if line not in meta:
                    meta.append(line)
            elif line.strip() and not line.startswith("#"):
                families.setdefault(family, ([], []))[1].append(labelled(line, model))
    return "".join("\n".join(meta + samples) + "\n" for meta, samples in families.values())


async def scrape(client: httpx.AsyncClient, instances: dict[str, Instance]) -> str:
    async def one(inst: Instance) -> tuple[str, str]:
        try:
            r = await client.get(inst.child.url + "/metrics", headers=inst.child.auth, timeout=10.0) \
                if inst.child else None
            return inst.name, r.text if r is not None and r.status_code == 200 else ""
        except httpx.HTTPError:
            return inst.name, ""   # exited meanwhile: it has no metrics any more
    ready = [i for i in instances.values() if i.ready]
    return merge(dict(await asyncio.gather(*(one(i) for i in ready))))
