"""`--ssl-key-file` / `--ssl-cert-file` (llama-server's): the server speaks HTTPS, and only HTTPS, with
the given certificate; a missing file or half a pair stops it with one line.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from test_server_cli import run_cli
from test_server_e2e import free_port

TINY = Path(__file__).parent / "fixtures" / "archs" / "llama3_freqs.gguf"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost (openssl's command line)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a test certificate")
    tmp = tmp_path_factory.mktemp("tls")
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    return key, cert


def test_the_server_speaks_https_with_the_given_certificate(tmp_path, certificate):
    key, cert = certificate
    port, log = free_port(), tmp_path / "server.log"
    cmd = [sys.executable, "-m", "slotserver.cli.main", "serve", "-m", str(TINY), "--port", str(port), "--no-warmup",
           "--no-watch", "--ssl-key-file", str(key), "--ssl-cert-file", str(cert)]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        url, deadline = f"https://localhost:{port}", time.time() + 120
        trust = ssl.create_default_context(cafile=str(cert))   # the test's own certificate, and only it
        while True:
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-2000:]
            try:
                if httpx.get(url + "/health", verify=trust, timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        r = httpx.post(url + "/completion", json={"prompt": "hi", "n_predict": 2, "temperature": 0},
                       verify=trust, timeout=60)
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 2
        with pytest.raises(httpx.TransportError):   # plain HTTP is not answered
            httpx.get(f"http://localhost:{port}/health", timeout=5)
        assert f"listening on https://127.0.0.1:{port}" in log.read_text()
    finally:
        proc.terminate()
        proc.wait(15)


@pytest.mark.parametrize("argv, words", [
    (("--ssl-key-file", "/no/such/key.pem", "--ssl-cert-file", "/no/such/cert.pem"), "--ssl-key-file"),
    (("--ssl-cert-file", "/no/such/cert.pem"), "--ssl-key-file and --ssl-cert-file go together")])
def test_a_bad_tls_setting_is_one_line_and_status_2(capsys, argv, words):
    status, err = run_cli(capsys, *argv)
    assert status == 2 and len(err) == 1 and words in err[0], err
