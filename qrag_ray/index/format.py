"""On-disk index format (docs/ARCHITECTURE.md): paths, names from content (63-bit keys, hashes), the
typed manifest and its checksums, atomic writes (a temporary name renamed over the path) and publish (a
verified temp directory renamed over the target): no reader sees a half-written file or index."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from qrag_ray.config.search_policy import SearchConfig
from qrag_ray.errors import IndexFormatError, QragError

FORMAT_VERSION = 2  # 2: a shard's row metadata and chunks as Arrow IPC files
READS_FORMATS = (1, 2)
MANIFEST = "manifest.json"
CHUNKS = "chunks.parquet"
SHARDS_DIR = "shards"


def key63(text: str) -> int:
    """Stable 63-bit key of a string (a chunk id, a vector row): int64 columns and FAISS ids, sign bit clear."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") & ((1 << 63) - 1)


def chunk_key(chunk_id: str) -> int:
    """A chunk's `chunk_idx` (FAISS-side arrays hold ints, not strings)."""
    return key63(chunk_id)


def stable_hash(obj) -> str:
    """sha256 of JSON data, key order aside: the same content gives the same name in every run."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def manifest_content_hash(files: dict[str, str], content: dict) -> str:
    """Every file's sha256 plus the content config, no timings or hosts: a resumed build hashes the same."""
    return stable_hash({"files": dict(sorted(files.items())), "content": content})


def shard_of(chunk_idx: int, num_shards: int) -> int:
    """The one placement rule: the pipeline writes a chunk here and the router looks it up here."""
    return chunk_idx % num_shards


def shard_faiss(shard: int) -> str:
    return f"{SHARDS_DIR}/{shard:05d}.faiss"


def shard_meta(shard: int) -> str:
    """The shard's row metadata (chunk key, kind, text per vector), Arrow IPC; earlier indexes: Parquet."""
    return f"{SHARDS_DIR}/{shard:05d}.arrow"


def shard_chunks(shard: int) -> str:
    """The shard's chunks (id, document, title, text) by chunk key, Arrow IPC; chunks.parquet holds all."""
    return f"{SHARDS_DIR}/{shard:05d}.chunks.arrow"


def shard_bm25(shard: int) -> str:
    """A folder: bm25s files plus chunk_idx.npy (qrag_ray.index.lexical)."""
    return f"{SHARDS_DIR}/{shard:05d}.bm25"


def files_under(manifest: "Manifest", folder: str) -> list[str]:
    """The manifest's files inside `folder` (a shard's BM25 folder), for verify_files."""
    return [rel for rel in manifest.files if rel.startswith(folder.rstrip("/") + "/")]


def atomic_write(path: Path, write, suffix: str = "") -> None:
    """`write(tmp)` to a temporary name beside `path`, then rename it to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp{suffix}")
    write(tmp)
    os.replace(tmp, path)


def atomic_save_npy(arr: np.ndarray, path: Path) -> None:
    atomic_write(path, lambda tmp: np.save(tmp, arr), ".npy")  # np.save appends .npy to any other name


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def atomic_write_parquet(table: pa.Table, path: Path) -> None:
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def write_arrow(table: pa.Table, path: Path) -> None:
    """An uncompressed Arrow IPC file of one record batch: `read_table_file` maps it, decoding nothing."""
    with pa.ipc.new_file(path, table.schema) as writer:
        writer.write_table(table.combine_chunks())


def read_table_file(path: Path, columns: list[str] | None = None) -> pa.Table:
    """A shard's table. Arrow IPC is memory-mapped where the filesystem allows: a loaded shard holds no
    decoded copy, its pages load as rows are read and the page cache can drop them. Parquet (indexes
    written before the IPC files) is decoded into memory."""
    if path.suffix != ".arrow":
        return pq.read_table(path, columns=columns)
    try:
        source = pa.memory_map(str(path))
    except OSError:
        source = pa.OSFile(str(path))
    table = pa.ipc.open_file(source).read_all()
    return table.select(columns) if columns else table


def sha256_file(path: str | Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


class _Record(BaseModel):
    # unknown keys are kept and `data` dumps only the keys given: a manifest reads back as it was written
    model_config = ConfigDict(extra="allow", frozen=True)


class EmbedderInfo(_Record):
    model: str
    dim: int
    normalize: bool = True


class FaissInfo(_Record):
    factory: str
    metric: str = "inner_product"


class Counts(_Record):
    documents: int
    chunks: int
    questions: int
    vectors: int
    vectors_before_filters: int


class ShardEntry(_Record):
    """One shard's files and what the build put in them."""

    id: int
    faiss: str
    meta: str
    vectors: int
    vectors_before_filters: int
    chunks: int
    kinds: dict[str, int]
    seconds: float
    built_on: dict[str, str] | None = None  # the node that built it (shard builds spread over a cluster)
    bm25: str | None = None  # the shard's BM25 folder, when built with bm25.enabled
    bm25_docs: int | None = None
    bm25_vocab: int | None = None
    chunk_table: str | None = None  # shard_chunks(id); earlier indexes: the shard's rows of chunks.parquet


class IndexDescription(_Record):
    """What a build records (`write_manifest` adds files and versions); optional: older builds lack it."""

    representation: str
    preset: str | None = None  # the preset's id (name@version) when the representation is a preset
    kinds: list[str] | None = None
    question_granularity: str | None = None
    embedder: EmbedderInfo
    faiss: FaissInfo | None = None
    num_shards: int
    shards: list[ShardEntry]
    counts: Counts | None = None
    generation: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    stage_seconds: dict[str, float] | None = None
    # the index identity (qrag_ray.config.index.index_identity + the metadata schema)
    content: dict[str, Any] | None = None
    metadata_schema: dict[str, str] | None = None  # {field: type} of the documents' metadata (absent: none)

    @model_validator(mode="after")
    def _one_entry_per_shard(self):
        if len(self.shards) != self.num_shards:
            raise ValueError(f"{len(self.shards)} shards listed, num_shards={self.num_shards}")
        return self


class Manifest(IndexDescription):
    """manifest.json of the index at `path`: written once by the build, read by search and serving."""

    format_version: int
    index_version: str  # from the files' checksums: equal indexes have equal versions
    files: dict[str, str]  # path under the index dir -> sha256
    content_hash: str | None = None  # files + content config: equal for a resumed build
    created_at: str | None = None
    path: Path = Field(exclude=True)  # the index directory (not written)

    @cached_property
    def data(self) -> dict[str, Any]:
        """The manifest as JSON data, exactly the keys it was written with."""
        return self.model_dump(mode="json", exclude_unset=True)

    @property
    def dim(self) -> int:
        return self.embedder.dim

    @property
    def embedder_model(self) -> str:
        return self.embedder.model

    def shard(self, i: int) -> ShardEntry:
        return self.shards[i]

    @cached_property
    def recorded(self) -> dict[str, Any]:
        """The recorded config with moved settings in today's place (config.index.recorded_config), read
        once per manifest: every shard load of a version asks it (treat it as read-only)."""
        from qrag_ray.config.index import recorded_config

        return recorded_config(self.config)

    @cached_property
    def search_policy(self) -> SearchConfig:
        """The fusion policy the index was built with (its config's `search` section)."""
        return SearchConfig.model_validate((self.config or {}).get("search") or {})

    @property
    def has_bm25(self) -> bool:
        """Every shard has a BM25 folder (built with bm25.enabled): hybrid search can run."""
        return all(s.bm25 for s in self.shards)

    def file(self, rel: str) -> Path:
        return self.path / rel


def load_manifest(index_dir: str | Path, verify: bool = False) -> Manifest:
    """Read and validate manifest.json; with verify=True also check every file's sha256."""
    folder = Path(index_dir)
    if not folder.is_dir():
        raise IndexFormatError(f"index not found: {folder}")
    mpath = folder / MANIFEST
    if not mpath.is_file():
        raise IndexFormatError(f"{folder} is not a qrag index (no {MANIFEST})")
    try:
        data = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise IndexFormatError(f"corrupt manifest {mpath}: {error}") from None
    if not isinstance(data, dict):
        raise IndexFormatError(f"corrupt manifest {mpath}: not a JSON object")
    format_version = data.get("format_version")
    if format_version not in READS_FORMATS:
        raise IndexFormatError(f"{mpath}: unsupported format_version {format_version!r} (this qrag reads "
                               f"{', '.join(map(str, READS_FORMATS))})")
    try:
        manifest = Manifest.model_validate({**data, "path": folder})
    except ValidationError as error:
        err = error.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        raise IndexFormatError(f"corrupt manifest {mpath}: {where}: {msg}") from None
    for rel in manifest.files:
        if not (folder / rel).is_file():
            raise IndexFormatError(f"index {folder} is incomplete: missing {rel}")
    if verify:
        verify_files(manifest)
    return manifest


def verify_files(manifest: Manifest, rels: list[str] | None = None) -> None:
    for rel in rels if rels is not None else list(manifest.files):
        want = manifest.files.get(rel)
        if want is None:
            raise IndexFormatError(f"{rel} is not listed in {manifest.path / MANIFEST}")
        got = sha256_file(manifest.path / rel)
        if got != want:
            raise IndexFormatError(f"checksum mismatch for {manifest.path / rel}: manifest {want[:12]}…, file "
                                   f"{got[:12]}…")


def write_manifest(tmp_dir: Path, description: IndexDescription) -> Manifest:
    """Checksum every file under tmp_dir and write manifest.json: the description, files and versions."""
    files = {str(p.relative_to(tmp_dir)): sha256_file(p) for p in sorted(tmp_dir.rglob("*"))
             if p.is_file() and p.name != MANIFEST}
    version = hashlib.sha256("".join(rel + files[rel] for rel in sorted(files)).encode()).hexdigest()[:16]
    extra: dict[str, Any] = {"format_version": FORMAT_VERSION, "files": files, "index_version": version,
                             "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if description.content is not None:
        extra["content_hash"] = manifest_content_hash(files, description.content)
    manifest = Manifest.model_validate({**description.model_dump(mode="json", exclude_unset=True), **extra,
                                        "path": tmp_dir})
    atomic_write_text(tmp_dir / MANIFEST, json.dumps(manifest.data, indent=2, sort_keys=True, default=str))
    return manifest


def check_output_dir(output: str | Path, overwrite: bool) -> Path:
    """Refuse to clobber a non-empty directory unless overwrite; refuse a file."""
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise QragError(f"output {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise QragError(f"output directory {out} is not empty (pass --overwrite to replace the index there)")
        if not (out / MANIFEST).is_file():
            raise QragError(f"refusing to overwrite {out}: it is not empty and holds no qrag index")
    return out


def new_staging_dir(output: str | Path) -> Path:
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def publish(staging: Path, output: str | Path) -> Path:
    """Verify `staging` and move it to `output`: the old index moves aside, the new one takes its place,
    the old one is deleted. Between the renames the path is briefly absent, never half-written."""
    out = Path(output)
    verify_files(load_manifest(staging))
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(out, old)
    try:
        os.replace(staging, out)
    except BaseException:
        if old is not None:
            os.replace(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out
