"""What a server's shard loads would otherwise repeat, done once per state of a file in this process: the
manifest parsed, a shard file's sha256 checked. A file's state is its identity (device, inode, size,
mtime in ns): a published version's files never change after `qrag publish` has checked them, and a file
rewritten in place gets a new identity (a new inode after an atomic rename, or a new mtime), so it is
parsed or hashed again. A shard evicted by the byte budget and loaded again later reads its files but
does not hash them twice; a new version, a republished directory or a modified file is hashed in full."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

from qrag_ray.index.format import MANIFEST, Manifest, load_manifest, verify_files

_KEEP = 1 << 16  # (file, sha256) pairs and manifests remembered per process (least recently used dropped)
_lock = threading.Lock()
_hashed: OrderedDict[tuple[str, str], tuple[int, ...]] = OrderedDict()  # (file, sha256) -> identity hashed
_manifests: OrderedDict[tuple[str, tuple[int, ...]], Manifest] = OrderedDict()  # (dir, manifest identity)


def identity(path: str | Path) -> tuple[int, ...]:
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def _remember(cache: OrderedDict, key, value) -> None:
    with _lock:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > _KEEP:
            cache.popitem(last=False)


def manifest_now(index_dir: str | Path) -> Manifest:
    """`load_manifest(index_dir)`, parsed once per state of its manifest.json."""
    folder = Path(index_dir)
    try:
        key = (str(folder), identity(folder / MANIFEST))
    except OSError:  # no manifest: load_manifest says what is wrong
        return load_manifest(folder)
    if (manifest := _manifests.get(key)) is None:
        _remember(_manifests, key, manifest := load_manifest(folder))
    return manifest


def verify_once(manifest: Manifest, rels: list[str]) -> None:
    """`verify_files(m, rels)`, skipping each file hashed in this process against the same sha256 and
    unchanged since."""
    for rel in rels:
        path = manifest.file(rel)
        want = manifest.files.get(rel)
        try:
            now = identity(path)
        except OSError:
            now = None
        if now is not None and _hashed.get((str(path), want or "")) == now:
            continue
        verify_files(manifest, [rel])  # raises on a mismatch or a file the manifest does not list
        if now is not None and identity(path) == now:  # unchanged while it was hashed
            _remember(_hashed, (str(path), want), now)
