"""Typed configuration for indexing, loadable from YAML; CLI flags override a file's fields.

One IndexConfig describes a whole build, so the manifest records what produced an index and `qrag eval`
can build indexes that differ in one field. `index_identity` derives what an index *is* from the fields'
roles (qrag_ray.config.roles); a representation's preset fills unset fields in `index_config`, only there.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping
from functools import reduce
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from qrag_ray.config.llm import GeneratorConfig
from qrag_ray.config.presets import PRESETS
from qrag_ray.config.roles import Strict, field_roles, select
from qrag_ray.config.search_policy import GENERATED_KINDS, VECTOR_KINDS, SearchConfig, research_knobs_marked
from qrag_ray.config.yaml_file import read_yaml
from qrag_ray.errors import QragError

# `--representation NAME`: a preset (`qrag presets`) as the config values it gives; or kinds joined by '+'
REPRESENTATIONS: dict[str, dict[str, Any]] = {name: p.as_config() for name, p in PRESETS.items()}


class ChunkerConfig(Strict):
    """How documents become chunks. HyPE used 500-token windows with 50 overlap."""

    method: Literal["token", "sentence", "paragraph", "none"] = "token"
    size: int = Field(500, ge=1, description="tokens per window (token) or max sentences (sentence)")
    overlap: int = Field(50, ge=0)

    @model_validator(mode="after")
    def _overlap_lt_size(self) -> "ChunkerConfig":
        if self.method == "token" and self.overlap >= self.size:
            raise ValueError(f"chunker overlap ({self.overlap}) must be smaller than size ({self.size})")
        return self


class FilterConfig(Strict):
    """Question filters, Q–Q pruning and atom compaction, applied per chunk at shard-build time (exact: a
    chunk's vectors share a shard)."""

    prune_tau: float | None = Field(None, gt=-1.0, le=1.0,
                                    description="drop a question whose cosine to a kept one exceeds tau")
    min_question_chunk_sim: float | None = Field(
        None, description="drop questions whose cosine to their own chunk is below this")
    require_content_overlap: bool = False  # drop questions sharing no content word with their chunk
    keep_chunk_fallback: bool = True  # a chunk left with no vector keeps its own text vector
    max_atoms: int | None = Field(None, ge=1, description="pool a chunk's other vectors (sentences, windows, "
                                  "questions) into at most this many: the centroids of their clusters")


class EmbedderConfig(Strict):
    """The model that makes the vectors, and what changes them; how fast it runs is `build.embedder`."""

    model: str = "all-MiniLM-L6-v2"  # registry name or a local sentence-transformers folder
    max_seq_length: int | None = None
    dtype: Literal["auto", "float32", "tf32", "bfloat16", "float16"] = Field(
        "auto", description="forward-pass precision: auto is float32 on CPU (vectors unchanged) and bfloat16 on "
        "CUDA (keeps rankings); tf32 is CUDA only")


class EmbedderRunConfig(Strict):
    """How the build's embedder runs: throughput, and the backend (ONNX and torch: the same vectors)."""

    batch_size: int = Field(64, ge=1, description="CPU: rows per forward pass at most (tokens_per_batch bounds "
                            "them too); each padded length runs in passes of one shape, so vectors keep their bits")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per embedding actor (0: CPU)")
    actors: int | None = Field(None, ge=1, description="embedding actors, all started before the first batch; "
                               "None: one per num_gpus GPUs of the cluster (1 on CPU)")
    threads: int | None = Field(None, ge=1, description="torch threads per CPU actor (default: cores / actors); "
                                "1 on a busy box, where OpenMP threads waiting for each other collapse speed")
    # CPU inference: onnx (qrag_ray/embedding/onnx.py), torch, or auto (onnx where it runs); GPUs use torch
    backend: Literal["auto", "torch", "onnx"] = "auto"
    tokens_per_batch: int | None = Field(None, ge=16, description="forward pass size in tokens (rows x padded "
                                         "length), not rows, so short and long texts fill a pass alike; None: "
                                         "65536 on a GPU, 512 on CPU (qrag_ray.embedding.forward)")
    tokenize: Literal["auto", "actor", "tasks"] = Field(
        "auto", description="where texts become token ids: in the embedding actor, or in CPU workers that feed "
        "it ready arrays (a GPU's forward pass outruns one tokenizing thread); auto = tasks with num_gpus")
    tokenizers: int | None = Field(None, ge=1, description="CPU workers that tokenize (tokenize: tasks), a fixed "
                                   "pool; default: 1 to 16 per embedding GPU, autoscaling (the resource plan)")

    def tokenize_apart(self) -> bool:
        return self.tokenize == "tasks" or (self.tokenize == "auto" and self.num_gpus > 0)


class Bm25Config(Strict):
    """A BM25 index per shard next to the FAISS one, fused with the dense score by `search.bm25_alpha`:
    it finds questions that share the passage's words where dense vectors miss them."""

    enabled: bool = False
    doc2query: bool = Field(True, description="index a chunk's generated questions with its text (when it has any)")
    # Lucene's BM25 as Anserini runs it ranks web queries better than bm25s's defaults (1.5, 0.75, unstemmed)
    k1: float = Field(0.9, gt=0)
    b: float = Field(0.4, ge=0, le=1)
    stemmer: str | None = Field("english",
                                description="Snowball stemmer (PyStemmer) for documents and queries; null = none")

    @field_validator("stemmer")
    @classmethod
    def _known_stemmer(cls, value: str | None) -> str | None:
        if value:
            import Stemmer

            if value not in Stemmer.algorithms():
                raise ValueError(f"unknown stemmer {value!r} (known: {', '.join(Stemmer.algorithms())})")
        return value or None


class FaissConfig(Strict):
    factory: str = "Flat"  # FAISS index factory string: Flat, HNSW32, IVF4096,PQ48 ...
    train_sample: int = Field(100_000, ge=1)
    nprobe: int = Field(32, ge=1)
    hnsw_ef_search: int = Field(128, ge=1)
    use_gpu: bool | Literal["auto"] = Field(
        "auto", description="shard builds on a GPU: auto where the cluster has GPUs and FAISS has a GPU version of "
        "the factory (Flat, IVF-Flat, IVF-SQ, IVF-PQ at 8 bits; not HNSW, Refine or fast-scan)")


class BuildConfig(Strict):
    """Where a build's output goes and how it runs, not what it makes: IndexConfig's one `run` section."""

    output: str | None = None
    overwrite: bool = False
    address: str | None = None  # Ray cluster address; None = local Ray in-process
    num_cpus: int | None = None  # logical CPUs for the in-process Ray (vLLM-CPU needs more than physical)
    cache_dir: str | None = None  # question cache; default: <output>/../.qrag-cache or ~/.cache/qrag-ray/questions
    embedder: EmbedderRunConfig = EmbedderRunConfig()
    work_dir: str | None = Field(None, description="checkpoint folder; default <output parent>/.<name>.work")
    keep_work: bool = Field(False, description="keep the checkpoints after a successful publish")
    rows_per_part: int = Field(4096, ge=1, description="vector rows per embedding batch (one checkpoint part)")
    docs_per_batch: int = Field(1024, ge=1, description="documents per chunking batch")
    extra_inputs: list[str] = Field(default_factory=list, description="more corpus paths read with `input` (--append)")
    delete_ids: list[str] = Field(default_factory=list, description="files of document ids left out (--delete-ids)")
    upsert_inputs: list[str] = Field(
        default_factory=list, description="JSONL corpora whose documents replace the same ids' documents of `input` "
                                          "and `extra_inputs` (`delete_ids` do not apply to them): what a served "
                                          "index's writes left, which a compaction builds from (`qrag compact`)")


MOVED = {"index": "faiss", **{k: f"build.{k}" for k in ("output", "overwrite", "address", "num_cpus", "cache_dir")},
         **{f"embedder.{k}": f"build.embedder.{k}" for k in EmbedderRunConfig.model_fields}}


def recorded_config(data: Mapping[str, Any] | None, refuse: bool = False) -> dict[str, Any]:
    """A manifest's recorded config with the settings that moved since (MOVED) in today's place, unvalidated: every
    reader of one goes through it, so older indexes still load, serve and grow. `refuse`: a moved key is an error."""
    out = copy.deepcopy(dict(data or {}))
    for old, new in MOVED.items():
        *parents, leaf = old.split(".")
        node = reduce(lambda n, p: n.get(p) if isinstance(n, dict) else None, parents, out)
        if isinstance(node, dict) and leaf in node:
            if refuse:
                raise ValueError(f"{old} is now {new} (run settings live under build:, "
                                 "the FAISS settings under faiss:)")
            reduce(lambda n, p: n.setdefault(p, {}), new.split(".")[:-1], out)[new.split(".")[-1]] = node.pop(leaf)
    return out


@field_roles(corpus=("input",), search=("search",), run=("build",))
class IndexConfig(Strict):
    """What an index contains (spec and corpus), how it is searched (`search`), where it goes and how the
    build runs (`build`, the run role). Build one with `index_config` (or `build_index_config` for a file)."""

    input: str | None = None
    format: Literal["jsonl", "parquet", "msmarco", "beir", "html"] = "jsonl"  # = io.readers.INPUT_FORMATS (tested)
    representation: str = "default"
    shards: int = Field(1, ge=1)
    chunker: ChunkerConfig = ChunkerConfig()
    generator: GeneratorConfig = GeneratorConfig()
    filters: FilterConfig = FilterConfig()
    embedder: EmbedderConfig = EmbedderConfig()
    faiss: FaissConfig = FaissConfig()
    search: SearchConfig = SearchConfig()
    bm25: Bm25Config = Bm25Config()
    build: BuildConfig = BuildConfig()
    # embed the title with each chunk ("title\ntext", as BEIR does); the `title` kind is a vector of its own
    title_prefix: bool = False

    @field_validator("representation")
    @classmethod
    def _known_representation(cls, value: str) -> str:
        resolve_representation(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "IndexConfig":
        kinds, gran = representation_plan(self)
        if set(kinds) & set(GENERATED_KINDS) and self.generator.backend == "none":
            raise ValueError(f"representation '{self.representation}' needs generated questions: "
                             "choose --generator vllm|openai|precomputed")
        if "onedoc" in kinds and gran == "atom":
            raise ValueError("quote-onedoc needs chunk-granularity questions (one prompt per chunk)")
        if self.search.bm25_alpha is not None and not self.bm25.enabled:
            raise ValueError("search.bm25_alpha needs a BM25 index: set bm25.enabled (re-index)")
        self.generator.check_endpoint()
        return self


def with_preset(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` (a partial IndexConfig) with its representation's preset filling the title prefix, BM25 and
    search fields it leaves unset, but no hybrid weight for a config whose BM25 is off (`--no-bm25`)."""
    out = dict(data)
    name = out.get("representation", IndexConfig.model_fields["representation"].default)
    preset = REPRESENTATIONS.get(name) if isinstance(name, str) else None
    if not preset:
        return out
    if "title_prefix" in preset:
        out.setdefault("title_prefix", preset["title_prefix"])
    bm25 = out.get("bm25", {})
    if isinstance(bm25, Mapping):
        out["bm25"] = bm25 = copy.deepcopy(preset.get("bm25", {})) | dict(bm25)
    search = out.get("search", {})
    if isinstance(search, Mapping):
        marked = search.get("experimental")
        given = set(search) | (set(marked) if isinstance(marked, Mapping) else set())
        bm25_on = isinstance(bm25, dict) and bool(bm25.get("enabled", Bm25Config.model_fields["enabled"].default))
        out["search"] = dict(search) | {k: copy.deepcopy(v) for k, v in preset.get("search", {}).items()
                                        if k not in given and (k != "bm25_alpha" or bm25_on)}
    return out


def index_config(data: Mapping[str, Any], where: str = "") -> IndexConfig:
    """An IndexConfig from a partial one, its representation's preset applied: every config a build or an evaluation
    starts from (a recorded one is complete: `recorded_config`). Invalid: a one-line QragError after `where`."""
    try:
        return IndexConfig.model_validate(with_preset(recorded_config(data, refuse=True)))
    except ValidationError as error:
        raise QragError(where + format_validation_error(error)) from None
    except ValueError as error:  # a setting at its old place
        raise QragError(f"{where}invalid configuration: {error}") from None


def index_identity(cfg_dump: Mapping[str, Any], *, corpus: bool = True) -> dict[str, Any]:
    """What an index is: its spec fields and, unless `corpus=False`, its documents. The identity behind
    the checkpoints' key, the manifest's `content` and `qrag eval`'s index reuse. A representation counts
    by what it makes (kinds, granularity), so a preset and the same kinds spelled out share an index."""
    out = select(IndexConfig, cfg_dump, ("spec", "corpus") if corpus else ("spec",))
    out = {"index" if k == "faiss" else k: v for k, v in out.items()}  # its name before: older checkpoints match
    with contextlib.suppress(ValueError):  # an unknown name stays as it is
        kinds, gran = resolve_representation(str(out.get("representation")))
        out["representation"] = {"kinds": kinds, "granularity": gran}
    return out


def resolve_representation(name: str) -> tuple[list[str], str | None]:
    """Map a representation name (or 'kind+kind') to (vector kinds, default question granularity)."""
    if name in REPRESENTATIONS:
        return list(REPRESENTATIONS[name]["kinds"]), REPRESENTATIONS[name]["granularity"]
    parts = [p.strip() for p in name.split("+") if p.strip()]
    if (len(parts) >= 2 or (parts and parts[0] in VECTOR_KINDS)) and all(p in VECTOR_KINDS for p in parts):
        return parts, "chunk" if set(parts) & set(GENERATED_KINDS) else None
    known = ", ".join(list(REPRESENTATIONS) + ["or kinds joined by '+' from: " + ", ".join(VECTOR_KINDS)])
    raise ValueError(f"unknown representation '{name}' (known: {known})")


def representation_plan(cfg: IndexConfig) -> tuple[list[str], str | None]:
    """Vector kinds to store and the granularity questions are generated at (None: no LLM)."""
    kinds, gran = resolve_representation(cfg.representation)
    return kinds, (cfg.generator.granularity or gran) if gran is not None else None


def deep_update(base: dict, upd: Mapping) -> dict:
    """Nested merge for config overrides: `{generator: {backend: vllm}}` keeps the rest of `generator`."""
    out = dict(base)
    for key, value in upd.items():
        nested = isinstance(value, Mapping) and isinstance(out.get(key), dict)
        out[key] = deep_update(out[key], value) if nested else value
    return out


def nest_dotted(flat: Mapping[str, Any]) -> dict:
    """CLI flags as a partial config: {'generator.questions': 5} -> {'generator': {'questions': 5}}.
    None means "flag not given" and is left out, so it cannot clear a value from the YAML file."""
    nested: dict = {}
    for key, val in flat.items():
        if val is not None:
            *parents, leaf = key.split(".")
            reduce(lambda node, p: node.setdefault(p, {}), parents, nested)[leaf] = val
    return nested


def load_yaml(path: str | Path) -> dict:
    return read_yaml(path, "config file", default={}, expect=dict)


def build_index_config(config_file: str | Path | None = None, **overrides: Any) -> IndexConfig:
    """YAML file (optional) overlaid with CLI overrides; dotted keys ('generator.questions') nest."""
    data = deep_update(load_yaml(config_file) if config_file else {}, nest_dotted(overrides))
    research_knobs_marked(data)
    return index_config(data)


def format_validation_error(error: ValidationError) -> str:
    return "invalid configuration: " + "; ".join(
        f"{'.'.join(str(x) for x in err['loc']) or 'config'}: {err['msg'].removeprefix('Value error, ')}"
        for err in error.errors())
