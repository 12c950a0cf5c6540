"""Versioned index roots, `ROOT/versions/<index_version>/` plus `ROOT/CURRENT` (the version to serve),
so a served index is replaced while queries run and no query reads two versions. `qrag publish`
checks a copy before it moves `CURRENT` atomically; a plain index directory is its manifest's version.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from qrag_ray.errors import IndexFormatError, QragError
from qrag_ray.index.file_checks import manifest_now
from qrag_ray.index.format import MANIFEST, Manifest, atomic_write, atomic_write_text, load_manifest

CURRENT = "CURRENT"
VERSIONS = "versions"


@dataclass(frozen=True)
class ResolvedIndex:
    """What one tenant's index path points at right now."""

    root: Path  # the path the tenant names
    dir: Path  # the directory holding manifest.json
    manifest: Manifest  # read once here, so callers need not read it again

    @property
    def version(self) -> str:
        return self.manifest.index_version


def is_versioned_root(path: str | Path) -> bool:
    folder = Path(path)
    return (folder / CURRENT).is_file() or ((folder / VERSIONS).is_dir() and not (folder / MANIFEST).is_file())


def current_version_name(root: str | Path) -> str:
    pointer = Path(root) / CURRENT
    try:
        name = pointer.read_text().strip()
    except FileNotFoundError:
        raise IndexFormatError(f"{root} is a versioned index root with nothing published yet (no {CURRENT})") from None
    if not name or "/" in name or name.startswith("."):
        raise IndexFormatError(f"{pointer} holds no valid version name: {name!r}")
    return name


def resolve_index(path: str | Path) -> ResolvedIndex:
    """The directory and version a tenant's index path serves now (reads one small file or two; the
    manifest is parsed once per state of its file, so a server re-checking every tenant's pointer costs a
    few stats each)."""
    root = Path(path)
    folder = root / VERSIONS / current_version_name(root) if is_versioned_root(root) else root
    return ResolvedIndex(root, folder, manifest_now(folder))


def check_index(index_dir: str | Path) -> dict:
    """What a server does when it loads the index: every checksum, every shard's FAISS file opened."""
    from qrag_ray.index.faiss_search import open_faiss

    manifest = load_manifest(index_dir, verify=True)
    vectors = sum(open_faiss(manifest.file(manifest.shard(number).faiss), manifest).ntotal
                  for number in range(manifest.num_shards))
    if manifest.counts and vectors != manifest.counts.vectors:
        raise IndexFormatError(f"{index_dir}: shards hold {vectors} vectors, the manifest counts "
                               f"{manifest.counts.vectors}")
    return {"index_version": manifest.index_version, "num_shards": manifest.num_shards, "vectors": vectors}


def list_versions(root: str | Path) -> list[str]:
    """Published version names, oldest first (by the time they were published)."""
    versions_dir = Path(root) / VERSIONS
    if not versions_dir.is_dir():
        return []
    dirs = [d for d in versions_dir.iterdir() if d.is_dir() and not d.name.startswith(".") and (d / MANIFEST).is_file()]
    return [d.name for d in sorted(dirs, key=lambda d: (d.stat().st_mtime, d.name))]


def publish_version(root: str | Path, index_dir: str | Path, keep: int = 2, move: bool = False) -> dict:
    """Copy a built index into ROOT/versions/<index_version>, check it, point CURRENT at it, and delete
    versions beyond the `keep` newest (never the one just replaced: servers may still be draining it).
    `move`: rename the index into place instead of copying it (a build made on the root's own filesystem,
    inside the root: a compaction's)."""
    if keep < 2:
        raise QragError("--keep must be at least 2: the version being replaced stays until servers moved off it")
    src = Path(index_dir)
    root_dir = Path(root)
    if (root_dir / MANIFEST).is_file():
        raise QragError(f"{root_dir} is a plain index directory, not a versioned root: publish into a new path")
    inside = src.resolve() == root_dir.resolve() or root_dir.resolve() in src.resolve().parents
    if inside and (not move or (root_dir / VERSIONS).resolve() in src.resolve().parents):
        raise QragError(f"the index to publish ({src}) must not lie inside the root ({root_dir})")
    info = check_index(src)  # a broken build never reaches versions/
    name = info["index_version"]
    versions = root_dir / VERSIONS
    versions.mkdir(parents=True, exist_ok=True)
    dest = versions / name
    previous = current_version_name(root_dir) if (root_dir / CURRENT).is_file() else None
    if not (dest / MANIFEST).is_file():  # the copy is checked too, as the servers will read it
        if move:
            os.replace(src, dest)
        else:
            atomic_write(dest, lambda tmp: check_index(shutil.copytree(src, tmp)))
    elif move:
        shutil.rmtree(src, ignore_errors=True)  # that very version is published already
    os.utime(dest)  # newest published, for pruning order
    atomic_write_text(root_dir / CURRENT, name + "\n")
    names = list_versions(root_dir)
    removed = [old for old in names[: max(0, len(names) - keep)] if old not in (name, previous)]
    for old in removed:
        shutil.rmtree(versions / old, ignore_errors=True)
    return {**info, "root": str(root_dir), "previous": previous, "removed": removed}


def rollback(root: str | Path, version: str) -> str:
    """Point CURRENT at an already published version (it stays checked: versions are immutable)."""
    root_dir = Path(root)
    folder = root_dir / VERSIONS / version
    if not (folder / MANIFEST).is_file():
        have = ", ".join(list_versions(root_dir)) or "none"
        raise QragError(f"version {version!r} is not published under {root_dir} (published: {have})")
    load_manifest(folder, verify=True)
    atomic_write_text(root_dir / CURRENT, version + "\n")
    return version
