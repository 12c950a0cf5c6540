"""What a server's shard loads do once per state of a file (index/file_checks.py): the manifest parsed, a
shard file hashed. A file unchanged since it was hashed is not hashed again; a rewritten, corrupted or
republished one is, and a mismatch is still refused."""

from __future__ import annotations

import os

import pytest

from qrag_ray.errors import IndexFormatError
from qrag_ray.index import format as fmt
from qrag_ray.index.file_checks import manifest_now, verify_once

FILES = ("shards/00000.faiss", "shards/00000.arrow")


def _index(folder, payload: bytes = b"vectors") -> fmt.Manifest:
    for rel in FILES:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(payload + rel.encode())
    return fmt.write_manifest(folder, fmt.IndexDescription(
        representation="chunk", embedder=fmt.EmbedderInfo(model="m", dim=4), num_shards=1,
        shards=[fmt.ShardEntry(id=0, faiss=FILES[0], meta=FILES[1], vectors=0, vectors_before_filters=0, chunks=0,
                               kinds={}, seconds=0.0)]))


@pytest.fixture
def hashed(monkeypatch) -> list[str]:
    """The files sha256 is computed for, in order."""
    seen: list[str] = []
    real = fmt.sha256_file

    def counting(path):
        seen.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(fmt, "sha256_file", counting)
    return seen


def test_a_manifest_is_parsed_once_until_its_file_changes(tmp_path):
    _index(tmp_path)
    first = manifest_now(tmp_path)
    assert manifest_now(tmp_path) is first
    _index(tmp_path, b"other")  # republished in place: manifest.json written anew (temp file + rename)
    again = manifest_now(tmp_path)
    assert again is not first and again.index_version != first.index_version
    with pytest.raises(IndexFormatError, match="not a qrag index"):
        manifest_now(tmp_path / "shards")


def test_an_unchanged_file_is_hashed_once_and_a_changed_one_again(tmp_path, hashed):
    manifest = _index(tmp_path)
    hashed.clear()  # the build's own hashing
    verify_once(manifest, list(FILES))
    verify_once(manifest, list(FILES))
    assert hashed == ["00000.faiss", "00000.arrow"]
    path = tmp_path / FILES[0]
    stat = path.stat()
    path.write_bytes(path.read_bytes())  # same bytes, rewritten: a new mtime, so hashed again
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    verify_once(manifest, list(FILES))
    assert hashed == ["00000.faiss", "00000.arrow", "00000.faiss"]


def test_a_file_corrupted_after_it_was_hashed_is_still_refused(tmp_path, hashed):
    manifest = _index(tmp_path)
    verify_once(manifest, list(FILES))
    path = tmp_path / FILES[1]
    path.write_bytes(b"X" * path.stat().st_size)  # same size, other bytes
    with pytest.raises(IndexFormatError, match="checksum mismatch"):
        verify_once(manifest, list(FILES))
    with pytest.raises(IndexFormatError, match="checksum mismatch"):  # and on every later try
        verify_once(manifest, list(FILES))
    with pytest.raises(IndexFormatError, match="not listed"):
        verify_once(manifest, ["shards/nope.faiss"])
