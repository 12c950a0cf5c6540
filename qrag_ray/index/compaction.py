"""Compaction (`qrag compact ROOT`, or the Writer by size or age): a tenant's deltas and tombstones folded
into a new index version under its root, built with the ordinary incremental build and published with
the version swap servers already follow, then the write state reset onto it.

The new version is built from the base version's recorded config and inputs (index/incremental.py's
`published_config`), with the documents the API wrote as an upsert input that replaces the same ids'
documents (`build.upsert_inputs`: the writes corpus, index/write_corpus.py) and the documents the API
deleted as a `--delete-ids` file, so it equals a fresh full build of the same documents. The build's work
dir is kept across compactions (the original build's when it is still there), and the deltas' own
vectors are put into it first, so a compaction embeds no document the deltas or an earlier build already
embedded: a big tenant pays for its new rows, and for the shard rebuild.

While it builds, writes go on: they land in new deltas above the generation it folds (`compacting_at`),
which the reset keeps with their tombstones; the log entries it folded are pruned after the reset."""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from qrag_ray.config.index import IndexConfig, recorded_config
from qrag_ray.errors import QragError
from qrag_ray.index import workdir
from qrag_ray.index.build import build_index
from qrag_ray.index.format import atomic_write_parquet, load_manifest, shard_of
from qrag_ray.index.incremental import published_config
from qrag_ray.index.udfs import SAMPLE_STRIPE
from qrag_ray.index.versions import current_version_name, publish_version
from qrag_ray.index.write_corpus import corpus_dir, read_corpus_records, read_ids, write_corpus, write_ids
from qrag_ray.index.write_delta import DELTA_VECTORS
from qrag_ray.index.write_log import LogEntry, WriteLog, writes_dir
from qrag_ray.index.write_state import COMPACT_LOCK, STATE_LOCK, WriteState, load_write_state, locked, publish_state
from qrag_ray.io.metadata import merge_field_types

log = logging.getLogger("qrag.compact")

COMPACT = "compact"  # ROOT/writes/compact/: the build's output before it moves under versions/, and its work dir


def compact(root: str | Path, address: str | None = None, keep: int = 2, console=None) -> dict:
    """Fold `root`'s deltas and tombstones into a new version; a summary. QragError when another compaction
    of the root runs or the root takes no writes."""
    root = Path(root)
    with locked(root, COMPACT_LOCK, wait=False) as held:
        if not held:
            raise QragError(f"a compaction of {root} is running already")
        with locked(root, STATE_LOCK):
            state = load_write_state(root)
            if state is None or (not state.deltas and not state.tombstones):
                return {"root": str(root), "compacted": False, "generation": state.generation if state else 0}
            state = publish_state(replace(state, compacting_at=state.generation))
        try:
            summary = _fold(root, state, address, keep, console)
        except BaseException:
            with locked(root, STATE_LOCK):
                fresh = load_write_state(root)
                if fresh is not None and fresh.compacting_at is not None:
                    publish_state(replace(fresh, compacting_at=None))
            raise
    return summary


def _fold(root: Path, state: WriteState, address: str | None, keep: int, console) -> dict:
    started = time.perf_counter()
    generation = state.generation
    base = load_manifest(root / "versions" / current_version_name(root))
    api, deleted = written_documents(root, state)
    folder = corpus_dir(root)
    corpus_file = folder / f"{generation:012d}.jsonl"
    deleted_file = folder / f"{generation:012d}.deleted"
    write_corpus(corpus_file, api.values())
    write_ids(deleted_file, deleted)
    cfg = compaction_config(root, base, corpus_file if api else None, deleted_file, address)
    inject_vectors(Path(cfg.build.work_dir), cfg, [d.path for d in state.deltas if d.last_seq <= generation], base.dim)
    report = build_index(cfg, console)
    published = publish_version(root, cfg.build.output, keep=keep, move=True)
    new_version = published["index_version"]
    with locked(root, STATE_LOCK):
        fresh = load_write_state(root)
        folded = [d for d in fresh.deltas if d.last_seq <= generation]
        remaining = tuple(d for d in fresh.deltas if d.last_seq > generation)
        tombstones = {doc: s for doc, s in fresh.tombstones.items() if s > generation}
        schemas = [load_manifest(root / "versions" / new_version).metadata_schema or {}]
        schemas += [load_manifest(d.path).metadata_schema or {} for d in remaining]
        schema = merge_field_types([{f: [t, "the index"] for f, t in s.items()} for s in schemas])
        now = time.time()
        since = min([d.created_at for d in remaining] + ([fresh.changed_since or now] if tombstones else []),
                    default=None)
        publish_state(replace(
            fresh, base_version=new_version, base_seq=generation, deltas=remaining, tombstones=tombstones,
            hashes={doc: h for doc, h in fresh.hashes.items() if doc in tombstones}, metadata_schema=schema or None,
            compacting_at=None, corpus=str(corpus_file.relative_to(root)),
            deleted_ids=str(deleted_file.relative_to(root)),
            retired=fresh.retired + tuple((str(d.path.relative_to(root)), now) for d in folded),
            changed_since=since if (remaining or tombstones) else None))
    pruned = WriteLog(root).prune(generation)
    _drop_old_corpora(root, keep={corpus_file.name, deleted_file.name} | _previous_corpus(state))
    return {"root": str(root), "compacted": True, "generation": generation, "index_version": new_version,
            "previous": published["previous"], "documents": report.documents, "chunks": report.chunks,
            "vectors": report.vectors, "vectors_embedded": report.vectors_embedded,
            "vectors_reused": report.vectors_reused, "deltas_folded": len(folded), "log_entries_pruned": pruned,
            "api_documents": len(api), "deleted_ids": len(deleted), "seconds": round(time.perf_counter() - started, 3)}


def written_documents(root: Path, state: WriteState) -> tuple[dict[str, dict], set[str]]:
    """(the writes corpus at the state's generation: doc -> its latest record, the deleted ids): the last
    compaction's, updated by every document a write touched since (its latest write, from the log)."""
    api = {r["doc_id"]: r for r in read_corpus_records(root / state.corpus)} if state.corpus else {}
    deleted = read_ids(root / state.deleted_ids) if state.deleted_ids else set()
    wlog = WriteLog(root)
    entries: dict[int, LogEntry | None] = {}
    for doc, seq in sorted(state.tombstones.items()):
        if doc not in state.hashes:  # its latest write deleted it
            api.pop(doc, None)
            deleted.add(doc)
            continue
        if seq not in entries:
            entries[seq] = wlog.read(seq)
        entry = entries[seq]
        rec = next((r for r in (entry.records or []) if r["doc_id"] == doc), None) if entry else None
        if rec is None or rec.get("hash") != state.hashes[doc]:
            raise QragError(f"{root}: the write log lacks document {doc!r} of write {seq} (pruned or damaged); "
                            "its state cannot be compacted")
        api[doc] = rec
        deleted.discard(doc)
    return api, deleted


def compaction_work_dir(root: Path, recorded: dict) -> Path:
    """The work dir a compaction builds in: the one the base version was built with when it is still
    there (its vectors are reused), else ROOT/writes/compact/work (the first compaction embeds the base's
    documents once; later ones reuse it)."""
    build = recorded.get("build") or {}
    candidates = [build.get("work_dir")]
    if build.get("output"):
        candidates.append(str(workdir.work_dir_for(build["output"])))
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return writes_dir(root) / COMPACT / "work"


def compaction_config(root: Path, base, corpus_file: Path | None, deleted_file: Path,
                      address: str | None) -> IndexConfig:
    """The base version's config with the writes corpus as its upsert input and the deleted ids as its last
    `--delete-ids` file (an earlier compaction's replaced), building into ROOT/writes/compact/build."""
    data = published_config(base)
    if not data.get("input"):
        raise QragError(f"{base.path}: its manifest records no input; a compaction rebuilds from the recorded "
                        "inputs (build it with this qrag first)")
    ours = corpus_dir(root).resolve()
    build = data.setdefault("build", {})
    keep_ids = [p for p in build.get("delete_ids") or [] if ours not in Path(p).resolve().parents]
    out = writes_dir(root) / COMPACT / "build"
    shutil.rmtree(out, ignore_errors=True)
    build.update(delete_ids=keep_ids + [str(deleted_file)], upsert_inputs=[str(corpus_file)] if corpus_file else [],
                 output=str(out), overwrite=True, keep_work=True,
                 work_dir=str(compaction_work_dir(root, recorded_config(base.config))), address=address)
    return IndexConfig.model_validate(data)


def inject_vectors(work: Path, cfg: IndexConfig, deltas: list[Path], dim: int) -> int:
    """Put the deltas' embedded rows into the build's work dir as vector parts (placed for its shard
    count), so its embedding stage finds them done; how many rows."""
    workdir.open_work_dir(work, workdir.work_key(cfg.model_dump(mode="json")))
    rows = 0
    for delta_dir in deltas:
        path = delta_dir / DELTA_VECTORS
        if not path.is_file():
            continue
        vectors = pq.read_table(path)
        if not vectors.num_rows:
            continue
        shard = np.fromiter((shard_of(int(c), cfg.shards) for c in vectors.column("chunk_idx").to_numpy()), np.int32,
                            vectors.num_rows)
        vectors = vectors.set_column(vectors.schema.get_field_index("shard"), "shard", pa.array(shard))
        keys = vectors.column("row_key").to_numpy()
        name = workdir.part_name(keys)
        stripe = (keys % SAMPLE_STRIPE) == 0
        if stripe.any():  # the rows a large build trains its quantizer from, as the embedding sink writes them
            atomic_write_parquet(vectors.filter(pa.array(stripe)), work / "sample" / f"{name}.parquet")
        workdir.write_part(vectors, work / "vectors" / f"{name}.parquet")
        rows += vectors.num_rows
    return rows


def _previous_corpus(state: WriteState) -> set[str]:
    return {Path(p).name for p in (state.corpus, state.deleted_ids) if p}


def _drop_old_corpora(root: Path, keep: set[str]) -> None:
    """The writes corpora of compactions before the last two (no kept version names them any more)."""
    folder = corpus_dir(root)
    for corpus_file in folder.iterdir() if folder.is_dir() else []:
        if corpus_file.name not in keep and not corpus_file.name.startswith("."):
            corpus_file.unlink(missing_ok=True)
