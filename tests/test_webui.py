"""The web page at / (routes/webui.py, slotserver/server/webui/): served with a strict CSP, no
inline code, public even with API keys while the API stays closed, off with --no-webui; the
wheel carries its files; and its pure JS (markdown to DOM, SSE parsing) checked under node."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from slotserver.cli import main as cli
from slotserver.server import ServerConfig, ServerState, create_app
from slotserver.server.config_from_args import server_config_from_args
from slotserver.server.routes.webui import CSP, WEBUI_DIR
from test_server_api import make_client
from tiny_engine import running_tiny_engine

ROOT = Path(__file__).resolve().parent.parent
NODE = shutil.which("node")


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    with running_tiny_engine(tmp_path_factory.mktemp("tiny"), 1, 64) as running:
        yield running


client_for = make_client   # test_server_api's: a TestClient on the running tiny engine


def test_the_page_has_the_csp_and_no_inline_code(tiny_engine):
    with client_for(tiny_engine) as c:
        r = c.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"] == CSP
    assert "script-src 'self';" in CSP and "unsafe" not in CSP and "frame-ancestors 'none'" in CSP
    assert r.headers["x-content-type-options"] == "nosniff"
    html = r.text
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", html, re.S | re.I)
    assert scripts and all("src=" in attrs and not body.strip() for attrs, body in scripts)
    assert not re.search(r"<[^>]*\son\w+\s*=", html, re.I), "inline event handler"
    assert not re.search(r"<[^>]*\sstyle\s*=", html, re.I), "style attribute"
    assert "<style" not in html.lower()
    assert "javascript:" not in html.lower()


@pytest.mark.parametrize("name, ctype", [("app.js", "text/javascript"), ("render.js", "text/javascript"),
                                         ("style.css", "text/css")])
def test_static_files_have_their_types_and_the_csp(tiny_engine, name, ctype):
    with client_for(tiny_engine) as c:
        r = c.get("/webui/" + name)
    assert r.status_code == 200 and r.headers["content-type"].startswith(ctype)
    assert r.headers["content-security-policy"] == CSP and r.headers["x-content-type-options"] == "nosniff"
    assert r.content == (WEBUI_DIR / name).read_bytes()


@pytest.mark.parametrize("path", ["/webui/nope.js", "/webui/index.html", "/webui/..%2Froutes%2Fwebui.py",
                                  "/webui/%2e%2e/app.py", "/webui/"])
def test_only_the_folders_files_are_served(tiny_engine, path):
    with client_for(tiny_engine) as c:
        assert c.get(path).status_code == 404


def test_no_webui_is_a_404_at_the_root(tiny_engine):
    with client_for(tiny_engine, webui=False) as c:
        assert c.get("/").status_code == 404
        assert c.get("/webui/app.js").status_code == 404


def test_the_flag_reaches_the_config(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    on = server_config_from_args(cli.build_parser().parse_args(["serve", "-m", str(model)]))
    off = server_config_from_args(cli.build_parser().parse_args(["serve", "-m", str(model), "--no-webui"]))
    assert on.webui is True and off.webui is False


def test_with_a_key_the_page_is_public_and_the_api_is_not(tiny_engine):
    with client_for(tiny_engine, api_keys=("sekrit",)) as c:
        assert c.get("/").status_code == 200
        assert c.get("/webui/app.js").status_code == 200
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        assert c.post("/v1/chat/completions", json=body).status_code == 401
        assert c.get("/lab").status_code == 401 and c.get("/slots").status_code == 401
        assert c.get("/slots", headers={"Authorization": "Bearer sekrit"}).status_code == 200


def test_the_page_is_served_while_the_model_loads():
    with TestClient(create_app(ServerState(ServerConfig()))) as c:
        assert c.get("/").status_code == 200
        assert c.get("/slots").status_code == 503


def test_the_api_key_never_goes_into_a_url():
    """The page sends the key as a header only; no script builds a URL or query with it."""
    for js in WEBUI_DIR.glob("*.js"):
        text = js.read_text()
        assert "?key" not in text and "api_key=" not in text and "innerHTML" not in text, js.name
        assert "localStorage.setItem(KEY" not in text, "the key belongs in sessionStorage"
    assert "sessionStorage.setItem(KEY" in (WEBUI_DIR / "api.js").read_text()


def test_the_wheel_carries_every_webui_file():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = data["slotserver.server"]
    files = [p.relative_to(WEBUI_DIR.parent).as_posix() for p in WEBUI_DIR.iterdir() if p.is_file()]
    assert files and all(any(fnmatch(f, g) for g in globs) for f in files), files


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_js_render_and_sse_under_node(tmp_path):
    # node reads a .js file outside a "type": "module" package as CommonJS: copy as .mjs
    for name in ("render", "monitor_model"):
        shutil.copy(WEBUI_DIR / f"{name}.js", tmp_path / f"{name}.mjs")
    r = subprocess.run([NODE, str(ROOT / "tests" / "webui_render.test.mjs"), str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok ")


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_every_script_parses_as_a_module(tmp_path):
    for js in WEBUI_DIR.glob("*.js"):
        shutil.copy(js, tmp_path / (js.stem + ".mjs"))
        r = subprocess.run([NODE, "--check", str(tmp_path / (js.stem + ".mjs"))], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, js.name + ": " + r.stderr
