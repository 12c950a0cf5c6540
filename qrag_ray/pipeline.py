"""`qrag index`: the Ray Data pipeline from a corpus to a published, sharded question index.

read -> normalize -> chunk -> (atomize) -> generate (cache | backend) -> parse -> vector rows -> embed
(actor pool) -> vectors partitioned by shard -> one task per shard: filters + FAISS + metadata ->
manifest -> atomic publish. Each step's logic lives in a pure module; this file only wires them.

Size: over 400 lines because the wiring of every stage (streaming, checkpoints, resume, incremental
builds, progress) is read in one place; the stages themselves live in index/stages.py and friends.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from qrag_ray.config import IndexConfig, representation_plan
from qrag_ray.errors import QragError
from qrag_ray.generation.stage import GenerationStats
from qrag_ray.index.format import (check_output_dir, chunk_key, new_staging_dir, publish, shard_of,
                                   write_manifest)
from qrag_ray.runtime import ensure_ray

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
    manifest: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("manifest")
        return d





def chunk_rows(doc: dict, cfg: IndexConfig) -> list[dict]:
    from qrag_ray.text.chunking import chunk_document

    rows = []
    for c in chunk_document(doc, cfg.chunker):
        idx = chunk_key(c["chunk_id"])
        c["chunk_idx"] = idx
        c["shard"] = shard_of(idx, cfg.shards)
        if "questions" in doc:
            c["questions"] = list(doc["questions"])
        rows.append(c)
    return rows


def atoms_of(chunk: dict, cfg: IndexConfig) -> list[str]:
    from qrag_ray.text.sentences import split_sentences

    if cfg.generator.atoms == "llm" and chunk.get("atoms") is not None:
        return [a for a in list(chunk["atoms"]) if a]
    return split_sentences(chunk["text"])


def base_vector_rows(chunk: dict, kinds: list[str], cfg: IndexConfig, aux_q: bool) -> list[dict]:
    """Chunk, sentence and window rows (no LLM needed); precomputed questions join here too."""
    from qrag_ray.representations import vector_rows

    sentences = atoms_of(chunk, cfg) if {"sentence", "window"} & set(kinds) else None
    qs = list(chunk.get("questions") or []) if cfg.generator.backend == "precomputed" else []
    return vector_rows(chunk, kinds, qs, sentences, aux_questions=aux_q and bool(qs), title=chunk.get("title"),
                       title_prefix=cfg.title_prefix)


def question_vector_rows(row: dict, kinds: list[str], aux_q: bool) -> list[dict]:
    """Vector rows for the questions of one answered request (no chunk row: base rows have it)."""
    from qrag_ray.generation.parsing import parse_output
    from qrag_ray.representations import vector_rows

    qs = parse_output(row.get("raw") or "", row.get("output") or "questions") if row.get("raw") else []
    qs = [q if isinstance(q, str) else q[0] for q in qs]
    rows = vector_rows(row, kinds, qs, None, aux_questions=aux_q, atom=row.get("atom") or None)
    unit = int(row.get("unit", -1))
    out = []
    for r in rows:
        if r["kind"] == "chunk":
            continue
        if r["qn"] >= 0:
            r["qn"] = (unit + 1) * 1000 + r["qn"]  # unique per chunk across atoms
        out.append(r)
    return out


def _to_columns(rows: list[dict]) -> dict:
    cols = ("chunk_idx", "shard", "kind", "text", "embed_text", "qn", "store")
    if not rows:
        return {"chunk_idx": np.zeros(0, np.int64), "shard": np.zeros(0, np.int32),
                "kind": np.zeros(0, object), "text": np.zeros(0, object), "embed_text": np.zeros(0, object),
                "qn": np.zeros(0, np.int32), "store": np.zeros(0, bool)}
    out = {c: [r[c] for r in rows] for c in cols}
    return {"chunk_idx": np.asarray(out["chunk_idx"], np.int64), "shard": np.asarray(out["shard"], np.int32),
            "kind": np.asarray(out["kind"], object), "text": np.asarray(out["text"], object),
            "embed_text": np.asarray(out["embed_text"], object), "qn": np.asarray(out["qn"], np.int32),
            "store": np.asarray(out["store"], bool)}


def _rows_of(batch: dict) -> list[dict]:
    n = len(next(iter(batch.values()))) if batch else 0
    return [{k: (v[i].tolist() if isinstance(v[i], np.ndarray) else v[i]) for k, v in batch.items()} for i in range(n)]


# ---------------------------------------------------------------- the pipeline


class _Timer:
    def __init__(self, report: BuildReport, console):
        self.report, self.console = report, console

    def stage(self, name: str):
        timer = self

        class _Ctx:
            def __enter__(self):
                from qrag_ray.progress import stage

                self.t0 = time.perf_counter()
                self.shown = stage(timer.console, name)  # live rows, rate and ETA (qrag_ray.progress)
                self.shown.__enter__()
                return self

            def __exit__(self, *exc):
                dt = time.perf_counter() - self.t0
                timer.report.stage_seconds[name] = round(timer.report.stage_seconds.get(name, 0) + dt, 3)
                return self.shown.__exit__(*exc)

        return _Ctx()


def _check_input(cfg: IndexConfig) -> None:
    if not cfg.input:
        raise QragError("--input is required")
    if not cfg.output:
        raise QragError("--output is required")
    if "://" not in cfg.input and not any(ch in cfg.input for ch in "*?[") and not Path(cfg.input).exists():
        raise QragError(f"input not found: {cfg.input}")


def build_index(cfg: IndexConfig, console=None) -> BuildReport:
    """Build the index described by cfg and publish it at cfg.output atomically.

    Named stages, each its own function: prepare (checks, work dir) -> stream (read, chunk, generate,
    embed: overlapped, checkpointed by the workers) -> train (shared quantizer, from a sample) ->
    build_shards (one task per shard) -> assemble + publish. A killed build re-run with the same
    config resumes from the work dir and publishes the same bytes (manifest `content_hash`)."""
    b = _prepare(cfg, console)
    try:
        _stream(b)
        _train(b)
        _build_shards(b)
        _assemble_and_publish(b)
    except QragError:
        # a user error: nothing worth resuming (and nothing left beside the output)
        shutil.rmtree(b.work, ignore_errors=True)
        raise
    finally:
        if b.staging is not None:
            shutil.rmtree(b.staging, ignore_errors=True)
    if not cfg.build.keep_work:
        shutil.rmtree(b.work, ignore_errors=True)
    return b.report


_LIGHT_CPU = 0.5  # CPU request of the light per-row stages (chunking, row building)


@dataclass
class _Build:
    """What the stages share: config, report, work dir and this run's id."""

    cfg: IndexConfig
    report: BuildReport
    timer: "_Timer"
    console: object
    out: Path
    work: Path
    run: str
    resumed: bool
    kinds: list
    gran: str | None
    aux_q: bool
    t_start: float
    dim: int = 0
    rows: int = 0
    trained: str | None = None
    shard_stats: list = field(default_factory=list)
    staging: Path | None = None
    chunks_ds: object = None  # materialized chunks when the LLM path needed them
    inputs: str = ""  # fingerprint of the input files and deletions: a finished stream is reused only for the same


def _prepare(cfg: IndexConfig, console) -> _Build:
    """Validate before starting Ray (the reader resolves files now), then open the work dir: the same
    config over the same input files finds the checkpoints of an interrupted run."""
    from qrag_ray.index import checkpoint as ck
    from qrag_ray.io.readers import resolve_files

    _check_input(cfg)
    out = check_output_dir(cfg.output, cfg.overwrite)
    files = resolve_files(cfg.input, cfg.format)
    report = BuildReport(output=str(out))
    kinds, gran = representation_plan(cfg)
    aux_q = (cfg.filters.prune_tau is not None or cfg.filters.min_question_chunk_sim is not None
             or cfg.filters.require_content_overlap)
    for extra in cfg.build.extra_inputs:
        files += resolve_files(extra, cfg.format)
    from qrag_ray.io.precheck import precheck_build

    precheck_build(cfg, files)  # small corpora: every record, on the driver, before Ray starts or anything is written
    _warn_uncalibrated(cfg)  # after the checks: a build that fails says one thing
    work = ck.work_dir_for(out, cfg.build.work_dir)
    resumed = ck.open_work_dir(work, ck.work_key(cfg.model_dump(mode="json")))
    ensure_ray(cfg.address, cfg.num_cpus)
    if resumed and console:
        console.print(f"[bold]resuming[/] from checkpoints in {work}")
    return _Build(cfg=cfg, report=report, timer=_Timer(report, console), console=console, out=out, work=work,
                  run=ck.new_run_id(), resumed=resumed, kinds=kinds, gran=gran, aux_q=aux_q,
                  t_start=time.perf_counter(),
                  inputs=ck.stable_hash([ck.input_fingerprint(files), cfg.build.delete_ids,
                                         [ck.input_fingerprint([f]) for f in cfg.build.delete_ids]]))


def _warn_uncalibrated(cfg: IndexConfig) -> None:
    """A preset's fusion offsets were measured with one embedder; with another (and the offsets left
    as the preset set them) say so once, at build time."""
    from qrag_ray.presets import PRESETS, calibration_note

    note = calibration_note(cfg.representation, cfg.embedder.model)
    preset = PRESETS.get(cfg.representation)
    if note and preset is not None and cfg.search.kind_bias == preset.search.get("kind_bias", {}):
        log.warning(note)


def _stream(b: _Build) -> None:
    """read -> chunk -> (generate) -> vector rows -> embed, streamed; workers write the parts. A run
    whose stream already finished (stream.json) skips it: only the shard builds were left."""
    import json

    from qrag_ray.index import checkpoint as ck

    done = b.work / "stream.json"
    st = json.loads(done.read_text()) if done.is_file() else {}
    if st.get("inputs") == b.inputs:
        b.run, b.rows, b.dim = st["run"], st["rows"], st["dim"]
        for k in ("documents", "chunks", "questions"):
            setattr(b.report, k, st[k])
        b.report.vectors_reused = st["rows"]
        b.report.stage_seconds.update({k: 0.0 for k in ("read+chunk", "embed")})
        return
    cfg, report = b.cfg, b.report
    t0 = time.perf_counter()
    with b.timer.stage("stream"):
        chunks = _chunk_stage(b)
        gen_rows = _generate_stage(b, chunks)
        rows = _vector_rows_stage(b, chunks, gen_rows)
        summary = _embed_stage(b, rows)
        counts = {"rows": 0, "embedded": 0, "reused": 0, "questions": 0, "seconds": 0.0}
        for batch in summary.iter_batches(batch_size=None, batch_format="numpy"):
            for k in counts:
                counts[k] += batch[k].sum().item()
    parts = ck.registered_parts(b.work, b.run)
    report.documents = sum(p["documents"] for p in parts)
    report.chunks = sum(p["chunks"] for p in parts)
    if report.documents == 0:
        raise QragError(f"empty corpus: no documents in {cfg.input}")
    if report.chunks == 0:
        raise QragError(f"empty corpus: the documents in {cfg.input} hold no text")
    report.questions = int(counts["questions"])
    report.vectors_embedded, report.vectors_reused = int(counts["embedded"]), int(counts["reused"])
    report.stage_seconds["read+chunk"] = round(sum(p.get("seconds", 0.0) for p in parts), 3) or 1e-3
    report.stage_seconds["embed"] = round(counts["seconds"], 3) or 1e-3
    report.stage_seconds["stream"] = round(time.perf_counter() - t0, 3)
    b.rows = int(counts["rows"])
    b.dim = _dim_of(b)
    ck.atomic_write_text(done, json.dumps({"inputs": b.inputs, "run": b.run, "rows": b.rows, "dim": b.dim, "documents": report.documents,
                                           "chunks": report.chunks, "questions": report.questions}))


def _chunk_stage(b: _Build):
    """Documents -> chunk rows (lazy); every batch also lands as chunk parts in the work dir."""
    from qrag_ray.index.stages import write_chunk_part
    from qrag_ray.io.readers import read_corpus

    cfg = b.cfg
    gcfg = cfg.generator
    qcol = gcfg.precomputed_column if gcfg.backend == "precomputed" else None
    docs = read_corpus(cfg.input, cfg.format, questions_column=qcol)
    for extra in cfg.build.extra_inputs:  # --append: earlier versions' inputs plus the new documents
        docs = docs.union(read_corpus(extra, cfg.format, questions_column=qcol))
    work, run = b.work, b.run
    deleted = _deleted_ids(cfg.build.delete_ids)

    def chunker(batch: dict) -> dict:
        t0 = time.perf_counter()
        drows = [d for d in _rows_of(batch) if str(d["doc_id"]) not in deleted]
        rows = [r for d in drows for r in chunk_rows(d, cfg)]
        cols = {k: np.asarray([r[k] for r in rows], dtype=object) for k in ("chunk_id", "doc_id", "title", "text")}
        cols["chunk_idx"] = np.asarray([r["chunk_idx"] for r in rows], np.int64)
        cols["shard"] = np.asarray([r["shard"] for r in rows], np.int32)
        if qcol:
            arr = np.empty(len(rows), dtype=object)
            for i, r in enumerate(rows):
                arr[i] = r.get("questions", [])
            cols["questions"] = arr
        if drows:
            write_chunk_part(cols, len(drows), work, run, seconds=time.perf_counter() - t0)
        return cols

    # its own CPU request (not the embedder's) keeps Ray Data from fusing chunking into the embedding
    # actors: the two stages run side by side instead of taking turns in one process
    return docs.map_batches(chunker, batch_format="numpy", batch_size=cfg.build.docs_per_batch, num_cpus=_LIGHT_CPU)


def _deleted_ids(files: list[str]) -> frozenset:
    """Document ids to leave out, one per line (--delete-ids); blank lines ignored."""
    ids: set[str] = set()
    for f in files:
        p = Path(f)
        if not p.is_file():
            raise QragError(f"--delete-ids file not found: {f}")
        ids.update(line.strip() for line in p.read_text(encoding="utf-8").splitlines() if line.strip())
    return frozenset(ids)


def _generate_stage(b: _Build, chunks):
    """LLM questions (and atoms) through the question cache; None when the representation needs no
    LLM. The generation join needs its requests materialized, so this path is not streamed yet."""
    cfg, gcfg, kinds, gran = b.cfg, b.cfg.generator, b.kinds, b.gran
    if not (gcfg.backend in ("vllm", "openai") and (gran is not None or ("sentence" in kinds and gcfg.atoms == "llm"))):
        return None
    from qrag_ray.generation.cache import QuestionCache
    from qrag_ray.generation.requests import atomize_request, question_requests
    from qrag_ray.generation.stage import generate

    b.chunks_ds = chunks = chunks.materialize()
    cache = QuestionCache(cfg.cache_dir)
    model_path = None
    if gcfg.backend == "vllm":
        with b.timer.stage("prepare-model"):
            from qrag_ray.models.registry import resolve_llm

            model_path = resolve_llm(gcfg.model)
    if gcfg.atoms == "llm" and (gran == "atom" or "sentence" in kinds):
        with b.timer.stage("atomize"):
            areq = chunks.map_batches(
                lambda bt: _request_columns([atomize_request(r, gcfg) | _payload(r) for r in _rows_of(bt)]),
                batch_format="numpy").materialize()
            answered, st = generate(areq, gcfg, cache, model_path)
            b.report.generation.add(st, "atomize")
            b.chunks_ds = chunks = answered.map_batches(_attach_atoms, batch_format="numpy").materialize()
    if gran is None:
        return None
    with b.timer.stage("generate"):
        def reqs(bt: dict) -> dict:
            out = []
            for r in _rows_of(bt):
                atoms = atoms_of(r, cfg) if gran == "atom" else None
                out += [q | _payload(r) for q in question_requests(r, atoms, gcfg, gran)]
            return _request_columns(out)

        qreq = chunks.map_batches(reqs, batch_format="numpy").materialize()
        if not qreq.count():
            return None
        answered, st = generate(qreq, gcfg, cache, model_path)
        b.report.generation.add(st, "questions")
        kinds_, aux_q = b.kinds, b.aux_q
        return answered.map_batches(
            lambda bt: _gen_columns([r for r in _rows_of(bt)], kinds_, aux_q), batch_format="numpy")


def _vector_rows_stage(b: _Build, chunks, gen_rows):
    """Chunk rows -> the rows to embed (chunk, sentence, precomputed questions...), plus the LLM's."""
    from qrag_ray.index.stages import vector_columns

    chunks = b.chunks_ds if b.chunks_ds is not None else chunks
    cfg, kinds, aux_q = b.cfg, b.kinds, b.aux_q

    def base(bt: dict) -> dict:
        out = []
        for r in _rows_of(bt):
            for i, v in enumerate(base_vector_rows(r, kinds, cfg, aux_q)):
                out.append(v | {"ord": i})
        return vector_columns(out)

    rows = chunks.map_batches(base, batch_format="numpy", num_cpus=_LIGHT_CPU)
    return rows.union(gen_rows) if gen_rows is not None else rows


def _gen_columns(rows: list[dict], kinds: list[str], aux_q: bool) -> dict:
    from qrag_ray.index.stages import GEN_ORD_BASE, vector_columns

    out = []
    for r in rows:
        unit = int(r.get("unit", -1))
        for i, v in enumerate(question_vector_rows(r, kinds, aux_q)):
            out.append(v | {"ord": (unit + 2) * GEN_ORD_BASE + i})
    return vector_columns(out)


def _embed_stage(b: _Build, rows):
    """The embedding actor pool as the stream's sink: workers write vector parts, one summary row per
    batch comes back to the driver."""
    import ray.data

    from qrag_ray.index.stages import EmbedSink

    cfg, kinds = b.cfg, b.kinds
    e = cfg.embedder
    qk = "question" if ("question" in kinds or b.aux_q) else next(
        (k for k in ("quote", "atomquote") if k in kinds), None)
    threads = None if e.num_gpus else (e.threads or max(1, (os.cpu_count() or 2) // e.actors))
    return rows.map_batches(
        EmbedSink, fn_constructor_args=(e.model, e.batch_size, e.max_seq_length, threads, str(b.work), qk, b.run, e.backend),
        compute=ray.data.ActorPoolStrategy(size=e.actors), num_gpus=e.num_gpus or None,
        num_cpus=None if e.num_gpus else 1, batch_size=cfg.build.rows_per_part, batch_format="numpy")


def _dim_of(b: _Build) -> int:
    from qrag_ray.index import checkpoint as ck

    for f in ck.parquet_files(b.work / "vectors"):
        t = pq.read_metadata(f)
        if t.num_rows:
            return pq.read_schema(f).field("vector").type.list_size
    from qrag_ray.embedding import embedder_dim

    return embedder_dim(b.cfg.embedder.model)


def _train(b: _Build) -> None:
    """IVF/PQ: one quantizer for all shards, trained in a task on a deterministic sample."""
    import ray

    from qrag_ray.index.stages import needs_training, train_quantizer

    if not needs_training(b.cfg.index.factory, b.dim):
        return
    with b.timer.stage("train"):
        task = ray.remote(num_cpus=1)(train_quantizer)
        b.trained = ray.get(task.remote(str(b.work), b.cfg.index.factory, b.cfg.index.train_sample, b.rows, b.dim,
                                        b.run, b.cfg.shards))


def _build_shards(b: _Build) -> None:
    import ray

    cfg = b.cfg
    gpu = cfg.index.use_gpu is True or (cfg.index.use_gpu == "auto" and ray.cluster_resources().get("GPU", 0) > 0)
    with b.timer.stage("build-shards"):
        # SPREAD: on a cluster, shard builds go to different nodes (memory and CPU of one node are not
        # enough at scale); each build records where it ran (`built_on`, kept in the manifest).
        task = ray.remote(num_gpus=1 if gpu else 0, num_cpus=1, scheduling_strategy="SPREAD")(_build_one_shard)
        cfg_json = cfg.model_dump_json()
        b.shard_stats = ray.get([task.remote(s, str(b.work), b.run, cfg_json, b.dim, b.trained)
                                 for s in range(cfg.shards)])
    b.report.shards_reused = sum(1 for s in b.shard_stats if s.pop("reused", False))
    for s in b.shard_stats:
        s.pop("signature", None)
        s.pop("chunk_rows", None)


def _build_one_shard(shard: int, work: str, run: str, cfg_json: str, dim: int, trained: str | None) -> dict:
    import ray

    from qrag_ray.index.stages import build_shard

    stats = build_shard(shard, work, run, cfg_json, dim, trained)
    ctx = ray.get_runtime_context()
    stats["built_on"] = {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address()}
    return stats


def _assemble_and_publish(b: _Build) -> None:
    import ray

    from qrag_ray.index import checkpoint as ck
    from qrag_ray.index.stages import assemble

    cfg, report = b.cfg, b.report
    with b.timer.stage("publish"):
        b.staging = new_staging_dir(b.out)
        ray.get(ray.remote(num_cpus=1)(assemble).remote(str(b.work), str(b.staging), cfg.shards, cfg.bm25.enabled))
        report.vectors = sum(s["vectors"] for s in b.shard_stats)
        report.vectors_before_filters = sum(s["vectors_before_filters"] for s in b.shard_stats)
        report.stage_seconds["total"] = round(time.perf_counter() - b.t_start, 3)
        content = ck.content_config(cfg.model_dump(mode="json"))
        manifest = {
            "representation": cfg.representation, "kinds": b.kinds, "question_granularity": b.gran,
            "embedder": {"model": cfg.embedder.model, "dim": b.dim, "normalize": True},
            "faiss": {"factory": cfg.index.factory, "metric": "inner_product"},
            "num_shards": cfg.shards, "shards": b.shard_stats,
            "counts": {"documents": report.documents, "chunks": report.chunks, "questions": report.questions,
                       "vectors": report.vectors, "vectors_before_filters": report.vectors_before_filters},
            "generation": {k: v for k, v in asdict(report.generation).items() if k != "by_stage"},
            "config": cfg.model_dump(mode="json"), "stage_seconds": report.stage_seconds,
            "content": content,
        }
        report.manifest = write_manifest(b.staging, manifest)
        report.index_bytes = sum(p.stat().st_size for p in b.staging.rglob("*") if p.is_file())
        publish(b.staging, b.out)
        b.staging = None


def _payload(r: dict) -> dict:
    return {"chunk_idx": int(r["chunk_idx"]), "shard": int(r["shard"]), "text": r["text"]}


def _request_columns(rows: list[dict]) -> dict:
    import json

    cols = {"key": [], "messages": [], "output": [], "unit": [], "atom": [], "chunk_idx": [], "shard": [], "text": []}
    for r in rows:
        for k in cols:
            cols[k].append(r.get(k, ""))
    out = {k: np.asarray(v, dtype=object) for k, v in cols.items()}
    # messages travel as a list of {role, content} dicts; numpy object column keeps them intact
    msgs = np.empty(len(rows), dtype=object)
    for i, r in enumerate(rows):
        msgs[i] = [dict(m) for m in r["messages"]]
    out["messages"] = msgs
    out["unit"] = np.asarray(cols["unit"], np.int32)
    out["chunk_idx"] = np.asarray(cols["chunk_idx"], np.int64)
    out["shard"] = np.asarray(cols["shard"], np.int32)
    del json
    return out


def _attach_atoms(batch: dict) -> dict:
    from qrag_ray.generation.parsing import parse_atoms

    atoms = np.empty(len(batch["chunk_idx"]), dtype=object)
    for i, raw in enumerate(batch["raw"]):
        atoms[i] = parse_atoms(raw or "")
    return {"chunk_idx": batch["chunk_idx"], "shard": batch["shard"], "text": batch["text"], "atoms": atoms}


class _EmbedStage:
    """Actor-pool stage: loads the model once, emits vectors as a fixed-size-list column."""

    def __init__(self, model: str, batch_size: int, max_seq_length: int | None, threads: int | None,
                 backend: str = "auto"):
        from qrag_ray.embedding import Embedder

        self.e = Embedder(model, batch_size, max_seq_length, threads, backend)

    def __call__(self, batch: dict) -> pa.Table:
        from qrag_ray.embedding import encode

        vecs = encode(self.e.st, [str(t) for t in batch["embed_text"]], self.e.batch_size)
        flat = pa.array(vecs.reshape(-1), type=pa.float32())
        cols = {k: v for k, v in batch.items() if k != "embed_text"}
        t = pa.table({k: pa.array(v.tolist() if v.dtype == object else v) for k, v in cols.items()})
        return t.append_column("vector", pa.FixedSizeListArray.from_arrays(flat, vecs.shape[1]))


def _embed(rows, cfg: IndexConfig):
    import ray.data

    from qrag_ray.progress import granular

    e = cfg.embedder
    threads = None if e.num_gpus else max(1, (os.cpu_count() or 2) // e.actors)
    return granular(rows).map_batches(
        _EmbedStage, fn_constructor_args=(e.model, e.batch_size, e.max_seq_length, threads, e.backend),
        compute=ray.data.ActorPoolStrategy(size=e.actors), num_gpus=e.num_gpus or None,
        num_cpus=None if e.num_gpus else 1, batch_size=max(e.batch_size, 256), batch_format="numpy")
