"""`qrag index`: the Ray Data pipeline from a corpus to a published, sharded question index.

read -> normalize -> chunk -> (atomize) -> generate (cache | backend) -> parse -> vector rows -> embed
(actor pool) -> vectors partitioned by shard -> one task per shard: filters + FAISS + metadata ->
manifest -> atomic publish. Each step's logic lives in a pure module; this file only wires them.
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
from qrag_ray.index.format import (CHUNKS, chunk_key, check_output_dir, new_staging_dir, publish,
                                   write_manifest)

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
    generation: GenerationStats = field(default_factory=GenerationStats)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    manifest: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("manifest")
        return d


# ---------------------------------------------------------------- Ray setup


def ensure_ray(address: str | None = None, num_cpus: int | None = None, quiet: bool | None = None) -> None:
    """Join a cluster when an address is given, else start Ray in-process.

    In-process Ray gets more logical CPUs than cores: the vLLM-CPU engine, the tokenizer stages and the
    embedder each hold a CPU slot, and with 2 slots the engine would never schedule (MODELS.md).
    """
    import ray
    import ray.data

    ctx = ray.data.DataContext.get_current()
    # A QragError raised in a map UDF (bad record, line N) must reach the CLI as itself: Ray Data's
    # default UserCodeException wrapper loses the cause on the way back, which would turn one clear
    # line into a traceback.
    ctx.raise_original_map_exception = True
    from qrag_ray import logs, progress

    quiet = logs.verbosity() == 0 if quiet is None else quiet
    logs.quiet_ray_data()
    progress.attach_ray_data(ctx)  # our stage display reads Ray Data's operators; its own bars stay off
    if ray.is_initialized():
        return
    env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}}
    kwargs = dict(runtime_env=env, logging_level="ERROR" if quiet else "INFO", log_to_driver=not quiet)
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, **kwargs)
    else:
        # address="local": a new in-process Ray, never one that `ray start` happened to leave in
        # /tmp/ray on this machine (ray.init(None) would join it and then reject num_cpus).
        for attempt in range(3):
            try:
                ray.init(address="local", num_cpus=num_cpus or max(8, 4 * (os.cpu_count() or 2)),
                         include_dashboard=False, **kwargs)
                break
            except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this
                # Ray gives a new raylet a fixed 30 s to register; on a 2-core laptop already busy
                # (an LLM engine, another Ray) that is not always enough, and a retry usually is.
                if "timed out during startup" not in str(e) or attempt == 2:
                    raise
                ray.shutdown()


# ---------------------------------------------------------------- pure row builders


def chunk_rows(doc: dict, cfg: IndexConfig) -> list[dict]:
    from qrag_ray.text.chunking import chunk_document

    rows = []
    for c in chunk_document(doc, cfg.chunker):
        idx = chunk_key(c["chunk_id"])
        c["chunk_idx"] = idx
        c["shard"] = idx % cfg.shards
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
    return vector_rows(chunk, kinds, qs, sentences, aux_questions=aux_q and bool(qs))


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
    """Build the index described by cfg and publish it at cfg.output atomically."""
    _check_input(cfg)
    out = check_output_dir(cfg.output, cfg.overwrite)
    report = BuildReport(output=str(out))
    timer = _Timer(report, console)
    kinds, gran = representation_plan(cfg)
    gcfg = cfg.generator
    aux_q = (cfg.filters.prune_tau is not None or cfg.filters.min_question_chunk_sim is not None
             or cfg.filters.require_content_overlap)
    from qrag_ray.io.readers import read_corpus

    # Validate what we can before starting Ray: the reader resolves files now.
    from qrag_ray.io.readers import resolve_files

    from qrag_ray.io.precheck import precheck_build

    precheck_build(cfg, resolve_files(cfg.input, cfg.format))  # small corpora: every record, now
    ensure_ray(cfg.address, cfg.num_cpus)
    import ray
    import ray.data

    staging = new_staging_dir(out)
    t_start = time.perf_counter()
    try:
        with timer.stage("read+chunk"):
            qcol = gcfg.precomputed_column if gcfg.backend == "precomputed" else None
            docs = read_corpus(cfg.input, cfg.format, questions_column=qcol).materialize()
            report.documents = docs.count()
            if report.documents == 0:
                raise QragError(f"empty corpus: no documents in {cfg.input}")

            def chunker(batch: dict) -> dict:
                rows = [r for d in _rows_of(batch) for r in chunk_rows(d, cfg)]
                cols = {k: np.asarray([r[k] for r in rows], dtype=object)
                        for k in ("chunk_id", "doc_id", "title", "text")}
                cols["chunk_idx"] = np.asarray([r["chunk_idx"] for r in rows], np.int64)
                cols["shard"] = np.asarray([r["shard"] for r in rows], np.int32)
                if qcol:
                    arr = np.empty(len(rows), dtype=object)
                    for i, r in enumerate(rows):
                        arr[i] = r.get("questions", [])
                    cols["questions"] = arr
                return cols

            chunks = docs.map_batches(chunker, batch_format="numpy", batch_size=1024).materialize()
            report.chunks = chunks.count()
            if report.chunks == 0:
                raise QragError(f"empty corpus: the documents in {cfg.input} hold no text")
            _write_chunks(chunks, staging)

        gen_rows = None
        if gcfg.backend in ("vllm", "openai") and (gran is not None or ("sentence" in kinds and gcfg.atoms == "llm")):
            from qrag_ray.generation.cache import QuestionCache
            from qrag_ray.generation.requests import atomize_request, question_requests
            from qrag_ray.generation.stage import generate

            cache = QuestionCache(cfg.cache_dir)
            model_path = None
            if gcfg.backend == "vllm":
                with timer.stage("prepare-model"):
                    from qrag_ray.models.registry import resolve_llm

                    model_path = resolve_llm(gcfg.model)
            if gcfg.atoms == "llm" and (gran == "atom" or "sentence" in kinds):
                with timer.stage("atomize"):
                    areq = chunks.map_batches(
                        lambda b: _request_columns([atomize_request(r, gcfg) | _payload(r) for r in _rows_of(b)]),
                        batch_format="numpy").materialize()
                    answered, st = generate(areq, gcfg, cache, model_path)
                    report.generation.add(st, "atomize")
                    chunks = answered.map_batches(_attach_atoms, batch_format="numpy").materialize()
            if gran is not None:
                with timer.stage("generate"):
                    def reqs(b: dict) -> dict:
                        out = []
                        for r in _rows_of(b):
                            atoms = atoms_of(r, cfg) if gran == "atom" else None
                            out += [q | _payload(r) for q in question_requests(r, atoms, gcfg, gran)]
                        return _request_columns(out)

                    qreq = chunks.map_batches(reqs, batch_format="numpy").materialize()
                    if qreq.count():
                        answered, st = generate(qreq, gcfg, cache, model_path)
                        report.generation.add(st, "questions")
                        gen_rows = answered.map_batches(
                            lambda b: _to_columns([v for r in _rows_of(b) for v in question_vector_rows(r, kinds, aux_q)]),
                            batch_format="numpy")

        with timer.stage("embed"):
            base = chunks.map_batches(
                lambda b: _to_columns([v for r in _rows_of(b) for v in base_vector_rows(r, kinds, cfg, aux_q)]),
                batch_format="numpy")
            rows = base.union(gen_rows) if gen_rows is not None else base
            rows = rows.materialize()
            qk = "question" if ("question" in kinds or aux_q) else next(
                (k for k in ("quote", "atomquote") if k in kinds), None)
            if qk:
                report.questions = rows.filter(lambda r: r["kind"] == qk and r["qn"] >= 0).count()
            embedded = _embed(rows, cfg)
            vec_dir = staging / "_vectors"
            embedded.write_parquet(str(vec_dir), partition_cols=["shard"])

        with timer.stage("build-shards"):
            dim = _dim_of(vec_dir, cfg)
            shard_stats = _build_shards(vec_dir, staging, cfg, dim)
            shutil.rmtree(vec_dir, ignore_errors=True)
            if cfg.bm25.enabled:  # shards indexed their own chunks; now one IDF for all of them
                from qrag_ray.index.lexical import globalize_idf

                globalize_idf([staging / s["bm25"] for s in shard_stats if "bm25" in s])

        report.vectors = sum(s["vectors"] for s in shard_stats)
        report.vectors_before_filters = sum(s["vectors_before_filters"] for s in shard_stats)
        report.stage_seconds["total"] = round(time.perf_counter() - t_start, 3)
        manifest = {
            "representation": cfg.representation, "kinds": kinds, "question_granularity": gran,
            "embedder": {"model": cfg.embedder.model, "dim": dim, "normalize": True},
            "faiss": {"factory": cfg.index.factory, "metric": "inner_product"},
            "num_shards": cfg.shards, "shards": shard_stats,
            "counts": {"documents": report.documents, "chunks": report.chunks, "questions": report.questions,
                       "vectors": report.vectors, "vectors_before_filters": report.vectors_before_filters},
            "generation": {k: v for k, v in asdict(report.generation).items() if k != "by_stage"},
            "config": cfg.model_dump(mode="json"), "stage_seconds": report.stage_seconds,
        }
        report.manifest = write_manifest(staging, manifest)
        report.index_bytes = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file())
        publish(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return report


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

    def __init__(self, model: str, batch_size: int, max_seq_length: int | None, threads: int | None):
        from qrag_ray.embedding import Embedder

        self.e = Embedder(model, batch_size, max_seq_length, threads)

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
        _EmbedStage, fn_constructor_args=(e.model, e.batch_size, e.max_seq_length, threads),
        compute=ray.data.ActorPoolStrategy(size=e.actors), num_gpus=e.num_gpus or None,
        num_cpus=None if e.num_gpus else 1, batch_size=max(e.batch_size, 256), batch_format="numpy")


def _write_chunks(chunks, staging: Path) -> None:
    """chunks.parquet as one file, streamed block by block (never the whole corpus in memory)."""
    import ray

    schema = pa.schema([("chunk_idx", pa.int64()), ("chunk_id", pa.string()), ("doc_id", pa.string()),
                        ("title", pa.string()), ("text", pa.string()), ("shard", pa.int32())])
    seen: set[int] = set()
    with pq.ParquetWriter(staging / CHUNKS, schema) as w:
        for ref in chunks.select_columns(schema.names).to_arrow_refs():
            t = ray.get(ref).select(schema.names).cast(schema)
            ids = t.column("chunk_idx").to_numpy()
            dup = [i for i in ids.tolist() if i in seen]
            if dup or len(set(ids.tolist())) != len(ids):
                bad = t.column("chunk_id")[int(np.flatnonzero(np.isin(ids, dup))[0]) if dup else 0].as_py()
                raise QragError(f"duplicate document id: chunk {bad!r} occurs twice (document ids must be unique)")
            seen.update(ids.tolist())
            w.write_table(t)


def _dim_of(vec_dir: Path, cfg: IndexConfig) -> int:
    for f in vec_dir.rglob("*.parquet"):
        t = pq.read_table(f, columns=["vector"])
        if t.num_rows:
            return t.schema.field("vector").type.list_size
    from qrag_ray.embedding import embedder_dim

    return embedder_dim(cfg.embedder.model)


def _build_shards(vec_dir: Path, staging: Path, cfg: IndexConfig, dim: int) -> list[dict]:
    import ray

    from qrag_ray.index.writer import write_shard

    gpu = cfg.index.use_gpu is True or (cfg.index.use_gpu == "auto" and ray.cluster_resources().get("GPU", 0) > 0)

    # SPREAD: on a cluster, shard builds go to different nodes (memory and CPU of one node are not
    # enough at scale); each build records where it ran (`built_on`, kept in the manifest).
    @ray.remote(num_gpus=1 if gpu else 0, num_cpus=1, scheduling_strategy="SPREAD")
    def build(shard: int, files: list[str]) -> dict:
        schema_cols = ["chunk_idx", "kind", "text", "qn", "store", "vector"]
        tables = [pq.read_table(f, columns=schema_cols) for f in files]
        table = pa.concat_tables(tables) if tables else None
        if table is None:
            table = pa.table({"chunk_idx": pa.array([], pa.int64()), "kind": pa.array([], pa.string()),
                              "text": pa.array([], pa.string()), "qn": pa.array([], pa.int32()),
                              "store": pa.array([], pa.bool_()),
                              "vector": pa.array([], pa.list_(pa.float32(), dim))})
        # one (chunk, kind, text) once: the same text generated twice must not count twice
        table = _drop_duplicate_rows(table)
        stats = write_shard(shard, table, staging, cfg.filters, cfg.index, dim, cfg.bm25)
        ctx = ray.get_runtime_context()
        stats["built_on"] = {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address()}
        return stats

    refs = []
    for s in range(cfg.shards):
        files = sorted(str(f) for f in (vec_dir / f"shard={s}").glob("*.parquet")) if (vec_dir / f"shard={s}").is_dir() else []
        refs.append(build.remote(s, files))
    return ray.get(refs)


def _drop_duplicate_rows(table: pa.Table) -> pa.Table:
    if table.num_rows == 0:
        return table
    keys = list(zip(table.column("chunk_idx").to_pylist(), table.column("kind").to_pylist(),
                    table.column("text").to_pylist(), table.column("store").to_pylist()))
    seen, keep = set(), []
    for i, k in enumerate(keys):
        if k not in seen:
            seen.add(k)
            keep.append(i)
    return table if len(keep) == table.num_rows else table.take(pa.array(keep, pa.int64()))
