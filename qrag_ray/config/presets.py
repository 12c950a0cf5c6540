"""Named, versioned index presets: what `--representation NAME` means (`qrag presets` lists them). A preset
fixes the vector kinds, the question granularity (None: no LLM) and the query-time fusion that goes with
them, whose biases are score offsets measured with the embedder it names. A changed meaning is a new `version`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

MINILM = "all-MiniLM-L6-v2"


@dataclass(frozen=True)
class Preset:
    name: str
    version: int
    purpose: str
    kinds: tuple[str, ...]
    granularity: str | None  # "chunk" | "atom": one question prompt per chunk / per atomic statement
    search: dict[str, Any] = field(default_factory=dict)
    bm25: dict[str, Any] = field(default_factory=dict)
    title_prefix: bool | None = None  # None: the config's own setting
    calibrated_for: str | None = None  # the embedder whose score scale `search` biases were tuned on
    source: str = ""

    @property
    def id(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def needs_llm(self) -> bool:
        return self.granularity is not None

    def as_config(self) -> dict[str, Any]:
        """The preset as the config values it gives (what config.REPRESENTATIONS holds)."""
        given = {"title_prefix": self.title_prefix, "bm25": dict(self.bm25), "search": copy.deepcopy(self.search)}
        return {"kinds": list(self.kinds), "granularity": self.granularity} | {
            k: v for k, v in given.items() if v is not None and v != {}}


_ATOM_SEARCH = {"fusion": "sum", "kind_weights": {"chunk": 0.5}, "kind_bias": {"question": -0.2, "quote": -0.05},
                "groups": {"atom": ["sentence", "question", "quote"]}}

# the chunk at half weight summed with its best sentence or two-sentence window, with BM25: the suite's
# `csw+bm25@0.67` (eval/suite.yaml; tests/config/test_presets.py holds them equal)
_CSW_SEARCH = {"fusion": "sum", "kind_weights": {"chunk": 0.5}, "kind_bias": {"window": -0.02},
               "groups": {"atom": ["sentence", "window"]}, "bm25_alpha": 0.67}

PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("chunk", 1, "dense search only, one vector per chunk: the baseline", ("chunk",), None),
    Preset("hype", 1, "HyPE: only the questions an LLM writes per chunk", ("question",), "chunk",
           source="HyPE (Vake et al. 2025)"),
    Preset("quote", 1, "QuOTE: each question embedded with its chunk", ("quote",), "chunk", source="QuOTE (2025)"),
    Preset("quote-onedoc", 1, "QuOTE in one vector per chunk: the chunk and all its questions", ("onedoc",), "chunk",
           source="QuOTE (2025)"),
    Preset("atom-sentence", 1, "one vector per sentence (atoms without an LLM)", ("sentence",), None,
           source="Raina & Gales (2024)"),
    Preset("atom-question", 1, "questions written per atomic statement", ("question",), "atom",
           source="Raina & Gales (2024)"),
    Preset("hybrid", 1, "chunk + its generated questions, the best vector counts (qrag demo's index)",
           ("chunk", "question"), "chunk"),
    Preset("atom-hybrid", 2, "the best dense ranking with a small offline LLM: chunk at half weight + one atom slot "
           "(sentence, question or quote) with calibrated question offsets", ("chunk", "sentence", "question",
           "quote"), "atom", search=_ATOM_SEARCH, calibrated_for=MINILM, source="docs/EVALUATION.md §4.6"),
    Preset("atom-hybrid-bm25", 2, "users who ask in the documents' own words (FAQ, support) and can afford question "
           "generation: atom-hybrid + BM25 over the chunk and its questions (alpha 0.67)",
           ("chunk", "sentence", "question", "quote"), "atom", search={**_ATOM_SEARCH, "bm25_alpha": 0.67},
           bm25={"enabled": True}, calibrated_for=MINILM, source="docs/EVALUATION.md §4.8"),
    Preset("sentence-window-bm25", 1, "corpora whose titles are ids, not words: the default without the title prefix, "
           "chunk at half weight + its best sentence or two-sentence window + stemmed BM25",
           ("chunk", "sentence", "window"), None, search=_CSW_SEARCH, bm25={"enabled": True}, calibrated_for=MINILM,
           source="docs/EVALUATION.md (the suite's csw+bm25@0.67)"),
    Preset("chunk-bm25", 1, "an index held to one vector per chunk (a fraction of the default's vectors): "
           "title-prefixed chunk + stemmed BM25 (alpha 0.67); no LLM", ("chunk",), None,
           search={"bm25_alpha": 0.67}, bm25={"enabled": True}, title_prefix=True,
           source="docs/EVALUATION.md (the suite)"),
    Preset("default", 2, "unknown or mixed workloads (the best mean of the suite): title-prefixed chunk at half "
           "weight + its best sentence or two-sentence window + stemmed BM25 (alpha 0.67); no LLM; a vector per "
           "chunk, sentence and window", ("chunk", "sentence", "window"), None, search=_CSW_SEARCH,
           bm25={"enabled": True}, title_prefix=True, calibrated_for=MINILM, source="docs/EVALUATION.md (the suite)"),
)}


def calibration_note(preset_name: str, embedder: str) -> str | None:
    """Why the preset's fusion biases may not fit `embedder` (None when they do, or it has none)."""
    preset = PRESETS.get(preset_name)
    if preset is None or preset.calibrated_for is None:
        return None
    calibrated, used = (s.lower().replace("_", "-") for s in (preset.calibrated_for, embedder))
    if calibrated in used:  # a registry name, a hub id or a local folder of it
        return None
    return (f"preset {preset.id} has fusion offsets calibrated for {preset.calibrated_for}, not {embedder}: "
            "re-measure them (eval/analysis/fusion_grid.py) and set search.kind_bias / kind_weights")
