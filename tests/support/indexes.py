"""The one index builder of the tests: `build_index` for a config given as `build_index_config` keyword
overrides (dotted keys nest: {"chunker.size": 120}); `shared_build`, the same build shared by content
across the pytest processes of a run (support/build_cache.py) for an index that tests only read."""

from __future__ import annotations

from pathlib import Path

from support.build_cache import file_digest, shared


def build(cfg_kwargs: dict, console=None):
    """build_index for a config given as build_index_config keyword overrides."""
    from qrag_ray.config.index import build_index_config
    from qrag_ray.index.build import build_index

    return build_index(build_index_config(None, **cfg_kwargs), console=console)


def shared_build(cfg_kwargs: dict, console=None):
    """`build(cfg_kwargs)`, built once per run for its content: later processes get a copy at their own
    "build.output" and the first build's BuildReport (its `output` set to the copy). The input file is
    keyed by its bytes, so the same corpus written to another process's tmp folder is the same build."""
    out = Path(cfg_kwargs["build.output"])
    spec = {k: v for k, v in cfg_kwargs.items() if k != "build.output"}
    if isinstance(spec.get("build"), dict) and "output" in spec["build"]:
        raise ValueError('shared_build: give the output as "build.output"')
    spec["input"] = file_digest(Path(spec["input"]))
    report = shared({"build_index": spec}, out, lambda: build(cfg_kwargs, console))
    report.output = str(out)
    return report
