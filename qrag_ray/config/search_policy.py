"""The search policy (SearchConfig), the one type every search path ranks with: the query-time fusion of
a chunk's vector scores and the dense + BM25 hybrid weight. The representation's preset owns it, a query
may override its hybrid weight, and changing it needs no re-index: its role keeps IndexConfig's `search`
section out of the index identity."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from qrag_ray.config.roles import Strict, field_roles, role_of
from qrag_ray.errors import QragError

# the vector kinds a representation may combine; each row of a shard is one of these
VECTOR_KINDS = ("chunk", "question", "quote", "atomquote", "onedoc", "sentence", "window", "title")
# the kinds whose row text is one generated question (a quote or atomquote embeds it beside its chunk or
# sentence, but stores the question): what BM25's doc2query, the leakage check and the demo read as questions
QUESTION_KINDS = ("question", "quote", "atomquote")
# the kinds only an LLM (or precomputed questions) can fill: the question kinds and onedoc (a chunk and all
# its questions in one vector)
GENERATED_KINDS = (*QUESTION_KINDS, "onedoc")


# The research knobs (role "preset") are the preset's, calibrated for its embedder: a user's config file
# sets them only inside `search.experimental:`, so that it says so; `bm25_alpha` is the user's setting.
@field_roles(preset=("fusion", "kind_weights", "rrf_k", "kind_bias", "groups", "bm25_norm"))
class SearchConfig(Strict):
    """How a chunk's vector scores fuse into one chunk score at query time (qrag_ray.search.merge): max,
    the best calibrated vector; rrf, reciprocal-rank fusion of per-group rankings (a chunk two kinds find
    beats one lucky vector); sum, CombSUM of per-group bests. Scores are first calibrated per kind,
    `w * score + bias` (question-to-question cosines run higher); inside a group (kinds that are evidence
    for the same thing) the best vector counts once. Recorded in the manifest so every search path ranks
    alike. Stored flat; read also with the research knobs under `experimental:`, the form user config
    files must use."""

    @model_validator(mode="before")
    @classmethod
    def _lift_experimental(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or "experimental" not in data:
            return data
        data = dict(data)
        exp = data.pop("experimental") or {}
        if not isinstance(exp, Mapping):
            raise ValueError("search.experimental must be a mapping of research knobs")
        if unknown := sorted(set(exp) - set(EXPERIMENTAL_SEARCH)):
            raise ValueError(f"unknown experimental search knob(s) {unknown} (known: {', '.join(EXPERIMENTAL_SEARCH)})")
        if twice := sorted(set(exp) & set(data)):
            raise ValueError(f"{twice} given both in search and in search.experimental")
        return data | dict(exp)

    fusion: Literal["max", "rrf", "sum"] = "max"
    kind_weights: dict[str, float] = Field(default_factory=dict, description="score multiplier per vector kind")
    rrf_k: int = Field(60, ge=1, description="RRF constant: 1/(rrf_k + rank) per kind list")
    kind_bias: dict[str, float] = Field(default_factory=dict,
                                        description="added to a vector's (weighted) score per kind")
    groups: dict[str, list[str]] = Field(
        default_factory=dict, description="kinds fused as one: the best calibrated vector of the group counts once")
    # chunk score = alpha * dense + (1 - alpha) * BM25 / the query's best BM25 score; None = dense only
    bm25_alpha: float | None = Field(None, ge=0.0, le=1.0,
                                     description="weight of the dense score in a dense+BM25 hybrid")
    bm25_norm: Literal["max", "minmax", "zscore"] = Field(
        "max", description="per-query scale of both lists before the alpha mix (qrag_ray.search.merge.normalise)")

    @field_validator("kind_weights", "kind_bias")
    @classmethod
    def _known_kinds(cls, value: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        _check_kinds(value, info.field_name)
        if info.field_name == "kind_weights" and any(w <= 0 for w in value.values()):
            raise ValueError("kind_weights must be positive")
        if info.field_name == "kind_bias" and any(not -2.0 <= b <= 2.0 for b in value.values()):
            raise ValueError("kind_bias values must lie in [-2, 2] (cosine scores lie in [-1, 1])")
        return value

    @field_validator("groups")
    @classmethod
    def _disjoint_groups(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        seen: dict[str, str] = {}
        for group, group_kinds in value.items():
            if group in VECTOR_KINDS:
                raise ValueError(f"group name {group!r} is a vector kind; name groups apart from kinds")
            if not group_kinds:
                raise ValueError(f"group {group!r} lists no kinds")
            _check_kinds(group_kinds, f"group {group!r}")
            for kind in group_kinds:
                if kind in seen:
                    raise ValueError(f"vector kind {kind!r} is in two groups ({seen[kind]!r} and {group!r})")
                seen[kind] = group
        return value


    def with_bm25_alpha(self, alpha: float) -> "SearchConfig":
        """This policy with a query-time alpha (`qrag search --bm25-alpha`, the HTTP `bm25_alpha`)."""
        try:
            return self.model_validate(self.model_dump() | {"bm25_alpha": alpha})
        except ValidationError:
            raise QragError(f"bm25_alpha must lie in [0, 1], got {alpha}") from None

    def calibrate(self, scores: np.ndarray, kinds: np.ndarray | None) -> np.ndarray:
        """Vector scores after the per-kind `w * score + bias` (float64)."""
        out = scores.astype(np.float64)
        if kinds is None or not (self.kind_weights or self.kind_bias):
            return out
        names = np.asarray(kinds, dtype=object).tolist()
        weights = np.array([self.kind_weights.get(name, 1.0) for name in names], dtype=np.float64)
        biases = np.array([self.kind_bias.get(name, 0.0) for name in names], dtype=np.float64)
        return out * weights + biases

    def groups_of(self, kinds: np.ndarray) -> np.ndarray:
        """Each vector's fusion group (`group_of` its kind), as an object array."""
        group = {kind: name for name, members in self.groups.items() for kind in members}
        return np.array([group.get(kind, kind) for kind in np.asarray(kinds, dtype=object).tolist()], dtype=object)

    def bound(self, raw: float) -> float:
        """The highest calibrated score a vector with raw score <= `raw` can reach (any kind)."""
        pairs = [(1.0, 0.0)] + [(self.kind_weights.get(k, 1.0), self.kind_bias.get(k, 0.0))
                                for k in {*self.kind_weights, *self.kind_bias}]
        return max(w * raw + b for w, b in pairs)

    def group_of(self, kind: str) -> str:
        return next((g for g, ks in self.groups.items() if kind in ks), kind)


EXPERIMENTAL_SEARCH = tuple(n for n in SearchConfig.model_fields if role_of(SearchConfig, n) == "preset")


def _check_kinds(kinds, where: str) -> None:
    if bad := [k for k in kinds if k not in VECTOR_KINDS]:
        raise ValueError(f"unknown vector kind(s) {bad} in {where} (known: {', '.join(VECTOR_KINDS)})")


def research_knobs_marked(data: Mapping) -> None:
    """A user's config changes fusion only under `search.experimental:` (the preset owns it); manifests
    and eval variants, which record fusion as data, go through qrag_ray.config.index.index_config and are
    not held to it."""
    search = data.get("search")
    if flat := sorted(set(search) & set(EXPERIMENTAL_SEARCH)) if isinstance(search, Mapping) else []:
        raise QragError(f"invalid configuration: search.{flat[0]} is a research knob that the representation's "
                        f"preset sets (qrag presets); to override it anyway, put it under search.experimental "
                        f"(search: {{experimental: {{{flat[0]}: ...}}}}). Users set search.bm25_alpha only.")
