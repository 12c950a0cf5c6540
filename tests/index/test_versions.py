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
    a, b = kinds_index[0], sentence_cli_index[0]
    va, vb = load_manifest(a).index_version, load_manifest(b).index_version
    assert va != vb
    return a, va, b, vb


def test_publish_moves_current_only_after_checking(tmp_path, two_indexes):
    a, va, b, vb = two_indexes
    root = tmp_path / "root"
    info = publish_version(root, a)
    assert info["index_version"] == va and info["previous"] is None
    resolved = resolve_index(root)
    assert resolved.version == va and resolved.dir == root / VERSIONS / va and (root / CURRENT).read_text().strip() == va
    # a plain index directory resolves to itself
    assert resolve_index(a).dir == a and resolve_index(a).version == va
    # a corrupt build is refused before anything moves
    bad = tmp_path / "bad"
    shutil.copytree(b, bad)
    path = bad / "shards" / "00001.faiss"
    path.write_bytes(path.read_bytes()[:-64] + bytes(64))
    with pytest.raises(IndexFormatError, match="checksum"):
        publish_version(root, bad)
    assert resolve_index(root).version == va and list_versions(root) == [va]
    info = publish_version(root, b)
    assert info["previous"] == va and resolve_index(root).version == vb
    assert set(list_versions(root)) == {va, vb}
    # publishing the same build again is idempotent
    assert publish_version(root, b)["index_version"] == vb and len(list_versions(root)) == 2


def test_keep_prunes_old_versions_but_never_the_one_replaced(tmp_path, two_indexes):
    a, va, b, vb = two_indexes
    root = tmp_path / "root"
    publish_version(root, a)
    publish_version(root, b)
    c = tmp_path / "c"  # a third distinct version: a's files with one chunk text changed
    shutil.copytree(a, c)
    import json

    manifest = json.loads((c / "manifest.json").read_text())
    from qrag_ray.index.format import IndexDescription, write_manifest

    (c / "extra.txt").write_text("a third version\n")
    desc = IndexDescription.model_validate({k: v for k, v in manifest.items() if k in IndexDescription.model_fields})
    vc = write_manifest(c, desc).index_version
    info = publish_version(root, c, keep=2)
    assert info["previous"] == vb and info["removed"] == [va]
    assert set(list_versions(root)) == {vb, vc}
    with pytest.raises(QragError, match="at least 2"):
        publish_version(root, a, keep=1)


def test_rollback_and_bad_roots(tmp_path, two_indexes):
    a, va, b, vb = two_indexes
    root = tmp_path / "root"
    publish_version(root, a)
    publish_version(root, b)
    assert rollback(root, va) == va and resolve_index(root).version == va
    with pytest.raises(QragError, match="not published"):
        rollback(root, "nope")
    with pytest.raises(QragError, match="plain index directory"):
        publish_version(a, b)
    empty = tmp_path / "empty"
    (empty / VERSIONS).mkdir(parents=True)
    with pytest.raises(IndexFormatError, match="nothing published"):
        resolve_index(empty)


def test_publish_cli(tmp_path, two_indexes, capsys):
    from qrag_ray.cli import main

    a, va, b, vb = two_indexes
    root = tmp_path / "root"
    assert main(["publish", str(a), "--root", str(root)]) == 0
    assert capsys.readouterr().out.strip() == va
    assert main(["publish", str(b), "--root", str(root)]) == 0
    err = capsys.readouterr().err
    assert f"was {va}" in err
    assert main(["publish", str(tmp_path / "missing"), "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "index not found" in err and "Traceback" not in err
    assert main(["publish", str(a), "--root", str(root), "--rollback", va]) == 0
    assert resolve_index(root).version == va
