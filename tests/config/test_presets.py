"""Presets: named, versioned, listed by `qrag presets`, and applied by `index_config` where a config is silent."""

from __future__ import annotations

import dataclasses
import json

import pytest

from qrag_ray.cli import main
from qrag_ray.config.index import REPRESENTATIONS, index_config, representation_plan
from qrag_ray.config.presets import MINILM, PRESETS, calibration_note


def test_every_preset_is_a_representation_with_its_own_defaults():
    assert list(REPRESENTATIONS) == list(PRESETS)
    cfg = index_config({"representation": "atom-hybrid", "generator": {"backend": "precomputed"}})
    preset = PRESETS["atom-hybrid"]
    assert preset.id == "atom-hybrid@2" and preset.needs_llm and preset.calibrated_for == MINILM
    assert cfg.search.fusion == "sum" and cfg.search.kind_bias == preset.search["kind_bias"]
    default = index_config({})  # no --representation: the shipped default
    assert default.representation == "default" and default.title_prefix
    assert default.bm25.enabled and default.search.bm25_alpha == 0.67
    assert representation_plan(default) == (["chunk", "sentence", "window"], None) and PRESETS["default"].version == 2
    lean = index_config({"representation": "chunk-bm25"})  # default@1: one vector per chunk
    assert representation_plan(lean) == (["chunk"], None) and lean.title_prefix and lean.search.bm25_alpha == 0.67
    assert not PRESETS["default"].needs_llm and not PRESETS["chunk"].needs_llm


def test_a_preset_object_cannot_be_changed_in_place():
    with pytest.raises(dataclasses.FrozenInstanceError):
        PRESETS["chunk"].version = 9  # type: ignore[misc]
    REPRESENTATIONS["atom-hybrid"]["search"]["kind_bias"]["question"] = 0.0  # a copy: the preset is untouched
    try:
        assert PRESETS["atom-hybrid"].search["kind_bias"]["question"] == -0.2
    finally:
        REPRESENTATIONS["atom-hybrid"]["search"]["kind_bias"]["question"] = -0.2


@pytest.mark.parametrize("embedder,warns", [
    ("all-MiniLM-L6-v2", False),
    ("/home/u/.cache/qrag-ray/models/all_minilm_l6_v2/model", False),
    ("sentence-transformers/all-MiniLM-L6-v2", False),
    ("BAAI/bge-small-en-v1.5", True),
])
def test_calibration_note_names_the_embedder_the_offsets_were_tuned_on(embedder, warns):
    note = calibration_note("atom-hybrid-bm25", embedder)
    assert (note is not None) == warns
    if warns:
        assert "atom-hybrid-bm25@2" in note and MINILM in note and embedder in note
    assert calibration_note("chunk", embedder) is None  # nothing calibrated to fit


def test_qrag_presets_lists_them(capsys):
    assert main(["presets", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(PRESETS)
    by_name = {r["name"]: r for r in rows}
    assert by_name["default"]["bm25_alpha"] == 0.67 and by_name["default"]["needs_llm"] is False
    assert by_name["hype"]["needs_llm"] is True and by_name["atom-hybrid"]["id"] == "atom-hybrid@2"
    assert main(["presets"]) == 0
    assert "atom-hybrid@2" in capsys.readouterr().out


def test_default_and_sentence_window_bm25_are_the_suites_csw_bm25():
    """The presets are the configuration the suite measured as `csw+bm25@0.67` (the default with the
    title prefixed to the chunk), so its figures apply."""
    from pathlib import Path

    import yaml

    suite = yaml.safe_load((Path(__file__).resolve().parents[2] / "eval" / "suite.yaml").read_text())
    measured = suite["configs"]["csw+bm25@0.67"]
    preset = PRESETS["sentence-window-bm25"]
    assert "+".join(preset.kinds) == measured["representation"] and not preset.needs_llm
    assert preset.search == measured["search"] and preset.bm25 == {"enabled": True} == suite["base"]["bm25"]
    cfg = index_config({"representation": "sentence-window-bm25"})
    assert representation_plan(cfg) == (["chunk", "sentence", "window"], None)
    assert cfg.bm25.enabled and cfg.search.bm25_alpha == 0.67
    assert cfg.search.kind_weights == {"chunk": 0.5} and not cfg.title_prefix
    default = PRESETS["default"]
    assert (default.kinds, default.search, default.bm25) == (preset.kinds, preset.search, preset.bm25)
    assert default.title_prefix
    assert suite["configs"]["default"] == {"representation": "default"}
