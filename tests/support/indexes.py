"""The one index builder of the tests: `build_index` for a config given as `build_index_config` keyword
overrides (dotted keys nest: {"chunker.size": 120})."""

from __future__ import annotations


def build(cfg_kwargs: dict, console=None):
    """build_index for a config given as build_index_config keyword overrides."""
    from qrag_ray.config.index import build_index_config
    from qrag_ray.index.build import build_index

    return build_index(build_index_config(None, **cfg_kwargs), console=console)
