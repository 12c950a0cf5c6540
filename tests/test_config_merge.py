"""How CLI flags and YAML files combine into one config: pure dict logic, milliseconds."""

from __future__ import annotations

from qrag_ray.config import build_index_config, deep_update, nest_dotted


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
    f = tmp_path / "c.yaml"
    f.write_text("generator: {backend: vllm, questions: 4, prompt: quote}\nshards: 2\n")
    cfg = build_index_config(f, **{"generator.questions": 7, "generator.prompt": None})
    assert (cfg.generator.backend, cfg.generator.questions, cfg.generator.prompt, cfg.shards) == ("vllm", 7, "quote", 2)
