"""Config by role: every field's role declared once, one index identity derived from it, presets applied
by an explicit call, and every config file the repository ships still loads."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from qrag_ray.config.index import (
    GeneratorConfig,
    IndexConfig,
    build_index_config,
    deep_update,
    index_config,
    index_identity,
    recorded_config,
    with_preset,
)
from qrag_ray.config.roles import Strict, field_roles, role_of
from qrag_ray.config.search_policy import EXPERIMENTAL_SEARCH
from qrag_ray.errors import QragError
from qrag_ray.index.workdir import work_key

ROOT = Path(__file__).resolve().parents[2]


def _dump(**data) -> dict:
    return index_config(data).model_dump(mode="json")


# ------------------------------------------------------------------------------------------ identity
@pytest.mark.parametrize("override", [
    {"build": {"output": "/elsewhere", "overwrite": True, "address": "ray://head:10001", "num_cpus": 8,
               "cache_dir": "/c"}},
    {"build": {"rows_per_part": 128, "keep_work": True, "work_dir": "/w"}},
    {"build": {"embedder": {"batch_size": 512, "actors": 4, "threads": 1, "num_gpus": 1, "backend": "torch"}}},
    {"generator": {"batch_size": 64, "concurrency": 4, "num_gpus": 1, "engine_kwargs": {"max_num_seqs": 8},
                   "max_parallel_requests": 32, "request_timeout_s": 5, "api_key_env": "K"}},
    {"search": {"bm25_alpha": 0.3}},  # the search policy is applied at query time
])
def test_run_options_and_the_search_policy_leave_the_identity(override):
    base = {"representation": "atom-sentence", "bm25": {"enabled": True}}
    plain = _dump(**base)
    changed = _dump(**deep_update(base, override))
    assert plain != changed
    assert index_identity(plain) == index_identity(changed)
    assert work_key(plain) == work_key(changed)


@pytest.mark.parametrize("override", [
    {"embedder": {"model": "bge-small-en-v1.5"}}, {"embedder": {"max_seq_length": 128}},
    {"chunker": {"size": 200}}, {"title_prefix": True}, {"shards": 2}, {"bm25": {"k1": 1.2}},
    {"faiss": {"factory": "HNSW32"}}, {"filters": {"prune_tau": 0.9}}, {"representation": "chunk"},
    {"generator": {"sampling": {"temperature": 0.7}}},
])
def test_what_decides_the_vectors_is_the_identity(override):
    base = {"representation": "atom-sentence"}
    assert index_identity(_dump(**base)) != index_identity(_dump(**deep_update(base, override)))


def test_the_documents_are_in_the_content_but_not_in_the_checkpoints_key():
    first = _dump(input="/data/a.jsonl")
    second = _dump(input="/data/b.jsonl")
    assert index_identity(first) != index_identity(second)
    assert work_key(first) == work_key(second) and "input" not in work_key(first)


def test_a_preset_counts_by_the_kinds_it_makes():
    named = index_identity(_dump(representation="atom-sentence"))
    spelled = index_identity(_dump(representation="sentence"))
    assert named == spelled and named["representation"] == {"kinds": ["sentence"], "granularity": None}


# ------------------------------------------------------------------------------------ moved settings
@pytest.mark.parametrize("text,new", [
    ("index: {factory: HNSW32}\n", "faiss"), ("output: /o\n", "build.output"),
    ("cache_dir: /c\n", "build.cache_dir"), ("embedder: {model: all-MiniLM-L6-v2, batch_size: 8}\n",
                                             "build.embedder.batch_size"),
])
def test_a_setting_at_its_old_place_is_an_error_naming_the_new_one(text, new, tmp_path):
    (config_file := tmp_path / "c.yaml").write_text(text)
    with pytest.raises(QragError, match=f" is now {re.escape(new)} ") as raised:
        build_index_config(config_file)
    assert "\n" not in str(raised.value)
    # eval variants, the matrix, the suite
    with pytest.raises(QragError, match=f"^where: invalid configuration: .*{re.escape(new)}"):
        index_config(yaml.safe_load(text), "where: ")


def _as_recorded_before_the_move(dump: dict) -> dict:
    """The same config as a manifest written before run settings moved under build: and index: became faiss:."""
    old = copy.deepcopy(dump)
    build = old["build"]
    old["embedder"] |= build.pop("embedder")
    old |= {k: build.pop(k) for k in ("output", "overwrite", "address", "num_cpus", "cache_dir")}
    old["index"] = old.pop("faiss")
    return old


@pytest.mark.parametrize("preset", ["default", "chunk", "atom-hybrid-bm25"])
def test_a_config_recorded_before_the_move_reads_as_today_with_the_same_identity(preset):
    cfg = index_config({"representation": preset, "generator": {"backend": "vllm"}, "faiss": {"nprobe": 8},
                        "build": {"output": "/o", "embedder": {"actors": 2}}})
    old = _as_recorded_before_the_move(cfg.model_dump(mode="json"))
    assert IndexConfig.model_validate(recorded_config(old)) == cfg
    assert index_identity(recorded_config(old)) == index_identity(cfg.model_dump(mode="json"))
    # the identity keeps the FAISS section's former name: checkpoints and manifests written before still match
    assert index_identity(cfg.model_dump(mode="json"))["index"]["nprobe"] == 8


def test_a_role_for_a_field_that_does_not_exist_is_an_error():
    with pytest.raises(ValueError, match="no field"):
        @field_roles(run=("bach_size",))
        class _Typo(Strict):
            batch_size: int = 1
    with pytest.raises(ValueError, match="unknown field role"):
        field_roles(speed=("x",))


def test_roles_are_inherited_and_a_section_role_covers_the_section():
    assert role_of(GeneratorConfig, "base_url") == "run"  # declared on LLMConfig
    assert role_of(GeneratorConfig, "prompt") == "spec"
    assert role_of(IndexConfig, "search") == "search" and "search" not in index_identity(_dump())
    assert role_of(IndexConfig, "build") == "run" and "build" not in index_identity(_dump())
    assert set(EXPERIMENTAL_SEARCH) == {"fusion", "kind_weights", "rrf_k", "kind_bias", "groups", "bm25_norm"}


# ------------------------------------------------------------------------------------------- presets
def test_the_preset_is_applied_by_index_config_and_fills_only_what_is_unset():
    data = {"representation": "default", "search": {"experimental": {"fusion": "max"}}}
    filled = with_preset(data)
    assert data == {"representation": "default", "search": {"experimental": {"fusion": "max"}}}  # not modified
    cfg = index_config(data)
    assert cfg.search.fusion == "max" and cfg.search.kind_weights == {"chunk": 0.5} and cfg.title_prefix
    assert filled["bm25"] == {"enabled": True}
    # a bare model is only what it is given: no preset is applied behind the caller's back
    assert not IndexConfig(representation="default").bm25.enabled
    # a recorded (complete) config validates to itself
    assert IndexConfig.model_validate(cfg.model_dump(mode="json")) == cfg


# ----------------------------------------------------------------------------------- shipped configs
@pytest.mark.parametrize("path", sorted((ROOT / "eval" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_eval_config_files_load(path):
    cfg = build_index_config(path)
    assert cfg.generator.backend == "vllm"


def _leaves(tree: dict, path: tuple = ()):
    for key, value in tree.items():
        yield from _leaves(value, (*path, key)) if isinstance(value, dict) and value else [((*path, key), value)]


def _at(tree, path: tuple):
    for key in path:
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


@pytest.mark.parametrize("path", sorted((ROOT / "eval" / "variants").glob("*.yaml")), ids=lambda p: p.name)
def test_eval_variant_files_load(path):
    """Every variant of a shipped file is a valid index config under a label of its own, and holds each
    setting the file gives it (one a preset, a rename or a default would drop shows here)."""
    from qrag_ray.evaluation.driver import load_variants

    variants = load_variants(path)
    labels = [v.label for v in variants]
    assert variants and len(set(labels)) == len(labels), labels
    for variant in variants:
        cfg = index_config(deep_update({"generator": {"backend": "vllm"}}, variant.overrides)).model_dump(mode="json")
        dropped = [(".".join(p), want, _at(cfg, p)) for p, want in _leaves(variant.overrides) if _at(cfg, p) != want]
        assert dropped == [], f"{variant.label}: (setting, in the file, in the config) {dropped}"


def test_the_variant_check_sees_a_dropped_setting():
    cfg = index_config({"representation": "default"}).model_dump(mode="json")
    assert [p for p, want in _leaves({"search": {"bm25_alpha": 0.5}, "shards": 2}) if _at(cfg, p) != want] == [
        ("search", "bm25_alpha"), ("shards",)]


def test_the_matrix_and_the_suite_load():
    from qrag_ray.evaluation.matrix import load_matrix
    from qrag_ray.evaluation.suite import load_suite

    assert load_matrix(ROOT / "eval" / "matrix.yaml")  # each condition validated as an index config
    assert load_suite(ROOT / "eval" / "suite.yaml").configs


@pytest.mark.parametrize("path,pointer", [
    ("k8s/base/index-config.yaml", lambda d: d["data"]["index.yaml"]),
    ("k8s/overlays/cpu-dev/index-config-cpu.yaml", lambda d: d[0]["value"]),
], ids=["base", "cpu-dev"])
def test_k8s_index_configs_load(path, pointer, tmp_path):
    config_file = tmp_path / "index.yaml"
    config_file.write_text(pointer(yaml.safe_load((ROOT / path).read_text())))
    assert build_index_config(config_file).representation == "hype"


# ---------------------------------------------------------------------------------- serving's LLM
def test_serving_llm_config_is_what_the_chat_model_takes():
    from qrag_ray.serving.config import parse_app_args

    args = parse_app_args({"index": "/a", "generator": {"backend": "openai", "base_url": "http://llm/v1",
                                                       "model": "m", "sampling": {"top_p": 0.9}}})
    # the Synthesizer hands this dump to generation.chat.get_chat_model, which reads it as a GeneratorConfig
    gen = GeneratorConfig.model_validate(args.generator.model_dump())
    assert (gen.backend, gen.base_url, gen.model, gen.sampling.top_p) == ("openai", "http://llm/v1", "m", 0.9)
