"""How CLI flags and YAML files combine into one config: pure dict logic, milliseconds."""

from __future__ import annotations

from qrag_ray.config.index import build_index_config, deep_update, nest_dotted


def test_deep_update_merges_nested_sections_without_mutating():
    base = {"generator": {"backend": "vllm", "sampling": {"temperature": 0.0, "max_tokens": 120}}, "k": 1}
    out = deep_update(base, {"generator": {"sampling": {"temperature": 0.7}}, "k": 2})
    assert out == {"generator": {"backend": "vllm", "sampling": {"temperature": 0.7, "max_tokens": 120}}, "k": 2}
    assert base["generator"]["sampling"]["temperature"] == 0.0 and base["k"] == 1


def test_nest_dotted_skips_flags_not_given():
    assert nest_dotted({"generator.backend": "vllm", "generator.questions": None, "shards": 3,
                        "generator.sampling.temperature": 0.5}) == {
        "generator": {"backend": "vllm", "sampling": {"temperature": 0.5}}, "shards": 3}


def test_flags_override_the_file_and_keep_its_other_fields(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("generator: {backend: vllm, questions: 4, prompt: quote}\nshards: 2\n")
    cfg = build_index_config(path, **{"generator.questions": 7, "generator.prompt": None})
    assert (cfg.generator.backend, cfg.generator.questions, cfg.generator.prompt, cfg.shards) == ("vllm", 7, "quote", 2)


# ------------------------------------------------------------------ search: preset + bm25_alpha, research knobs marked
def test_experimental_search_block_reads_as_the_flat_fields_and_records_flat():
    from qrag_ray.config.index import IndexConfig

    marked = IndexConfig.model_validate({"representation": "atom-sentence",
                                         "search": {"experimental": {"fusion": "rrf", "rrf_k": 30}}})
    flat = IndexConfig.model_validate({"representation": "atom-sentence", "search": {"fusion": "rrf", "rrf_k": 30}})
    assert marked.search.fusion == "rrf" and marked.search.rrf_k == 30
    # the manifest records one form (flat), so old indexes and new configs hash alike
    assert marked.model_dump(mode="json") == flat.model_dump(mode="json")
    assert "experimental" not in marked.model_dump(mode="json")["search"]


def test_experimental_overrides_the_preset_only_where_set():
    from qrag_ray.config.index import REPRESENTATIONS, index_config

    preset = REPRESENTATIONS["atom-hybrid"]["search"]
    cfg = index_config({"representation": "atom-hybrid", "generator": {"backend": "precomputed"},
                        "search": {"experimental": {"fusion": "max"}}})
    assert cfg.search.fusion == "max"
    assert cfg.search.kind_bias == preset["kind_bias"]  # what the block left alone comes from the preset


def test_user_config_must_mark_research_knobs(tmp_path):
    import pytest

    from qrag_ray.config.index import build_index_config
    from qrag_ray.errors import QragError

    (tmp_path / "flat.yaml").write_text("search: {kind_weights: {chunk: 0.5}}\n")
    with pytest.raises(QragError, match=r"search\.kind_weights .*search\.experimental"):
        build_index_config(tmp_path / "flat.yaml")
    (tmp_path / "marked.yaml").write_text("search: {experimental: {kind_weights: {chunk: 0.5}}}\n")
    assert build_index_config(tmp_path / "marked.yaml").search.kind_weights == {"chunk": 0.5}
    (tmp_path / "alpha.yaml").write_text("bm25: {enabled: true}\nsearch: {bm25_alpha: 0.7}\n")
    assert build_index_config(tmp_path / "alpha.yaml").search.bm25_alpha == 0.7  # the user-level knob
    for bad, needle in [("search: {experimental: {fusion: rrf}, fusion: rrf}", "search.fusion is a research knob"),
                        ("search: {experimental: [fusion]}", "mapping"),
                        ("search: {experimental: {alpha: 1}}", "unknown experimental")]:
        (tmp_path / "bad.yaml").write_text(bad + "\n")
        with pytest.raises(QragError, match=needle):
            build_index_config(tmp_path / "bad.yaml")


def test_a_knob_given_flat_and_marked_is_an_error():
    import pytest
    from pydantic import ValidationError

    from qrag_ray.config.index import SearchConfig

    with pytest.raises(ValidationError, match="both in search and in search.experimental"):
        SearchConfig.model_validate({"fusion": "rrf", "experimental": {"fusion": "max"}})
