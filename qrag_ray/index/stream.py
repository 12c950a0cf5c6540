"""The build's stream on Ray Data: read -> chunk -> (atomize, generate) -> vector rows -> embed. The
chunker and the embedding actors write checkpoint parts; the driver only sums the sink's counters."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow.parquet as pq

from qrag_ray.embedding import Tokenize, embedder_dim
from qrag_ray.errors import QragError
from qrag_ray.generation.cache import QuestionCache
from qrag_ray.generation.stage import GenerationStats, generate
from qrag_ray.index import workdir
from qrag_ray.index.format import atomic_write_text
from qrag_ray.index.plan import BuildPlan, StageClock
from qrag_ray.index.resource_plan import llm_atoms
from qrag_ray.index.udfs import (
    EmbedSink,
    attach_atoms,
    make_atomize_requests,
    make_base_rows,
    make_chunker,
    make_question_requests,
    make_question_rows,
    progress_rows,
)
from qrag_ray.io.readers import read_corpus
from qrag_ray.models.bundled import resolve_llm
from qrag_ray.runtime import progress

_SAVED = ("run", "rows", "dim", "documents", "chunks", "questions")  # what stream.json keeps of a Streamed


@dataclass(frozen=True)
class Streamed:
    """What the stream leaves for the shard builds: the run whose rows they keep, and its counts."""

    run: str
    rows: int  # vector rows of this run (embedded now or reused)
    dim: int
    documents: int
    chunks: int
    questions: int
    embedded: int  # embedded by this run
    reused: int  # found in the checkpoints of an earlier run
    generation: GenerationStats = field(default_factory=GenerationStats)


def stream(plan: BuildPlan, clock: StageClock) -> Streamed:
    """Run the stream, or reuse the one a killed run finished for the same inputs (stream.json)."""
    done = plan.work / "stream.json"
    saved = json.loads(done.read_text()) if done.is_file() else {}
    if saved.get("inputs") == plan.inputs:
        clock.seconds.update({"read+chunk": 0.0, "embed": 0.0})
        return Streamed(embedded=0, reused=saved["rows"], **{k: saved[k] for k in _SAVED})
    cfg = plan.cfg
    generation = GenerationStats()
    started = time.perf_counter()
    with clock.stage("stream"):
        chunks, questions = _generate(plan, _chunks(plan), clock, generation)
        # the rows to embed that need no LLM (chunk, sentence, precomputed questions...), plus the LLM's
        rows = chunks.map_batches(make_base_rows(plan.kinds, cfg, plan.aux_questions), batch_format="numpy",
                                  num_cpus=plan.stage("read+chunk").num_cpus)
        counts = _embed(plan, rows.union(questions) if questions is not None else rows)
    parts = workdir.registered_parts(plan.work, plan.run)
    documents = sum(p["documents"] for p in parts)
    n_chunks = sum(p["chunks"] for p in parts)
    if documents == 0:
        raise QragError(f"empty corpus: no documents in {cfg.input}")
    if n_chunks == 0:
        raise QragError(f"empty corpus: the documents in {cfg.input} hold no text")
    clock.seconds["read+chunk"] = round(sum(p.get("seconds", 0.0) for p in parts), 3)
    clock.seconds["embed"] = round(counts["seconds"], 3)
    clock.seconds["stream"] = round(time.perf_counter() - started, 3)
    out = Streamed(run=plan.run, rows=counts["rows"], dim=_dim_of(plan), documents=documents, chunks=n_chunks,
                   questions=counts["questions"], embedded=counts["embedded"],
                   reused=counts["rows"] - counts["embedded"], generation=generation)
    atomic_write_text(done, json.dumps({"inputs": plan.inputs, **{k: getattr(out, k) for k in _SAVED}}))
    return out


def _chunks(plan: BuildPlan):
    """Documents -> chunk rows (lazy)."""
    cfg = plan.cfg
    gcfg = cfg.generator
    qcol = gcfg.precomputed_column if gcfg.backend == "precomputed" else None
    docs = read_corpus(cfg.input, cfg.format, questions_column=qcol)
    for extra in cfg.build.extra_inputs:  # --append: earlier versions' inputs plus the new documents
        docs = docs.union(read_corpus(extra, cfg.format, questions_column=qcol))
    # its own CPU request keeps Ray Data from fusing chunking into the embedding actors (taking turns)
    stage = plan.stage("read+chunk")
    chunks = docs.map_batches(make_chunker(cfg, plan.work, plan.run, plan.deleted, bool(qcol)), batch_format="numpy",
                              batch_size=stage.batch_size, num_cpus=stage.num_cpus)
    for upsert in cfg.build.upsert_inputs:  # their documents replace the others' (`plan.deleted` holds their ids)
        written = read_corpus(upsert, "jsonl").map_batches(make_chunker(cfg, plan.work, plan.run, frozenset(), False),
                                                           batch_format="numpy", batch_size=stage.batch_size,
                                                           num_cpus=stage.num_cpus)
        chunks = chunks.union(written)
    return chunks


def _generate(plan: BuildPlan, chunks, clock: StageClock, stats: GenerationStats):
    """LLM atoms and questions through the cache: (chunk rows, question rows or None); not streamed."""
    cfg = plan.cfg
    gcfg = cfg.generator
    gran = plan.granularity
    if "generate" not in plan.resources.stages:
        return chunks, None
    stage = plan.stage("generate")
    atoms = llm_atoms(cfg, plan.kinds, gran)
    chunks = chunks.materialize()
    cache = QuestionCache(cfg.build.cache_dir)
    model_path = None
    if gcfg.backend == "vllm":
        with clock.stage("prepare-model"):
            model_path = resolve_llm(gcfg.model)
    if atoms:
        with clock.stage("atomize"):
            requests = chunks.map_batches(make_atomize_requests(gcfg), batch_format="numpy").materialize()
            answered, generated = generate(requests, gcfg, cache, model_path, stage)
            stats.add(generated, "atomize")
            chunks = answered.map_batches(attach_atoms, batch_format="numpy").materialize()
    if gran is None:
        return chunks, None
    with clock.stage("generate"):
        requests = chunks.map_batches(make_question_requests(cfg, gran), batch_format="numpy").materialize()
        if not requests.count():
            return chunks, None
        answered, generated = generate(requests, gcfg, cache, model_path, stage)
        stats.add(generated, "questions")
        return chunks, answered.map_batches(make_question_rows(plan.kinds, plan.aux_questions), batch_format="numpy")


def _embed(plan: BuildPlan, rows) -> dict:
    """The embedding actor pool, the stream's sink: it writes the vector parts; its counters are summed."""
    import ray.data

    embedder = plan.cfg.embedder
    embed_run = plan.cfg.build.embedder
    if "tokenize" in plan.resources.stages:
        # CPU actors tokenize and sort by length (a pool per embedding GPU, autoscaling within its bounds);
        # the embedding actors only stack and run the model
        tok = plan.stage("tokenize")
        rows = rows.map_batches(Tokenize, fn_constructor_args=(embedder.model, embedder.max_seq_length),
                                compute=ray.data.ActorPoolStrategy(**tok.pool()), num_cpus=tok.num_cpus,
                                batch_size=tok.batch_size, batch_format="numpy")
    stage = plan.stage("embed")
    done = rows.map_batches(
        EmbedSink, fn_constructor_args=(embedder.model, embed_run.batch_size, embedder.max_seq_length, stage.threads,
                                        str(plan.work), plan.question_kind, plan.run, embed_run.backend,
                                        embedder.dtype, embed_run.tokens_per_batch, stage.device),
        compute=ray.data.ActorPoolStrategy(**stage.pool(), max_concurrent_calls_per_actor=EmbedSink.CONCURRENCY,
                                           enable_true_multi_threading=True),
        num_gpus=stage.num_gpus or None, num_cpus=stage.num_cpus, batch_size=stage.batch_size, batch_format="numpy")
    counts = {"rows": 0, "embedded": 0, "questions": 0, "seconds": 0.0}
    shutil.rmtree(plan.work / "runs" / plan.run / "progress", ignore_errors=True)  # a killed run's counts
    # the display's embed row counts the rows of batches still in the model (Ray Data's, whole batches)
    with progress.live_rows("embed", lambda: progress_rows(plan.work, plan.run)):
        for batch in done.iter_batches(batch_size=None, batch_format="numpy"):
            counts["rows"] += len(batch["embedded"])
            counts["embedded"] += int(np.count_nonzero(batch["embedded"]))
            counts["questions"] += int(np.count_nonzero(batch["question"]))
            counts["seconds"] += float(batch["seconds"].sum())
    return counts


def _dim_of(plan: BuildPlan) -> int:
    for file in workdir.parquet_files(plan.work / "vectors"):
        if pq.read_metadata(file).num_rows:
            return pq.read_schema(file).field("vector").type.list_size
    return embedder_dim(plan.cfg.embedder.model)
