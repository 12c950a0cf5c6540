"""The build's resource plan: every stage's actors or tasks, CPUs, GPUs, batch and requests in flight, as
a pure function of the IndexConfig and the cluster's resources (`plan_resources`). The build prints it at
start and each stage reads its resources from it (docs/CLUSTER.md, "The indexing job on GPUs").

`QRAG_KERNELS=cpu` (read here only, `kernels_from_env`) keeps every request of the plan, GPUs included,
and runs the kernels on CPU (vLLM's CPU engine, the embedder on CPU, FAISS on CPU): a CPU machine whose
Ray declares logical GPUs runs the GPU layout."""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from qrag_ray.config.index import IndexConfig, representation_plan
from qrag_ray.config.llm import GeneratorConfig
from qrag_ray.errors import QragError
from qrag_ray.generation.backends.vllm import default_max_num_seqs, engine_kwargs_for
from qrag_ray.runtime.ray_start import local_num_cpus
from qrag_ray.runtime.stage_plan import StagePlan

KERNELS_ENV = "QRAG_KERNELS"
KERNELS = ("auto", "cpu")
# A GPU's forward pass outruns one tokenizing process many times over (docs/SCALING.md section 3): up to
# this many tokenizer actors feed each embedding GPU, at least one each, autoscaling in between.
TOKENIZERS_PER_GPU = 16
LIGHT_CPU = 0.5  # the per-row stages (chunking, row building): their own request keeps them out of the actors
OPENAI_CLIENT_CPU = 0.25  # an OpenAI client actor waits on the network
# Ray Data LLM's own default of concurrent batches per engine, kept where the engine runs on CPU
RAY_CONCURRENT_BATCHES = 8

# Factories whose index class FAISS's GPU cloner (faiss/gpu/GpuCloner.cpp) copies to a GPU: Flat, SQfp16,
# IVF-Flat, IVF-SQ and IVF-PQ at 8 bits per code, behind optional transforms. HNSW, Refine, fast-scan
# ("fs") and 4-bit PQ have no GPU version: a task asking a GPU for them would hold one it cannot use.
_TRANSFORM = r"(?:(?:PCAR?|PCAW|PCAWR|OPQ|RR)\d+(?:_\d+)?,|L2norm,)*"
_GPU_FACTORY = re.compile(_TRANSFORM + r"(?:Flat|SQfp16|IVF\d+,(?:Flat|SQ(?:4|6|8|fp16)|PQ\d+(?:x8)?))")


@dataclass(frozen=True)
class NodeSpec:
    """One alive Ray node's resources (ray.nodes()'s `Resources`)."""

    cpus: float
    gpus: float = 0.0
    memory: float = 0.0  # bytes
    accelerator: str | None = None  # Ray's accelerator type, e.g. H100, A100-80G, L4


@dataclass(frozen=True)
class ClusterSpec:
    """The cluster the build found. `local`: an in-process Ray this build runs on (nothing joins it later, so
    a request it cannot hold never runs); `cores`: the driver machine's cores (CPU kernels' threads)."""

    nodes: tuple[NodeSpec, ...]
    local: bool = False
    cores: int = 1

    @property
    def cpus(self) -> float:
        return sum(n.cpus for n in self.nodes)

    @property
    def gpus(self) -> float:
        return sum(n.gpus for n in self.nodes)

    @property
    def max_node_cpus(self) -> float:
        return max((n.cpus for n in self.nodes), default=0.0)

    @property
    def accelerator(self) -> str | None:
        """The accelerator type most of the cluster's GPUs are."""
        kinds = Counter({n.accelerator: 0.0 for n in self.nodes if n.accelerator})
        for node in self.nodes:
            if node.accelerator:
                kinds[node.accelerator] += node.gpus
        return kinds.most_common(1)[0][0] if kinds else None

    def summary(self) -> str:
        gpus = f", {self.gpus:g} GPUs" + (f" ({self.accelerator})" if self.accelerator else "") if self.gpus else ""
        mem = sum(n.memory for n in self.nodes) / 2**30
        return (f"{len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''}: {self.cpus:g} CPUs{gpus}, "
                f"{mem:.0f} GiB" + (" (local Ray)" if self.local else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": [vars(n) for n in self.nodes], "local": self.local, "cores": self.cores,
                "cpus": self.cpus, "gpus": self.gpus, "accelerator": self.accelerator}


@dataclass(frozen=True)
class ResourcePlan:
    """The stages in the order a build runs them, and what the plan was made from."""

    kernels: str
    cluster: ClusterSpec
    stages: dict[str, StagePlan] = field(default_factory=dict)

    def lines(self) -> list[str]:
        notes = [f"  note: {n}" for s in self.stages.values() for n in s.notes]
        return [f"plan on {self.cluster.summary()}; kernels {self.kernels}",
                *(f"  {s.line()}" for s in self.stages.values()), *notes]

    def to_dict(self) -> dict[str, Any]:
        return {"kernels": self.kernels, "cluster": self.cluster.to_dict(),
                "stages": {k: s.to_dict() for k, s in self.stages.items()}}

    def cuda_stages(self) -> list[StagePlan]:
        return [s for s in self.stages.values() if s.device == "cuda"]


def kernels_from_env(environ: Mapping[str, str] = os.environ) -> str:
    """QRAG_KERNELS: `auto` (the default: each kernel where its stage's resources are) or `cpu`."""
    value = environ.get(KERNELS_ENV, "auto").strip().lower() or "auto"
    if value not in KERNELS:
        raise QragError(f"{KERNELS_ENV} must be auto or cpu, not {environ.get(KERNELS_ENV)!r}")
    return value


def cluster_from_nodes(nodes: list[Mapping[str, Any]], local: bool = False, cores: int = 1) -> ClusterSpec:
    """ray.nodes()'s alive entries as a ClusterSpec (the accelerator from the `accelerator_type:X` resource)."""
    specs = []
    for node in nodes:
        if not node.get("Alive", True):
            continue
        resources = node.get("Resources", {})
        acc = next((k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")), None)
        specs.append(NodeSpec(cpus=float(resources.get("CPU", 0)), gpus=float(resources.get("GPU", 0)),
                              memory=float(resources.get("memory", 0)), accelerator=acc))
    return ClusterSpec(tuple(specs), local=local, cores=cores)


def current_cluster(local: bool) -> ClusterSpec:
    """The running Ray's alive nodes (Ray wiring; everything else here is pure)."""
    import ray

    return cluster_from_nodes(ray.nodes(), local=local, cores=os.cpu_count() or 1)


def llm_atoms(cfg: IndexConfig, kinds: list[str], granularity: str | None) -> bool:
    """Whether the build asks the LLM for atoms (unstructured atoms, for atom questions or sentence vectors)."""
    return cfg.generator.atoms == "llm" and (granularity == "atom" or "sentence" in kinds)


def runs_llm(cfg: IndexConfig) -> bool:
    """Whether the build has a generation stage: an LLM backend and questions or atoms to write."""
    kinds, gran = representation_plan(cfg)
    return cfg.generator.backend in ("vllm", "openai") and (gran is not None or llm_atoms(cfg, kinds, gran))


def vllm_on_cpu(cfg: IndexConfig, kernels: str) -> bool:
    return runs_llm(cfg) and cfg.generator.backend == "vllm" and (cfg.generator.num_gpus <= 0 or kernels == "cpu")


def local_ray_cpus(cfg: IndexConfig, kernels: str, cores: int | None = None) -> int:
    """Logical CPUs of the in-process Ray a build starts: runtime/ray_start.local_num_cpus, inflated only
    where this build runs vLLM on CPU; `build.num_cpus` wins."""
    return cfg.build.num_cpus or local_num_cpus(vllm_on_cpu(cfg, kernels), cores)


def faiss_gpu_capable(factory: str) -> bool:
    """Whether FAISS has a GPU version of the index this factory string makes (see _GPU_FACTORY)."""
    return _GPU_FACTORY.fullmatch(factory.replace(" ", "")) is not None


def plan_resources(cfg: IndexConfig, cluster: ClusterSpec, kernels: str = "auto") -> ResourcePlan:
    """Every stage of the build of `cfg` on `cluster`, in the order the build runs them."""
    stages = [plan_chunking(cfg, cluster)]
    if runs_llm(cfg):
        stages.append(plan_generation(cfg.generator, cluster, kernels))
    stages += [*plan_embedding(cfg, cluster, kernels), *plan_faiss(cfg, cluster, kernels)]
    plan = ResourcePlan(kernels, cluster, {s.name: s for s in stages})
    _check_fits(plan)
    return plan


def plan_chunking(cfg: IndexConfig, cluster: ClusterSpec) -> StagePlan:
    return StagePlan("read+chunk", "tasks", 1, max(1, int(cluster.cpus / LIGHT_CPU)), num_cpus=LIGHT_CPU,
                     batch_size=cfg.build.docs_per_batch)


def plan_generation(generator: GeneratorConfig, cluster: ClusterSpec, kernels: str = "auto") -> StagePlan:
    """The LLM stage. vLLM: a fixed pool of engines (all started before the first request), by default
    one per `generator.num_gpus` GPUs of the cluster; each engine keeps at least vLLM's `max_num_seqs`
    requests in flight (batch_size x concurrent batches)."""
    if generator.backend == "openai":
        clients = generator.concurrency or 1
        return StagePlan("generate", "actors", clients, clients, num_cpus=OPENAI_CLIENT_CPU,
                         batch_size=max(1, min(generator.batch_size, 4 * generator.max_parallel_requests)),
                         in_flight=generator.max_parallel_requests)
    tensor_parallel, pipeline_parallel = _parallel_sizes(generator.num_gpus, generator.engine_kwargs)
    workers = tensor_parallel * pipeline_parallel
    layout_gpu = generator.num_gpus > 0
    on_gpu = layout_gpu and kernels == "auto"
    engines = generator.concurrency or (max(1, int(cluster.gpus // generator.num_gpus)) if layout_gpu else 1)
    notes = []
    if layout_gpu and engines * generator.num_gpus > cluster.gpus:
        notes.append(f"generate: {engines} engines x {generator.num_gpus:g} GPUs, the cluster has {cluster.gpus:g} "
                     "GPUs now (the pool starts when the autoscaler has added the rest)")
    engine_kwargs = engine_kwargs_for(generator, on_gpu)
    if on_gpu:
        seqs = int(engine_kwargs.get("max_num_seqs") or default_max_num_seqs(cluster.accelerator))
        engine_kwargs["max_num_seqs"] = seqs  # Ray Data's engine would otherwise get vLLM's 128, whatever the GPU
        if tensor_parallel > 1:
            engine_kwargs["tensor_parallel_size"] = tensor_parallel
        in_flight = generator.batch_size * math.ceil(seqs / generator.batch_size)
    else:
        if layout_gpu:  # QRAG_KERNELS=cpu: one CPU engine process holds the layout's GPUs as logical resources
            engine_kwargs.pop("tensor_parallel_size", None)
            engine_kwargs.pop("pipeline_parallel_size", None)
        in_flight = generator.batch_size * RAY_CONCURRENT_BATCHES
    bundle = {"CPU": 1.0, "GPU": generator.num_gpus / workers} if layout_gpu else {"CPU": 1.0}
    return StagePlan("generate", "actors", engines, engines, num_cpus=float(workers), num_gpus=generator.num_gpus,
                     device="cuda" if on_gpu else "cpu", batch_size=generator.batch_size, in_flight=in_flight,
                     tensor_parallel=tensor_parallel, bundles=tuple(dict(bundle) for _ in range(workers)),
                     engine_kwargs=engine_kwargs, notes=tuple(notes))


def _parallel_sizes(num_gpus: float, engine_kwargs: Mapping[str, Any]) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes of an engine of `num_gpus` GPUs: `generator.num_gpus` counts the GPUs
    of one engine, spread over tensor x pipeline parallel workers (tensor_parallel_size defaults to all)."""
    pipeline_parallel = int(engine_kwargs.get("pipeline_parallel_size", 1))
    if num_gpus <= 0:
        return int(engine_kwargs.get("tensor_parallel_size", 1)), pipeline_parallel
    if num_gpus < 1:
        tensor_parallel = int(engine_kwargs.get("tensor_parallel_size", 1))
        if tensor_parallel * pipeline_parallel != 1:
            raise QragError(f"generator.num_gpus {num_gpus:g} shares a GPU between engines: an engine with "
                            f"tensor/pipeline parallel workers needs whole GPUs (one each)")
        return 1, 1
    if num_gpus != int(num_gpus):
        raise QragError(f"generator.num_gpus is the GPUs of one engine: a whole number, or below 1 for engines "
                        f"sharing a GPU (got {num_gpus:g})")
    tensor_parallel = int(engine_kwargs.get("tensor_parallel_size", int(num_gpus) // pipeline_parallel))
    if tensor_parallel * pipeline_parallel != int(num_gpus):
        raise QragError(f"generator.num_gpus {num_gpus:g} is the GPUs of one engine: it must equal "
                        f"tensor_parallel_size x pipeline_parallel_size ({tensor_parallel} x {pipeline_parallel})")
    return tensor_parallel, pipeline_parallel


def plan_embedding(cfg: IndexConfig, cluster: ClusterSpec, kernels: str = "auto") -> list[StagePlan]:
    """[tokenize,] embed. On GPUs one embedding actor per `build.embedder.num_gpus` of the cluster, fed by
    tokenizer actors: at least one, at most TOKENIZERS_PER_GPU per embedding GPU (never every CPU), or a fixed
    pool of `build.embedder.tokenizers`."""
    embedder = cfg.build.embedder
    layout_gpu = embedder.num_gpus > 0
    actors = embedder.actors or (max(1, int(cluster.gpus // embedder.num_gpus)) if layout_gpu else 1)
    on_gpu = layout_gpu and kernels == "auto"
    out = []
    if embedder.tokenize_apart():
        devices = actors * embedder.num_gpus if layout_gpu else actors
        most_tokenizers = embedder.tokenizers or max(1, int(TOKENIZERS_PER_GPU * devices))
        fewest_tokenizers = embedder.tokenizers or max(1, min(most_tokenizers, int(devices)))
        out.append(StagePlan("tokenize", "actors", fewest_tokenizers, most_tokenizers, num_cpus=1.0,
                             batch_size=cfg.build.rows_per_part))
    notes = ()
    if layout_gpu and actors * embedder.num_gpus > cluster.gpus:
        notes = (f"embed: {actors} actors x {embedder.num_gpus:g} GPUs, the cluster has {cluster.gpus:g} GPUs now "
                 "(the pool starts when the autoscaler has added the rest)",)
    threads = None if on_gpu else (embedder.threads or max(1, cluster.cores // actors))
    out.append(StagePlan("embed", "actors", actors, actors, num_cpus=1.0, num_gpus=embedder.num_gpus,
                         device="cuda" if on_gpu else "cpu", batch_size=cfg.build.rows_per_part, threads=threads,
                         notes=notes))
    return out


def plan_faiss(cfg: IndexConfig, cluster: ClusterSpec, kernels: str = "auto") -> list[StagePlan]:
    """train (one task: the quantizer, when the factory trains), build-shards (one task per shard). A task asks
    for a GPU only for a factory FAISS has a GPU version of; its FAISS threads are its CPUs (one for HNSW,
    whose parallel build differs run to run, so a resumed build would not publish the same bytes)."""
    faiss = cfg.faiss
    capable = faiss_gpu_capable(faiss.factory)
    if faiss.use_gpu is True and not capable:
        raise QragError(f"faiss.use_gpu is true but FAISS has no GPU version of '{faiss.factory}' (GPU: Flat, "
                        "IVF<n>,Flat, IVF<n>,SQ8, IVF<n>,PQ<m> at 8 bits; not HNSW, Refine or fast-scan 'fs')")
    gpu = 1.0 if capable and (faiss.use_gpu is True or (faiss.use_gpu == "auto" and cluster.gpus > 0)) else 0.0
    node = max(1, int(cluster.max_node_cpus))
    share = max(1, min(node, int(cluster.cpus // cfg.shards)))
    if gpu:  # a GPU node's CPUs split between its GPUs, so every GPU gets a task
        share = max(1, min([share] + [int(n.cpus // n.gpus) for n in cluster.nodes if n.gpus]))
    one = "HNSW" in faiss.factory.upper()
    gpu_cap = [int(cluster.gpus)] if gpu and cluster.gpus else []
    at_once = min(cfg.shards, max(1, int(cluster.cpus // share)), *gpu_cap)
    device = "cuda" if gpu and kernels == "auto" else "cpu"
    # On a local Ray (nothing joins it later) a task never asks for the whole node: an actor left holding a
    # fraction of a CPU (a failed build's Ray Data actor, until Python's cyclic GC frees it) would make it
    # wait forever. The claim only places the task; its FAISS threads stay the node's.
    most = max(1, node - 1) if cluster.local else node
    return [StagePlan("train", "tasks", 1, 1, num_cpus=float(min(node, most)), threads=1 if one else node),
            StagePlan("build-shards", "tasks", 1, max(1, at_once), num_cpus=float(min(share, most)), num_gpus=gpu,
                      device=device, threads=1 if one else share)]


def _check_fits(plan: ResourcePlan) -> None:
    """On a local Ray (nothing joins it later) a pool or a task it cannot hold would wait forever: say so."""
    cluster = plan.cluster
    if not cluster.local:
        return
    for stage in plan.stages.values():
        need = stage.num_gpus * (stage.min_size if stage.compute == "actors" else 1)
        if need > cluster.gpus:
            raise QragError(f"the {stage.name} stage needs {need:g} GPUs at once but this machine's Ray has "
                            f"{cluster.gpus:g}: set its num_gpus to 0 for CPU, or start Ray with GPUs (on a CPU "
                            f"machine logical ones: RAY_OVERRIDE_RESOURCES='{{\"GPU\": {need:g}}}' "
                            f"with {KERNELS_ENV}=cpu)")
    # the stream runs chunking, tokenizing and embedding at once: their smallest pools together
    streamed = [plan.stages[n] for n in ("read+chunk", "tokenize", "embed") if n in plan.stages]
    need = sum(s.num_cpus * (s.min_size if s.compute == "actors" else 1) for s in streamed)
    if need > cluster.cpus:
        raise QragError(f"the stream's stages need {need:g} CPUs at once but this machine's Ray has {cluster.cpus:g}: "
                        "set build.num_cpus (logical CPUs) to at least that")
