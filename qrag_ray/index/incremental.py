"""`qrag index --append FILE` / `--delete-ids FILE`: the published index's config (from its manifest,
so nothing that decides a vector drifts) plus the change, built the ordinary way with the work dir
kept: rows are keyed by content, so only new documents are embedded, and the result is the index a
full rebuild over the same documents would publish, file for file."""

from __future__ import annotations

from qrag_ray.config.index import IndexConfig, recorded_config, resolve_representation
from qrag_ray.errors import QragError
from qrag_ray.index.format import Manifest, load_manifest
from qrag_ray.io.metadata import TYPE_NAMES


def incremental_config(output: str, append: str | None = None, delete_ids: str | None = None) -> IndexConfig:
    if not append and not delete_ids:
        raise QragError("an incremental build needs --append FILE or --delete-ids FILE")
    try:
        manifest = load_manifest(output)
    except QragError as error:
        raise QragError(f"--append/--delete-ids update an existing index: {error}") from None
    data = published_config(manifest)
    if not data.get("input"):
        raise QragError(f"{output}: its manifest records no input; rebuild it with this qrag first")
    build = data.setdefault("build", {})
    build["extra_inputs"] = list(build.get("extra_inputs") or []) + ([append] if append else [])
    build["delete_ids"] = list(build.get("delete_ids") or []) + ([delete_ids] if delete_ids else [])
    build.update(keep_work=True, output=str(output), overwrite=True)
    return IndexConfig.model_validate(data)


def published_config(manifest: Manifest) -> dict:
    """The config that built the index of `manifest`, in today's layout whichever release built it, with
    the vector kinds the index holds: what an incremental build, a write's delta and a compaction build
    with, so nothing that decides a vector drifts."""
    data = recorded_config(manifest.config)
    try:
        now = resolve_representation(str(data.get("representation") or "default"))[0]
    except ValueError:
        now = None
    if manifest.kinds and now != list(manifest.kinds):
        # the preset's name means other kinds since this index was built: keep the kinds the index holds
        data["representation"] = "+".join(manifest.kinds)
    return data


def check_fields(published: dict[str, str] | None, new: dict[str, str]) -> None:
    """An append may add metadata fields; a field of the published index that changed type is the
    build's one error line (the documents' own conflicts are caught where they are read)."""
    for name, typ in sorted((published or {}).items()):
        if new.get(name, typ) != typ:
            raise QragError(f"metadata field {name!r} is {TYPE_NAMES[new[name]]} in the new documents, but the "
                            f"published index has it as {TYPE_NAMES[typ]} (one type per field)")
