"""The seams of the package, checked by walking its import graph.

Static part: every `.py` under slotserver/, kernels/ and layouts/ is parsed with `ast` (nothing is
imported) into a graph of modules. An edge is any `import`/`from ... import` statement, at module
level or inside a function (a lazy import still loads its target the moment the code runs, so it
counts), and `importlib.import_module("literal")`. Only imports under `if TYPE_CHECKING:` are left
out: they never run. Importing `a.b.c` also runs the packages `a` and `a.b`, so those are edges too.
A third-party module is a node named by its top-level name (`torch`, `numpy`, `triton`).

Runtime part: a fresh interpreter imports the seams and the light commands' modules while a
`sys.meta_path` hook notes who first imports torch, numpy or triton. It catches what the static walk
cannot see: a third-party package that imports numpy itself (the walk stops at our tree's edge).

Every failure names the chain of imports that crosses the seam, e.g.
"slotserver.engine.slots -> slotserver.engine.sequence -> slotserver.model.sampling.sampler -> torch".
"""

from __future__ import annotations

import ast
import functools
import importlib
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "numpy", "triton")
TORCH_FREE_SEAMS = ("slotserver.engine.scheduler", "slotserver.engine.slots", "slotserver.engine.stream_map",
                    "slotserver.engine.sequence", "slotserver.errors",
                    "slotserver.router.launch", "slotserver.cli.router_args",   # a router process loads no model
                    "slotserver.access.api_keys", "slotserver.access.cors",   # the server's and the router's
                    "slotserver.hub.cache", "slotserver.hub.download")
SELF_CONTAINED = ("slotserver.top", "slotserver.bench", "slotserver.replicas")   # import nothing of slotserver but themselves
FORBIDDEN_FOR_PLUGINS = ("slotserver.server", "slotserver.engine", "slotserver.lab", "slotserver.model")
# The layers, lowest first: nothing imports a layer above its own (a direct import only, so the
# message names the line to move). hub: the Hugging Face hub's cache and downloads (-hf, the router's
# --models-cache). access: API keys and CORS, shared by server and router. runtime:
# the contracts kernels, layouts, model and engine build on (KV spec, layout and kernel contracts,
# loader, native builds, CPU features, Batch); model: GGUF, weights, forward, sampling; lab: the live
# lab (watch, validate, swap, check); engine: slots, scheduler, the step; parallel: --tp's ranks
# around the model and engine; server, router (many models, one child server each), cli: the edges.
# (top/ and bench/ speak HTTP: SELF_CONTAINED.)
LAYERS = ("slotserver.errors", "slotserver.hub", "slotserver.access", "slotserver.runtime", "slotserver.model", "slotserver.lab",
          "slotserver.engine", "slotserver.parallel", "slotserver.server", "slotserver.router", "slotserver.cli")
ABOVE = {layer: LAYERS[i + 1:] for i, layer in enumerate(LAYERS[:-1])}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported_names(tree: ast.Module, module: str, is_package: bool) -> list[tuple[str, int]]:
    """(imported module, line) for every import that can run; `from X import Y` gives X and X.Y
    (X.Y is kept only if it turns out to be a module)."""
    found: list[tuple[str, int]] = []
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.append((base, node.lineno))
            found.extend((f"{base}.{alias.name}", node.lineno) for alias in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.args[0].value, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


@functools.cache
def graph() -> dict[str, dict[str, tuple[int, bool]]]:
    """module -> {imported node: (line of the first import, written in the file?)}.

    Nodes outside the tree are top-level names. A module's own packages (`a` and `a.b` for `a.b.c`)
    run before it: those edges have line 0 and are not written in the file."""
    files = [p for d in ("slotserver", "kernels", "layouts") for p in sorted((ROOT / d).rglob("*.py"))]
    parsed = {_module_name(p): (p, ast.parse(p.read_text(), filename=str(p))) for p in files}
    local_tops = {m.split(".")[0] for m in parsed}
    graph: dict[str, dict[str, tuple[int, bool]]] = {}
    for module, (path, tree) in parsed.items():
        parts = module.split(".")
        edges = {".".join(parts[:i]): (0, False) for i in range(1, len(parts)) if ".".join(parts[:i]) in parsed}
        for name, line in _imported_names(tree, module, path.name == "__init__.py"):
            parts = name.split(".")
            if parts[0] not in local_tops:
                edges.setdefault(parts[0], (line, True))
                continue
            for i in range(1, len(parts) + 1):   # importing a.b.c runs a and a.b too
                prefix = ".".join(parts[:i])
                if prefix in parsed and prefix != module:
                    explicit = i == len(parts) or (i == len(parts) - 1 and name not in parsed)
                    if prefix not in edges or (explicit and not edges[prefix][1]):
                        edges[prefix] = (line, explicit)
        graph[module] = edges
    return graph


def _chain(start: str, is_target) -> list[str] | None:
    """The shortest import chain from `start` to a node for which `is_target(node)`, or None."""
    parent: dict[str, str | None] = {start: None}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        if node != start and is_target(node):
            path = [node]
            while parent[path[-1]] is not None:
                path.append(parent[path[-1]])
            return path[::-1]
        for nxt in graph().get(node, {}):
            if nxt not in parent:
                parent[nxt] = node
                todo.append(nxt)
    return None


def _show(chain: list[str]) -> str:
    hops = [f"{a} -> {b} ({f'line {graph()[a][b][0]}' if graph()[a][b][0] else 'its package'})"
            for a, b in zip(chain, chain[1:])]
    return " -> ".join(chain) + "\n  " + "\n  ".join(hops)


# Where each user-facing error was defined before slotserver.errors; the name must stay importable
# there, and be the very class the command line and the server catch.
OLD_HOMES = {"ConfigError": "slotserver.model.config", "RequestError": "slotserver.engine.request",
             "EngineBusy": "slotserver.engine.request", "SamplingError": "slotserver.model.sampling.params",
             "GGUFError": "slotserver.model.gguf_file", "TokenizerError": "slotserver.model.text.tokenizer",
             "ChatTemplateError": "slotserver.model.text.chat_template", "ModuleLoadError": "slotserver.runtime.loader"}


@pytest.mark.parametrize("name, module", sorted(OLD_HOMES.items()))
def test_old_error_homes_reexport_the_one_class(name, module):
    """A module that defined its own copy would raise an error that `slotserver` no longer turns
    into a one-line message (exit 2), but a traceback."""
    errors = importlib.import_module("slotserver.errors")
    assert getattr(importlib.import_module(module), name) is getattr(errors, name), (
        f"{module}.{name} is its own class: replace it with `from slotserver.errors import {name}`")


def test_graph_sees_the_whole_tree():
    """Guards the walk itself: a parse that found nothing would pass every seam below."""
    assert {"slotserver.engine.engine", "kernels.attention", "layouts.paged"} <= graph().keys()
    assert _chain("slotserver.engine.engine", lambda n: n == "torch") is not None


@pytest.mark.parametrize("seam", TORCH_FREE_SEAMS)
def test_seam_reaches_no_tensor_library(seam):
    assert seam in graph(), f"{seam} is not in the tree"
    if chain := _chain(seam, lambda n: n in HEAVY):
        pytest.fail(f"{seam} imports {chain[-1]}: {_show(chain)}")


@pytest.mark.parametrize("package", SELF_CONTAINED)
def test_light_commands_import_only_themselves(package):
    """top and bench talk HTTP only: they import no slotserver module but their own (not even
    `slotserver` for its version), so they can never pull in the engine or torch."""
    inside = lambda n: n == package or n.startswith(package + ".")  # noqa: E731
    members = [m for m in graph() if inside(m)]
    assert len(members) > 3, f"{package} has no modules?"
    for module in members:
        for target, (line, explicit) in graph()[module].items():
            leaves = explicit and target.split(".")[0] == "slotserver" and not inside(target)
            assert not leaves, f"{module} -> {target} (line {line}) leaves {package}"


# the plugin modules by file name, so collecting this file does not parse the whole tree (graph())
@pytest.mark.parametrize("plugin", sorted(_module_name(p) for d in ("kernels", "layouts") for p in (ROOT / d).rglob("*.py")))
def test_kernels_and_layouts_never_reach_server_or_engine(plugin):
    forbidden = lambda n: any(n == f or n.startswith(f + ".") for f in FORBIDDEN_FOR_PLUGINS)  # noqa: E731
    if chain := _chain(plugin, forbidden):
        pytest.fail(f"{plugin} reaches {chain[-1]}: {_show(chain)}")


@pytest.mark.parametrize("layer", sorted(ABOVE))
def test_no_import_runs_up_the_layers(layer):
    inside = lambda n, p: n == p or n.startswith(p + ".")  # noqa: E731
    upward = [f"{m} -> {t} (line {line})" for m in graph() if inside(m, layer)
              for t, (line, explicit) in graph()[m].items() if explicit and any(inside(t, a) for a in ABOVE[layer])]
    assert not upward, "imports up the layers: " + "; ".join(upward)


# Run in the fresh interpreter before the code under test: on the first import of each heavy module,
# note the modules (and functions) on the stack that are importing it: the chain actually taken.
_TRACER = """
import sys
class _Tracer:
    chains = {}
    def find_spec(self, name, path=None, target=None):
        if name in HEAVY and name not in self.chains:
            f, chain = sys._getframe(1), []
            while f is not None:
                mod = f.f_globals.get("__name__", "")
                where = mod if f.f_code.co_name == "<module>" else mod + "." + f.f_code.co_name
                if mod.startswith(("slotserver", "__main__")) and (not chain or chain[-1] != where):
                    chain.append(where)
                f = f.f_back
            self.chains[name] = " -> ".join(chain[::-1] + [name])
        return None
_tracer = _Tracer()
sys.meta_path.insert(0, _tracer)
"""


def _heavy_imports(code: str) -> dict[str, str]:
    """{heavy module: the chain that imported it} after running `code` in a new interpreter."""
    script = f"HEAVY = {HEAVY!r}\n{_TRACER}\n{code}\nprint(repr(_tracer.chains))"
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_seams_import_no_torch_at_runtime():
    heavy = _heavy_imports("import " + ", ".join(TORCH_FREE_SEAMS))
    assert not heavy, "importing the torch-free seams loaded: " + "; ".join(heavy.values())


def test_runtime_tracer_names_the_chain():
    """Guards the tracer: the engine does import torch, and the chain says through what."""
    heavy = _heavy_imports("import slotserver.engine.engine")
    assert heavy["torch"].startswith("__main__ -> slotserver.engine.engine -> ") and heavy["torch"].endswith("torch")


@pytest.mark.parametrize("command, modules", [("top", "slotserver.top.app"),
                                              ("bench", "slotserver.bench.runner, slotserver.bench.report")])
def test_light_command_help_imports_no_torch(command, modules):
    """`slotserver top --help` / `bench --help` build the whole command line (every sub-command's
    flags), and the command's own modules load, without ever loading torch."""
    code = (f"import contextlib, io\nimport slotserver.cli.{command}, {modules}\nfrom slotserver.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            f"    main.main([{command!r}, '--help'])")
    heavy = _heavy_imports(code)
    assert not heavy, f"`slotserver {command} --help` loaded: " + "; ".join(heavy.values())
