"""Versioned index roots and `qrag publish` (real indexes, no Ray at test time beyond the session's
index builds): a publish checks before it moves CURRENT, a broken build never becomes current,
old versions are pruned but never the one being replaced, rollback points back."""

from __future__ import annotations

import shutil

import pytest

from qrag_ray.errors import IndexFormatError, QragError
from qrag_ray.index.format import load_manifest
from qrag_ray.index.versions import CURRENT, VERSIONS, list_versions, publish_version, resolve_index, rollback

pytestmark = pytest.mark.integration  # real Ray, MiniLM, FAISS or Serve


@pytest.fixture()
def two_indexes(kinds_index, sentence_cli_index):
    first = kinds_index[0]
    second = sentence_cli_index[0]
    first_version = load_manifest(first).index_version
    second_version = load_manifest(second).index_version
    assert first_version != second_version
    return first, first_version, second, second_version


def test_publish_moves_current_only_after_checking(tmp_path, two_indexes):
    first, first_version, second, second_version = two_indexes
    root = tmp_path / "root"
    info = publish_version(root, first)
    assert info["index_version"] == first_version and info["previous"] is None
    resolved = resolve_index(root)
    assert resolved.version == first_version and resolved.dir == root / VERSIONS / first_version
    assert (root / CURRENT).read_text().strip() == first_version
    # a plain index directory resolves to itself
    assert resolve_index(first).dir == first and resolve_index(first).version == first_version
    # a corrupt build is refused before anything moves
    bad = tmp_path / "bad"
    shutil.copytree(second, bad)
    path = bad / "shards" / "00001.faiss"
    path.write_bytes(path.read_bytes()[:-64] + bytes(64))
    with pytest.raises(IndexFormatError, match="checksum"):
        publish_version(root, bad)
    assert resolve_index(root).version == first_version and list_versions(root) == [first_version]
    info = publish_version(root, second)
    assert info["previous"] == first_version and resolve_index(root).version == second_version
    assert set(list_versions(root)) == {first_version, second_version}
    # publishing the same build again is idempotent
    assert publish_version(root, second)["index_version"] == second_version and len(list_versions(root)) == 2


def test_keep_prunes_old_versions_but_never_the_one_replaced(tmp_path, two_indexes):
    first, first_version, second, second_version = two_indexes
    root = tmp_path / "root"
    publish_version(root, first)
    publish_version(root, second)
    third = tmp_path / "c"  # a third distinct version: a's files with one chunk text changed
    shutil.copytree(first, third)
    import json

    manifest = json.loads((third / "manifest.json").read_text())
    from qrag_ray.index.format import IndexDescription, write_manifest

    (third / "extra.txt").write_text("a third version\n")
    desc = IndexDescription.model_validate({k: v for k, v in manifest.items() if k in IndexDescription.model_fields})
    third_version = write_manifest(third, desc).index_version
    info = publish_version(root, third, keep=2)
    assert info["previous"] == second_version and info["removed"] == [first_version]
    assert set(list_versions(root)) == {second_version, third_version}
    with pytest.raises(QragError, match="at least 2"):
        publish_version(root, first, keep=1)


def test_rollback_and_bad_roots(tmp_path, two_indexes):
    first, first_version, second, second_version = two_indexes
    root = tmp_path / "root"
    publish_version(root, first)
    publish_version(root, second)
    assert rollback(root, first_version) == first_version and resolve_index(root).version == first_version
    with pytest.raises(QragError, match="not published"):
        rollback(root, "nope")
    with pytest.raises(QragError, match="plain index directory"):
        publish_version(first, second)
    empty = tmp_path / "empty"
    (empty / VERSIONS).mkdir(parents=True)
    with pytest.raises(IndexFormatError, match="nothing published"):
        resolve_index(empty)


def test_publish_cli(tmp_path, two_indexes, capsys):
    from qrag_ray.cli import main

    first, first_version, second, second_version = two_indexes
    root = tmp_path / "root"
    assert main(["publish", str(first), "--root", str(root)]) == 0
    assert capsys.readouterr().out.strip() == first_version
    assert main(["publish", str(second), "--root", str(root)]) == 0
    err = capsys.readouterr().err
    assert f"was {first_version}" in err
    assert main(["publish", str(tmp_path / "missing"), "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "index not found" in err and "Traceback" not in err
    assert main(["publish", str(first), "--root", str(root), "--rollback", first_version]) == 0
    assert resolve_index(root).version == first_version
