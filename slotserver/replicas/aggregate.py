"""/metrics of the fleet: the replicas' Prometheus text merged into one.

Counters and histograms are summed across replicas under their own names, unlabelled by replica:
`llamacpp:prompt_tokens_total` of the fleet is the sum of the replicas', so a dashboard built for
one llama-server works unchanged on the router (and a histogram's buckets, _sum and _count add up
to the fleet's distribution). Gauges (and summaries, whose quantiles do not add) keep one sample
per replica with a `replica="host:port"` label: a KV usage ratio or a tokens/s rate summed over
replicas means nothing, and users aggregate those with sum() or avg() as they need. `_created`
samples (creation timestamps) are dropped: a sum of timestamps is not one.

A replica that does not answer /metrics (down, or started without --metrics) is left out; the
router's own counters (slotserver_replica_router_*) follow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?$")
LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
SUMMED = ("counter", "histogram")


@dataclass
class Family:
    name: str
    kind: str = "untyped"
    help: str = ""
    samples: dict[tuple[str, str], float] = field(default_factory=dict)   # (name, labels text) -> value


def parse(text: str) -> list[Family]:
    """Families in order; a sample belongs to the family whose # TYPE/# HELP came last."""
    families: dict[str, Family] = {}
    current: Family | None = None
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            _, what, name, *rest = line.split(" ", 3)
            current = families.setdefault(name, Family(name))
            if what == "HELP":
                current.help = rest[0] if rest else ""
            else:
                current.kind = (rest[0] if rest else "untyped").strip()
            continue
        m = SAMPLE.match(line.strip())
        if line.startswith("#") or not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        if current is None or not name.startswith(current.name):
            current = families.setdefault(name, Family(name))
        try:
            current.samples[(name, _labels_text(labels))] = float(value)
        except ValueError:
            continue
    return list(families.values())


def _labels_text(raw: str) -> str:
    """Labels in a canonical order, so the same series from two replicas is one key."""
    pairs = sorted(LABEL.findall(raw[1:-1])) if raw else []
    return ",".join(f'{k}="{v}"' for k, v in pairs)


def merge(texts: dict[str, str]) -> str:
    """replica name -> its /metrics text; -> the fleet's text."""
    merged: dict[str, Family] = {}
    for replica, text in texts.items():
        for fam in parse(text):
            out = merged.setdefault(fam.name, Family(fam.name, fam.kind, fam.help))
            for (name, labels), value in fam.samples.items():
                if name.endswith("_created"):
                    continue
                if fam.kind in SUMMED:
                    out.samples[(name, labels)] = out.samples.get((name, labels), 0.0) + value
                else:
                    tagged = ",".join(x for x in (f'replica="{_esc(replica)}"', labels) if x)
                    out.samples[(name, tagged)] = value
    return "".join(_render(f) for f in merged.values() if f.samples)


def _render(f: Family) -> str:
    lines = [f"# HELP {f.name} {f.help}", f"# TYPE {f.name} {f.kind}"]
    lines += [f"{name}{{{labels}}} {value!r}" if labels else f"{name} {value!r}"
              for (name, labels), value in f.samples.items()]
    return "\n".join(lines) + "\n"


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
