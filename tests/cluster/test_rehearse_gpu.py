"""The gpu-prod overlay's RayJob rehearsed on CPU (cluster/rehearse.py): its pods as local nodes (a head, a
CPU worker, two GPU workers with one logical GPU each: as many as this machine can run an engine or an
embedder for), the job submitted as KubeRay does with its config's resource requests kept, GPUs included,
and the kernels on CPU through the one override a user gives in the job's runtime env (QRAG_KERNELS=cpu:
vLLM-CPU, the embedder on CPU, faiss-cpu). A tiny corpus: the overlay's IVF4096 factory needs thousands of
vectors to train, so the rehearsal sets `faiss.factory: Flat` (and 3 questions per chunk) in the ConfigMap,
as a user patches it; everything else is the overlay's."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster import gcs_nodes as gcs
from cluster import node_processes as procs
from cluster import rehearse

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _has_kernel_override() -> bool:
    return any("QRAG_KERNELS" in f.read_text() for f in (REPO / "qrag_ray").rglob("*.py"))


def test_the_gpu_prod_rayjob_layout_runs_with_the_kernels_on_cpu(tmp_path):
    if not _has_kernel_override():
        pytest.skip("the CPU-kernel override (QRAG_KERNELS=cpu) is not in this tree yet: without it the job's GPU "
                    "requests would wait for GPUs that run no kernel here")
    from llm_stack import missing, qwen_converted

    if not qwen_converted():
        missing("the bundled Qwen model is not prepared (qrag prepare-models)")
    r = rehearse.prepare("gpu-prod", tmp_path, pods={"cpu-workers": 1, "gpu-workers": 2}, env={"QRAG_KERNELS": "cpu"},
                         settings={"faiss.factory": "Flat", "generator.questions": "3"})
    assert sum(s.num_gpus for s in r.shapes) == 2
    try:
        rehearse.start(r, timeout=180)
        gpus = sum(n["resources"].get("GPU", 0) for n in gcs.live_nodes(r.state.address))
        assert gpus == 2
        outcome = rehearse.run_job(r, timeout=1500)
        assert outcome.ok, outcome.summary()
    finally:
        assert rehearse.stop(r), "cluster processes survived SIGKILL"
    assert procs.cluster_pids(r.cdir) == []
