"""`qrag eval`: build one index per variant (a representation plus overrides: a pruning threshold, a
question count, HyDE at query time), run every query through the user search path (dedup included), and
report the variants side by side. Indexes under OUTPUT/indexes/<label> are reused when their recorded
config matches and questions come from the shared cache, so a repeated run only pays for what changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from qrag_ray.config.index import (
    GeneratorConfig,
    IndexConfig,
    deep_update,
    format_validation_error,
    index_config,
    index_identity,
    recorded_config,
    representation_plan,
    resolve_representation,
)
from qrag_ray.config.search_policy import QUESTION_KINDS
from qrag_ray.config.yaml_file import read_yaml
from qrag_ray.errors import QragError
from qrag_ray.evaluation.loaders import EvalSet, load_eval_set
from qrag_ray.evaluation.metrics import DEFAULT_KS, evaluate, leaked_queries
from qrag_ray.evaluation.report import write_report
from qrag_ray.evaluation.results import EvalMeta, EvalReport, EvalRun, HydeCost, VariantResult, write_partial
from qrag_ray.index.format import IndexFormatError, Manifest, load_manifest, read_table_file


@dataclass
class Variant:
    label: str
    overrides: dict[str, Any] = field(default_factory=dict)
    hyde: bool = False


def parse_list(text: str | None, cast=str) -> list:
    return [cast(x.strip()) for x in text.split(",") if x.strip()] if text else []


def plan_variants(representations: list[str], prune_taus: list[float] | None = None,
                  question_counts: list[str] | None = None, hyde: bool = False) -> list[Variant]:
    """The paper sweeps as variants: every representation, then τ and question-count sweeps applied
    to each question-based representation, and HyDE over the chunk index."""
    out = [Variant(r, {"representation": r}) for r in representations]
    for representation in [r for r in representations if resolve_representation(r)[1] is not None]:
        key = "questions" if resolve_representation(representation)[1] == "chunk" else "questions_per_atom"
        out += [Variant(f"{representation}@tau={tau:g}",
                        {"representation": representation, "filters": {"prune_tau": tau}})
                for tau in prune_taus or []]
        out += [Variant(f"{representation}@n={n}", {"representation": representation, "generator": {
            key: None if str(n).lower() in ("auto", "llm", "none") else int(n)}}) for n in question_counts or []]
    if hyde:
        out.append(Variant("hyde", {"representation": "chunk", "generator": {"backend": "none"}}, hyde=True))
    return out


def load_variants(path: str | Path) -> list[Variant]:
    """Variants from YAML: a list of {label, representation, hyde?, <IndexConfig overrides>...}, so an
    ablation (prompt, filters, fusion, kinds) is a file of named configurations, not code."""
    data = read_yaml(path)
    if isinstance(data, dict):
        data = data.get("variants")
    if not isinstance(data, list) or not data:
        raise QragError(f"{path}: expected a list of variants (label, representation, overrides)")
    out = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or not item.get("label") or not item.get("representation"):
            raise QragError(f"{path}: variant #{i + 1} needs a label and a representation")
        out.append(Variant(str(item["label"]), {k: v for k, v in item.items() if k not in ("label", "hyde")},
                           hyde=bool(item.get("hyde", False))))
    return out


def _same_config(index_dir: Path, cfg: IndexConfig) -> bool:
    try:
        man = load_manifest(index_dir)
    except IndexFormatError:  # no index there, or one this release cannot read: not reusable
        return False
    # the kinds too: a preset's kinds can change between releases under the same representation name
    if man.kinds is not None and sorted(man.kinds) != sorted(representation_plan(cfg)[0]):
        return False
    # the recorded config (complete: no preset applies) with fields added since at their defaults, so an
    # index stays reusable when a release adds a section (e.g. `bm25`) it does not use
    recorded = recorded_config(man.config)  # in today's layout, whichever release built it
    with contextlib.suppress(Exception):  # a config this release rejects is compared as it is: not reusable
        recorded = IndexConfig.model_validate(recorded).model_dump(mode="json")
    # one index identity (the search policy is applied at query time, so fusion variants share one index)
    return index_identity(recorded) == index_identity(cfg.model_dump(mode="json"))


def find_reusable(indexes: Path, preferred: Path, cfg: IndexConfig) -> Path | None:
    """An index under `indexes` with the same identity (the variant's own dir first)."""
    cands = [preferred] + sorted(p for p in indexes.glob("*") if p.is_dir() and p != preferred)
    return next((p for p in cands if _same_config(p, cfg)), None)


def generated_texts(index_dir: Path) -> list[str]:
    manifest = load_manifest(index_dir)
    tables = (read_table_file(manifest.file(manifest.shard(i).meta), ["kind", "text"])
              for i in range(manifest.num_shards))
    return [text for table in tables
            for kind, text in zip(table.column("kind").to_pylist(), table.column("text").to_pylist(), strict=True)
            if kind in QUESTION_KINDS]


def hyde_vectors(engine, queries: list[str], gcfg) -> tuple[Any, HydeCost]:
    """Embed an LLM-written hypothetical answer per query (the HyDE baseline), through the same
    generation backends and cache as indexing."""
    import ray.data

    from qrag_ray.embedding import encode
    from qrag_ray.generation.cache import QuestionCache
    from qrag_ray.generation.requests import make_request
    from qrag_ray.generation.stage import generate
    from qrag_ray.index.resource_plan import current_cluster, kernels_from_env, plan_generation
    from qrag_ray.models.bundled import resolve_llm
    from qrag_ray.serving.answer import hyde_passage

    reqs = [make_request(gcfg, "hyde", q, None) | {"unit": -1, "chunk_idx": i, "shard": 0, "text": q}
            for i, q in enumerate(queries)]
    dataset = ray.data.from_items(reqs).materialize()
    model_path = resolve_llm(gcfg.model) if gcfg.backend == "vllm" else None
    started = time.perf_counter()
    stage = plan_generation(gcfg, current_cluster(local=False), kernels_from_env())
    answered, stats = generate(dataset, gcfg, QuestionCache(None), model_path, stage)
    rows = sorted(answered.take_all(), key=lambda r: int(r["chunk_idx"]))
    passages = [hyde_passage(r.get("raw"), queries[int(r["chunk_idx"])]) for r in rows]  # as served
    vecs = encode(engine.embedder, passages)
    return vecs, HydeCost(llm_seconds=time.perf_counter() - started, generated=stats.generated,
                          output_tokens=stats.output_tokens,
                          llm_seconds_per_query=stats.seconds / stats.generated if stats.generated else None)


def run_variant(eval_set: EvalSet, variant: Variant, base: dict, out_dir: Path, ks: list[int], corpus_path: Path,
                hyde_generator: dict | None = None, console=None) -> VariantResult:
    from qrag_ray.index.build import build_index
    from qrag_ray.search.engine import SearchEngine

    idx_dir = out_dir / "indexes" / variant.label.replace("/", "_")
    here = {"input": str(corpus_path), "format": "jsonl", "build": {"output": str(idx_dir), "overwrite": True}}
    cfg = index_config(deep_update(deep_update(base, variant.overrides), here), f"variant {variant.label}: ")
    reuse = find_reusable(idx_dir.parent, idx_dir, cfg)
    manifest: Manifest
    if reuse is not None:
        if console:
            console.print(f"[dim]reusing index {reuse}[/]")
        idx_dir = reuse
        manifest = load_manifest(reuse)
        stage = dict(manifest.stage_seconds or {})
    else:
        rep = build_index(cfg, console=console)
        manifest = rep.manifest
        stage = dict(rep.stage_seconds)
    engine = SearchEngine(idx_dir, policy=cfg.search)
    queries = [q["text"] for q in eval_set.queries]
    started = time.perf_counter()
    hyde: HydeCost | None = None
    if variant.hyde:
        try:
            gcfg = GeneratorConfig.model_validate(hyde_generator or {})
        except ValidationError as error:
            raise QragError(f"HyDE generator: {format_validation_error(error)}") from None
        if gcfg.backend in ("none", "precomputed"):
            raise QragError("HyDE needs an LLM: pass --generator vllm or openai")
        qvecs, hyde = hyde_vectors(engine, queries, gcfg)
        search_started = time.perf_counter()
    else:
        search_started = time.perf_counter()
        qvecs = engine.embed(queries)
    ranked = [[r.doc_id for r in page] for page in engine.search_vectors(qvecs, max(ks), queries=queries)]
    stage["search"] = round(time.perf_counter() - search_started, 3)
    if hyde is not None:
        stage["hyde_llm"] = round(hyde.llm_seconds, 3)
    run = {q["qid"]: list(dict.fromkeys(docs)) for q, docs in zip(eval_set.queries, ranked, strict=True)}
    leaked = leaked_queries(generated_texts(idx_dir), eval_set.queries)
    counts = manifest.counts.model_dump() if manifest.counts is not None else {}
    return VariantResult(
        metrics=evaluate(run, eval_set.qrels, ks=ks, doc_titles=eval_set.doc_titles),
        **{k: counts.get(k) for k in ("vectors", "chunks", "questions", "vectors_before_filters")},
        index_bytes=sum(p.stat().st_size for p in idx_dir.rglob("*") if p.is_file()),
        stage_seconds=stage, query_ms=round(1000 * (time.perf_counter() - started) / max(1, len(queries)), 3),
        generation=manifest.generation or {}, leaked_queries=len(leaked), leaked_examples=leaked[:5],
        index_reused=reuse is not None, index_dir=str(idx_dir),
        config=(manifest.config or {}) | {"search": cfg.search.model_dump(mode="json")}, hyde=hyde)


def run_eval(dataset: str, data: str, variants: list[Variant], output: str | Path, subset: int | None = None,
             ks: list[int] | None = None, base_overrides: dict | None = None, strict: bool = False,
             console=None, split: str = "test", offset: int = 0) -> EvalRun:
    # labels key the results and name the index folders: one check for planned and loaded variants alike
    if len({v.label for v in variants}) != len(variants):
        raise QragError(f"duplicate evaluation variants: {[v.label for v in variants]}")
    ks = sorted(set(ks or DEFAULT_KS))
    if any(k < 1 for k in ks):
        raise QragError("--k values must be positive")
    eval_set = load_eval_set(dataset, data, subset=subset, split=split, offset=offset)
    out = Path(output)
    corpus_path = eval_set.write_corpus_jsonl(out / "corpus.jsonl")  # creates `out`
    # named by its content: an index's identity holds its input path, so an index that another slice of the
    # dataset (another subset or offset) left in the same output folder is never taken for this one
    digest = hashlib.sha256(corpus_path.read_bytes()).hexdigest()[:16]
    corpus_path = corpus_path.replace(out / f"corpus-{digest}.jsonl")
    base = {"chunker": {"method": "none"}} if dataset in ("squad", "bipar") else {}  # one passage = one chunk
    base = deep_update(base, base_overrides or {})
    results: dict[str, VariantResult] = {}
    for variant in variants:
        if console:
            console.rule(f"{variant.label}")
        results[variant.label] = run_variant(eval_set, variant, base, out, ks, corpus_path, base.get("generator"),
                                             console)
        write_partial(out / "partial.json", results)
    meta = EvalMeta(dataset=dataset, data=str(data), subset=subset, offset=offset, **eval_set.stats(), ks=ks)
    report = EvalReport(meta=meta, representations=results)
    done = EvalRun(report, write_report(out, report))
    (out / "partial.json").unlink(missing_ok=True)
    if strict and done.leaks:
        raise QragError(f"leakage: generated questions equal evaluation queries in {done.leaks} "
                        f"(see {done.paths['json']})")
    return done


def evaluate_condition(condition, root: str | Path | None = None) -> dict[str, float | None]:
    """Runner for the regression matrix (`run_matrix(..., runner=evaluate_condition)`): one
    `matrix.Condition` -> metrics (fractions), its `qrag eval` output in root/<id> (default: the temp
    folder's qrag-matrix/). matrix.py stays a leaf: it never imports this module."""
    overrides = condition.index_overrides()
    rep = overrides.pop("representation")
    root = Path(root) if root is not None else Path(tempfile.gettempdir()) / "qrag-matrix"
    res = run_eval(condition.dataset, condition.data, [Variant(rep, {"representation": rep})],
                   root / condition.id, subset=condition.subset,
                   base_overrides=overrides, split=condition.split, offset=condition.offset)
    return res.results[rep].metrics
