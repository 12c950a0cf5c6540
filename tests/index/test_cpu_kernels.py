"""QRAG_KERNELS=cpu: a CPU machine whose Ray declares GPUs (logical ones, RAY_OVERRIDE_RESOURCES) builds with
the GPU layout: the embedding actors hold the GPUs as planned, the kernels run on CPU, and the index is the
plain CPU build's, byte for byte (its content hash). Without the override the same build stops at once with
one error line, not a CUDA traceback. The build runs in a process of its own (its own Ray with 2 GPUs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.corpus import pydoc_docs, write_jsonl
from support.indexes import build

pytestmark = pytest.mark.integration  # real Ray, MiniLM, FAISS

REPO = Path(__file__).resolve().parents[2]
TOPICS = ("break", "continue", "pass")
# FAISS on CPU in both builds (faiss.use_gpu is part of the index's identity): the shard builds stay off the
# GPUs, so the GPUs the build holds are the embedding stage's
BASE = {"representation": "chunk", "shards": 2, "faiss.factory": "Flat", "faiss.use_gpu": False,
        "chunker.method": "token", "chunker.size": 120, "chunker.overlap": 20}
# the GPU layout: an embedding actor per GPU, fed by tokenizer actors (one here: each imports transformers,
# seconds of a 2-core box's CPU; the pool's sizing is the resource plan's unit tests')
GPU_LAYOUT = {"build.embedder.num_gpus": 1, "build.embedder.tokenizers": 1}

SCRIPT = r"""
import contextlib, io, json, os, sys, threading, time
import ray
from qrag_ray.config.index import build_index_config
from qrag_ray.index.build import build_index
from qrag_ray.cli import main

corpus, out, kw = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
low = {"gpu": None, "total": None}

def watch():  # the fewest GPUs free while the build runs: the embedding actors hold them
    while not ray.is_initialized():
        time.sleep(0.05)
    while True:
        with contextlib.suppress(Exception):
            free = ray.available_resources().get("GPU", 0.0)
            low["gpu"] = free if low["gpu"] is None else min(low["gpu"], free)
            low["total"] = ray.cluster_resources().get("GPU", 0.0)
        time.sleep(0.1)

threading.Thread(target=watch, daemon=True).start()
os.environ["QRAG_KERNELS"] = "cpu"
report = build_index(build_index_config(None, input=corpus, **{"build.output": out, **kw}))
del os.environ["QRAG_KERNELS"]
err = io.StringIO()
with contextlib.redirect_stderr(err):  # the same build, kernels where the requests are: CUDA is missing
    rc = main(["index", "--input", corpus, "--output", out + "-cuda", "--representation", "chunk",
               "--config", sys.argv[4]])
print(json.dumps({"hash": report.manifest.content_hash, "files": report.manifest.files,
                  "plan": report.resources, "low_gpu": low["gpu"], "total_gpu": low["total"],
                  "rc": rc, "stderr": err.getvalue()}))
"""


def test_cpu_kernels_run_the_gpu_layout_and_write_the_cpu_index(local_ray, tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [d for d in pydoc_docs() if d["id"] in TOPICS])
    plain = build({"input": str(corpus), "build.output": str(tmp_path / "plain"), **BASE})
    yaml = tmp_path / "gpu.yaml"
    yaml.write_text("build:\n  embedder: {num_gpus: 1}\nfaiss: {use_gpu: false}\n")
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}",
           "RAY_OVERRIDE_RESOURCES": json.dumps({"CPU": 8, "GPU": 2}),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("QRAG_KERNELS", None)
    process = subprocess.run([sys.executable, "-c", SCRIPT, str(corpus), str(tmp_path / "rehearsed"),
                              json.dumps({**BASE, **GPU_LAYOUT}), str(yaml)], env=env, capture_output=True, text=True,
                             timeout=1500)
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    res = json.loads(process.stdout.strip().splitlines()[-1])
    stages = res["plan"]["stages"]
    assert res["plan"]["kernels"] == "cpu" and res["plan"]["cluster"]["gpus"] == 2
    embed = stages["embed"]
    assert (embed["min_size"], embed["max_size"], embed["num_gpus"], embed["device"]) == (2, 2, 1.0, "cpu")
    assert stages["tokenize"]["min_size"] >= 1 and stages["build-shards"]["num_gpus"] == 0
    assert res["total_gpu"] == 2 and res["low_gpu"] == 0  # both GPUs held while the embedding stage ran
    assert res["hash"] == plain.manifest.content_hash and res["files"] == plain.manifest.files
    lines = [ln for ln in res["stderr"].splitlines() if ln.strip() and not ln.startswith(("plan on", "  "))]
    assert res["rc"] == 2 and "Traceback" not in res["stderr"], res["stderr"]
    assert lines == [lines[0]] and lines[0].startswith("error: the embed stage(s) run on GPUs") \
        and "QRAG_KERNELS=cpu" in lines[0], res["stderr"]
    assert not (tmp_path / ".rehearsed-cuda.work").exists() and not (tmp_path / "rehearsed-cuda").exists()
