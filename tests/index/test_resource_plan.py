"""The build's resource plan as a pure function of the config and the cluster (no Ray): the GPU cluster the
indexing job is sized for, the CPU laptop's plan as it ran before the plan existed, QRAG_KERNELS=cpu keeping
every request, FAISS asking for a GPU only where it has a GPU version, and Ray Data LLM reading the plan's
engines as a fixed pool."""

from __future__ import annotations

import json

import pytest

from qrag_ray.config.index import build_index_config
from qrag_ray.errors import QragError
from qrag_ray.index.build import shard_task_options
from qrag_ray.index.resource_plan import (
    TOKENIZERS_PER_GPU,
    ClusterSpec,
    NodeSpec,
    cluster_from_nodes,
    faiss_gpu_capable,
    kernels_from_env,
    local_ray_cpus,
    plan_resources,
)

SHIPPED_FACTORY = "IVF4096,PQ96x4fs,Refine(SQfp16)"
H100_NODE = NodeSpec(cpus=208, gpus=8, memory=1.8e12, accelerator="H100")
GPU_CLUSTER = ClusterSpec((H100_NODE,) * 8, cores=2)
LAPTOP = ClusterSpec((NodeSpec(cpus=2, memory=16e9),), local=True, cores=2)


def _cfg(**over):
    return build_index_config(None, input="corpus.jsonl", **{"build.output": "idx", **over})


def _gpu_job(**over):
    """The MS MARCO job: HyPE questions from a 7-8B instruct model on vLLM, MiniLM on GPUs, 32 shards."""
    return _cfg(representation="hype", shards=32, **{
        "generator.backend": "vllm", "generator.model": "/mnt/qrag/models/Qwen2.5-7B-Instruct",
        "generator.num_gpus": 1, "build.embedder.num_gpus": 1, "faiss.factory": SHIPPED_FACTORY, **over})


def test_the_gpu_cluster_of_the_job():
    """8 nodes x 8 H100 x 208 CPUs: engines start together, >= 1024 requests in flight per engine, <= 16
    tokenizer workers per embedding GPU, and no FAISS task holds a GPU for a factory FAISS runs on CPU only."""
    plan = plan_resources(_gpu_job(), GPU_CLUSTER)
    gen = plan.stages["generate"]
    assert gen.compute == "actors" and gen.fixed and gen.min_size == 64  # one engine per GPU, all at once
    assert gen.pool() == {"size": 64}
    assert gen.device == "cuda" and gen.num_gpus == 1 and gen.tensor_parallel == 1
    assert gen.in_flight >= 1024 and gen.engine_kwargs["max_num_seqs"] == 1024
    embed = plan.stages["embed"]
    tok = plan.stages["tokenize"]
    assert embed.fixed and embed.min_size == 64 and embed.num_gpus == 1 and embed.device == "cuda"
    embed_gpus = embed.min_size * embed.num_gpus
    assert not tok.fixed and 1 <= tok.min_size <= tok.max_size <= TOKENIZERS_PER_GPU * embed_gpus
    assert tok.max_size < GPU_CLUSTER.cpus and tok.num_gpus == 0  # never every CPU of the cluster
    for name in ("train", "build-shards"):
        stage = plan.stages[name]
        assert stage.num_gpus == 0 and stage.device == "cpu" and stage.threads == stage.num_cpus > 1
    shards = plan.stages["build-shards"]
    assert shards.num_cpus * shards.max_size <= GPU_CLUSTER.cpus and shards.max_size == 32
    json.dumps(plan.to_dict())  # the --json report carries it


def test_the_printed_plan_names_every_stage():
    lines = plan_resources(_gpu_job(), GPU_CLUSTER).lines()
    assert lines[0].startswith("plan on 8 nodes: 1664 CPUs, 64 GPUs (H100)") and "kernels auto" in lines[0]
    by_stage = {ln.split()[0]: ln for ln in lines[1:]}
    assert list(by_stage) == ["read+chunk", "generate", "tokenize", "embed", "train", "build-shards"]
    assert "actors 64 fixed" in by_stage["generate"] and "in flight 1024/engine" in by_stage["generate"]
    assert "actors 64-1024" in by_stage["tokenize"] and "GPU" not in by_stage["build-shards"]


def test_engines_over_tensor_parallel_gpus():
    plan = plan_resources(_gpu_job(**{"generator.num_gpus": 2}), GPU_CLUSTER)
    gen = plan.stages["generate"]
    assert gen.min_size == gen.max_size == 32 and gen.tensor_parallel == 2  # engines = GPUs / tp
    assert gen.bundles == ({"CPU": 1.0, "GPU": 1.0},) * 2  # Ray counts GPUs per worker, the config per engine
    assert gen.engine_kwargs["tensor_parallel_size"] == 2 and gen.num_cpus == 2
    with pytest.raises(QragError, match="tensor_parallel_size x pipeline_parallel_size"):
        plan_resources(_gpu_job(**{"generator.num_gpus": 2, "generator.engine_kwargs": {"tensor_parallel_size": 1}}),
                       GPU_CLUSTER)
    with pytest.raises(QragError, match="whole number"):
        plan_resources(_gpu_job(**{"generator.num_gpus": 1.5}), GPU_CLUSTER)


def test_engines_sharing_a_gpu_and_an_explicit_pool():
    shared = plan_resources(_gpu_job(**{"generator.num_gpus": 0.5}), GPU_CLUSTER).stages["generate"]
    assert shared.min_size == 128 and shared.bundles == ({"CPU": 1.0, "GPU": 0.5},)
    assert shared.engine_kwargs["gpu_memory_utilization"] == 0.45
    # an autoscaling cluster holds no GPU node yet: the config's pool is kept (fixed), and the plan says so
    plan = plan_resources(_gpu_job(**{"generator.concurrency": 16, "build.embedder.actors": 16}),
                          ClusterSpec((NodeSpec(cpus=8),)))
    assert plan.stages["generate"].pool() == {"size": 16} and plan.stages["embed"].pool() == {"size": 16}
    assert any("autoscaler" in ln for ln in plan.lines())


@pytest.mark.parametrize("accelerator,seqs", [("H100", 1024), ("H200", 1024), ("A100-80G", 256), ("L4", 256),
                                              (None, 256)])
def test_requests_in_flight_reach_max_num_seqs(accelerator, seqs):
    """vLLM's own offline max_num_seqs for the GPU (Ray Data's engine would get 128), and enough requests in
    flight per engine to fill it; the config's max_num_seqs wins."""
    cluster = ClusterSpec((NodeSpec(cpus=16, gpus=1, accelerator=accelerator),))
    gen = plan_resources(_gpu_job(**{"generator.batch_size": 48}), cluster).stages["generate"]
    assert gen.engine_kwargs["max_num_seqs"] == seqs and seqs <= gen.in_flight < seqs + 48
    mine = _gpu_job(**{"generator.engine_kwargs": {"max_num_seqs": 64}})
    assert plan_resources(mine, cluster).stages["generate"].in_flight == 64


def test_the_cpu_laptop_plan_is_what_ran_before():
    """The default build on a CPU machine: chunking at half a CPU, one embedding actor on every core, no
    tokenizer pool, FAISS on CPU; vLLM-CPU's one engine with Ray's 8 batches of 16 in flight; the local Ray
    gets four times the cores as logical CPUs only where vLLM runs on CPU (else the cores, 4 at least)."""
    cfg = _cfg()
    plan = plan_resources(cfg, LAPTOP)
    assert list(plan.stages) == ["read+chunk", "embed", "train", "build-shards"]
    assert plan.stages["read+chunk"].num_cpus == 0.5 and plan.stages["read+chunk"].batch_size == 1024
    embed = plan.stages["embed"]
    assert (embed.pool(), embed.num_cpus, embed.num_gpus, embed.threads, embed.device) == ({"size": 1}, 1, 0, 2, "cpu")
    assert embed.batch_size == cfg.build.rows_per_part
    assert all(s.num_gpus == 0 and s.device == "cpu" for s in plan.stages.values())
    assert local_ray_cpus(cfg, "auto", cores=2) == 4 and local_ray_cpus(cfg, "auto", cores=16) == 16
    llm = _cfg(representation="hype", **{"generator.backend": "vllm"})
    gen = plan_resources(llm, LAPTOP).stages["generate"]
    assert (gen.pool(), gen.num_gpus, gen.device, gen.in_flight, gen.bundles) == ({"size": 1}, 0, "cpu", 128,
                                                                                  ({"CPU": 1.0},))
    assert gen.engine_kwargs["enforce_eager"] is True and "max_num_seqs" not in gen.engine_kwargs
    assert local_ray_cpus(llm, "auto", cores=2) == 8 and local_ray_cpus(llm, "auto", cores=16) == 64
    assert local_ray_cpus(_cfg(**{"build.num_cpus": 5}), "auto", cores=2) == 5


def test_cpu_kernels_keep_every_request():
    """QRAG_KERNELS=cpu: the same actors, CPUs and GPUs as on GPUs; the kernels on CPU (vLLM's CPU engine
    arguments, no tensor parallelism inside the one CPU engine process)."""
    job = _gpu_job(**{"generator.num_gpus": 2})
    gpu = plan_resources(job, GPU_CLUSTER)
    cpu = plan_resources(job, GPU_CLUSTER, kernels="cpu")
    for name, stage in gpu.stages.items():
        cpu_stage = cpu.stages[name]
        assert (cpu_stage.min_size, cpu_stage.max_size, cpu_stage.num_cpus, cpu_stage.num_gpus, cpu_stage.bundles) == (
            stage.min_size, stage.max_size, stage.num_cpus, stage.num_gpus, stage.bundles)
        assert cpu_stage.device == "cpu"
    eng = cpu.stages["generate"].engine_kwargs
    assert "tensor_parallel_size" not in eng and "max_num_seqs" not in eng and eng["enforce_eager"] is True
    assert cpu.stages["embed"].threads == 1  # the driver's 2 cores over 64 actors, at least 1
    assert local_ray_cpus(job, "cpu", cores=2) == 8 and local_ray_cpus(job, "auto", cores=16) == 16


def test_a_local_ray_without_the_gpus_refuses_at_once():
    """A fixed pool a local Ray cannot hold would wait forever: one error line; a joined cluster may grow."""
    gpu_embed = _cfg(**{"build.embedder.num_gpus": 1})
    with pytest.raises(QragError, match="embed stage needs 1 GPUs at once but this machine's Ray has 0") as raised:
        plan_resources(gpu_embed, LAPTOP)
    # the line says how to give a CPU machine's Ray the GPUs it asks for, in a form that can be pasted
    assert """RAY_OVERRIDE_RESOURCES='{"GPU": 1}' with QRAG_KERNELS=cpu""" in str(raised.value)
    two = ClusterSpec((NodeSpec(cpus=8, gpus=2),), local=True)
    assert plan_resources(gpu_embed, two).stages["embed"].min_size == 2
    with pytest.raises(QragError, match="needs 4 GPUs"):
        plan_resources(_cfg(**{"build.embedder.num_gpus": 1, "build.embedder.actors": 4}), two)
    # 2 embedding actors + 2 tokenizers + chunking: 4.5 CPUs, not on 2 logical ones
    small = ClusterSpec((NodeSpec(cpus=2, gpus=2),), local=True)
    with pytest.raises(QragError, match="need 4.5 CPUs at once but this machine's Ray has 2: set build.num_cpus"):
        plan_resources(gpu_embed, small)


@pytest.mark.parametrize("factory,gpu", [
    ("Flat", True), ("IVF1024,Flat", True), ("IVF1024,SQ8", True), ("IVF1024,PQ48", True), ("IVF256,PQ16x8", True),
    ("OPQ16,IVF1024,PQ16", True), ("PCA64,IVF256,Flat", True), ("SQfp16", True),
    (SHIPPED_FACTORY, False), ("HNSW32", False), ("IVF1024,PQ48x4fs", False), ("IVF1024,PQ8x4", False),
    ("IVF1024,Flat,Refine(Flat)", False), ("IVF1024_HNSW32,PQ48", False), ("PQ16", False), ("SQ8", False)])
def test_faiss_gpu_versions(factory, gpu):
    """The factories FAISS's GPU cloner copies (faiss/gpu/GpuCloner.cpp) are exactly the index classes it
    handles: checked against the class the CPU FAISS makes for each string."""
    import faiss

    assert faiss_gpu_capable(factory) is gpu
    raw = faiss.index_factory(96, factory, faiss.METRIC_INNER_PRODUCT)  # kept: downcast_index does not own it
    idx = faiss.downcast_index(raw)
    while isinstance(idx, faiss.IndexPreTransform):
        idx = faiss.downcast_index(idx.index)
    by_class = (isinstance(idx, (faiss.IndexFlat, faiss.IndexIVFFlat, faiss.IndexIVFScalarQuantizer))
                or (type(idx) is faiss.IndexScalarQuantizer and idx.sq.qtype == faiss.ScalarQuantizer.QT_fp16)
                or (type(idx) is faiss.IndexIVFPQ and idx.pq.nbits == 8))
    if isinstance(idx, faiss.IndexIVF):
        by_class = by_class and isinstance(faiss.downcast_index(idx.quantizer), faiss.IndexFlat)
    assert by_class is gpu


def test_faiss_tasks_on_gpus_and_threads():
    gpu_ok = plan_resources(_gpu_job(**{"faiss.factory": "IVF4096,PQ48"}), GPU_CLUSTER).stages["build-shards"]
    assert gpu_ok.num_gpus == 1 and gpu_ok.device == "cuda" and gpu_ok.num_cpus <= 208 / 8  # each GPU gets one
    # a worker that ran CUDA kernels exits after its shard (the GPU memory FAISS held is freed); one that
    # holds a GPU but ran its kernels on CPU takes the next shard
    cpu_kernels = plan_resources(_gpu_job(**{"faiss.factory": "IVF4096,PQ48"}), GPU_CLUSTER, kernels="cpu")
    on_cpu = cpu_kernels.stages["build-shards"]
    assert on_cpu.num_gpus == 1 and on_cpu.device == "cpu"
    assert shard_task_options(gpu_ok)["max_calls"] == 1 and shard_task_options(on_cpu)["max_calls"] == 0
    assert shard_task_options(on_cpu)["num_gpus"] == 1 and shard_task_options(on_cpu)["scheduling_strategy"] == "SPREAD"
    with pytest.raises(QragError, match="no GPU version of 'HNSW32'"):
        plan_resources(_cfg(**{"faiss.factory": "HNSW32", "faiss.use_gpu": True}), GPU_CLUSTER)
    hnsw = plan_resources(_cfg(shards=4, **{"faiss.factory": "HNSW32"}), GPU_CLUSTER)
    assert hnsw.stages["build-shards"].threads == 1 and hnsw.stages["train"].threads == 1  # parallel HNSW differs
    off = plan_resources(_cfg(**{"faiss.use_gpu": False}), GPU_CLUSTER).stages["build-shards"]
    assert off.num_gpus == 0


def test_openai_clients():
    cfg = _cfg(representation="hype", **{"generator.backend": "openai", "generator.base_url": "http://x/v1",
                                          "generator.max_parallel_requests": 4})
    gen = plan_resources(cfg, LAPTOP).stages["generate"]
    assert gen.pool() == {"size": 1} and gen.in_flight == 4 and gen.batch_size == 16 and gen.num_gpus == 0
    assert local_ray_cpus(cfg, "auto", cores=32) == 32  # no vLLM on CPU: no inflated count


def test_kernels_env():
    assert kernels_from_env({}) == "auto" and kernels_from_env({"QRAG_KERNELS": " CPU "}) == "cpu"
    with pytest.raises(QragError, match="QRAG_KERNELS must be auto or cpu, not 'gpu'"):
        kernels_from_env({"QRAG_KERNELS": "gpu"})


def test_cluster_from_ray_nodes():
    nodes = [{"Alive": True, "Resources": {"CPU": 208.0, "GPU": 8.0, "memory": 1e12, "accelerator_type:H100": 1.0}},
             {"Alive": True, "Resources": {"CPU": 8.0, "memory": 3e10}},
             {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}}]
    cluster = cluster_from_nodes(nodes, cores=4)
    assert (cluster.cpus, cluster.gpus, cluster.accelerator) == (216, 8, "H100")
    assert (cluster.max_node_cpus, cluster.cores) == (208, 4)
    assert cluster.summary().startswith("2 nodes: 216 CPUs, 8 GPUs (H100)")


def test_the_ray_data_llm_processor_gets_a_fixed_pool():
    """Ray's own processor config reads the plan's stage as planned: a fixed pool (min = max), enough
    concurrent batches for the requests in flight, one bundle per engine worker holding the engine's GPUs
    (what Ray's engine stage sums into the actor's request when one process runs the engine)."""
    from ray.data.llm import vLLMEngineProcessorConfig

    from qrag_ray.generation.backends.vllm import processor_config

    for job, kernels in ((_gpu_job(), "auto"), (_gpu_job(**{"generator.num_gpus": 2}), "cpu"),
                         (_cfg(representation="hype", **{"generator.backend": "vllm"}), "auto")):
        stage = plan_resources(job, GPU_CLUSTER if job.generator.num_gpus else LAPTOP, kernels).stages["generate"]
        conf = vLLMEngineProcessorConfig(**processor_config(job.generator, "/models/m", stage))
        assert conf.get_concurrency() == {"min_size": stage.min_size, "max_size": stage.min_size}
        assert conf.batch_size * conf.max_concurrent_batches >= stage.in_flight
        bundles = conf.placement_group_config["bundles"]
        assert sum(b["GPU"] for b in bundles) == stage.num_gpus and sum(b["CPU"] for b in bundles) == stage.num_cpus
        kwargs = conf.engine_kwargs
        workers = kwargs.get("tensor_parallel_size", 1) * kwargs.get("pipeline_parallel_size", 1)
        assert workers == (1 if kernels == "cpu" else stage.tensor_parallel)  # Ray replicates bundles per tp x pp
