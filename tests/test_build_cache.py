"""The tests' shared build cache (tests/support/build_cache.py): one build per content key across the
processes of a run, each asker gets its own copy, and anything that decides the build changes the key."""

from __future__ import annotations

import threading
import time

import pytest

from support import build_cache
from support.build_cache import ENV, content_key, file_digest, shared


def _maker(out, calls: list, text: str = "vectors"):
    def make():
        calls.append(out)
        out.mkdir(parents=True)
        (out / "data.bin").write_text(text)
        return {"built_at": str(out), "n": len(calls)}

    return make


def test_without_the_variable_every_call_builds(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    calls: list = []
    shared({"a": 1}, tmp_path / "x", _maker(tmp_path / "x", calls))
    shared({"a": 1}, tmp_path / "y", _maker(tmp_path / "y", calls))
    assert calls == [tmp_path / "x", tmp_path / "y"]


def test_the_same_spec_is_built_once_and_each_asker_gets_its_own_copy(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "cache"))
    calls: list = []
    first = shared({"a": 1}, tmp_path / "p1", _maker(tmp_path / "p1", calls))
    second = shared({"a": 1}, tmp_path / "p2", _maker(tmp_path / "p2", calls))
    assert calls == [tmp_path / "p1"] and second == first == {"built_at": str(tmp_path / "p1"), "n": 1}
    assert (tmp_path / "p2" / "data.bin").read_text() == "vectors"
    # a test that changes its copy changes nobody else's
    (tmp_path / "p2" / "data.bin").write_text("corrupted")
    shared({"a": 1}, tmp_path / "p3", _maker(tmp_path / "p3", calls))
    assert (tmp_path / "p3" / "data.bin").read_text() == "vectors" and len(calls) == 1
    # another spec is another build
    shared({"a": 2}, tmp_path / "p4", _maker(tmp_path / "p4", calls, "other"))
    assert len(calls) == 2 and (tmp_path / "p4" / "data.bin").read_text() == "other"


def test_a_failed_build_stores_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "cache"))

    def boom():
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError, match="build failed"):
        shared({"a": 1}, tmp_path / "p1", boom)
    calls: list = []
    shared({"a": 1}, tmp_path / "p2", _maker(tmp_path / "p2", calls))
    assert calls == [tmp_path / "p2"]


def test_two_askers_at_once_build_once(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "cache"))
    calls: list = []

    def slow(out):
        def make():
            time.sleep(0.3)
            return _maker(out, calls)()

        return make

    threads = [threading.Thread(target=shared, args=({"a": 1}, tmp_path / f"p{i}", slow(tmp_path / f"p{i}")))
               for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert all((tmp_path / f"p{i}" / "data.bin").read_text() == "vectors" for i in range(2))


def test_the_key_follows_the_package_the_inputs_and_the_environment(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text("X = 1\n")
    monkeypatch.setattr(build_cache, "PACKAGE", pkg)
    monkeypatch.delenv("QRAG_SOMETHING", raising=False)
    build_cache.environment_digest.cache_clear()
    try:
        base = content_key({"a": 1})
        assert content_key({"a": 1}) == base != content_key({"a": 2})
        (pkg / "mod.py").write_text("X = 2\n")  # the code changed
        build_cache.environment_digest.cache_clear()
        changed = content_key({"a": 1})
        assert changed != base
        monkeypatch.setenv("QRAG_SOMETHING", "1")  # a setting the build may read
        build_cache.environment_digest.cache_clear()
        with_setting = content_key({"a": 1})
        assert with_setting not in (base, changed)
        monkeypatch.setenv("QRAG_TEST_DURATIONS", "/elsewhere")  # the tests' own variables are not
        build_cache.environment_digest.cache_clear()
        assert content_key({"a": 1}) == with_setting
    finally:
        build_cache.environment_digest.cache_clear()
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": 1}\n')
    digest = file_digest(corpus)
    corpus.write_text('{"id": 2}\n')
    assert file_digest(corpus) != digest
