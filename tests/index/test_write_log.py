"""The write-ahead log (qrag_ray/index/write_log.py): every append gets its own number, numbers are
contiguous whatever the writers (threads, processes), an entry is complete and fsynced before append
returns, temporaries and unreadable files never pass for entries, pruning never lets a number be reused
under the applier. Unit tier: files only."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading

import pytest

from qrag_ray.index.write_log import FLOOR, WriteLog, entry_name, parse_write_id, write_id


def _upsert(log: WriteLog, tag: str):
    return log.append("upsert", {"records": [{"doc_id": tag, "title": "", "text": tag, "url": "", "metadata": {},
                                              "hash": tag}]})


def test_appends_are_numbered_in_order_and_read_back(tmp_path):
    log = WriteLog(tmp_path)
    first = _upsert(log, "a")
    second = log.append("delete", {"ids": ["a"]})
    third = log.append("delete", {"filter": {"type": "eq", "key": "lang", "value": "en"}})
    assert [first.seq, second.seq, third.seq] == [1, 2, 3]
    assert log.numbers() == [1, 2, 3] and log.last_seq() == 3
    back = log.read(1)
    assert back.operation == "upsert" and back.records[0]["doc_id"] == "a" and back.write_id == first.write_id
    assert back.documents == 1 and log.read(2).documents == 1 and log.read(3).documents is None
    assert log.read(3).filter == {"type": "eq", "key": "lang", "value": "en"}
    assert [e.seq for e in log.entries_after(1)] == [2, 3]
    assert log.pending_bytes(1) == sum(os.path.getsize(log.dir / entry_name(n)) for n in (2, 3)) > 0
    assert parse_write_id(first.write_id) == (1, first.write_id.split("-")[1])
    assert parse_write_id("1-abc") is None and parse_write_id("../etc") is None
    assert write_id(7, "0123456789ab") == "000000000007-0123456789ab"


def test_an_entry_is_fsynced_with_its_directory_before_append_returns(tmp_path, monkeypatch):
    log = WriteLog(tmp_path)
    _upsert(log, "warm")  # the folder exists
    synced = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    _upsert(log, "b")
    # the entry's bytes (written under a temporary name, then linked) and then the log folder
    assert synced[0].startswith(str(log.dir / ".")) and synced[0].endswith(".tmp")
    assert synced[-1] == str(log.dir)
    assert not [n for n in os.listdir(log.dir) if n.endswith(".tmp")]  # the temporary is gone


def test_concurrent_threads_get_distinct_contiguous_numbers(tmp_path):
    log = WriteLog(tmp_path)
    got: list[int] = []
    lock = threading.Lock()

    def writer(w: int):
        own = WriteLog(tmp_path)  # each thread its own instance, as Router replicas are
        for i in range(25):
            entry = _upsert(own if i % 2 else log, f"{w}-{i}")
            with lock:
                got.append(entry.seq)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 201))
    tags = [e.records[0]["doc_id"] for e in log.entries_after(0)]
    assert len(set(tags)) == 200  # every batch once


def _process_writer(root: str, tag: int, count: int, out) -> None:
    log = WriteLog(root)
    out.put([_upsert(log, f"{tag}-{i}").seq for i in range(count)])


def test_concurrent_processes_get_distinct_contiguous_numbers(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_process_writer, args=(str(tmp_path), p, 30, out)) for p in range(4)]
    for p in procs:
        p.start()
    seqs = [s for _ in procs for s in out.get(timeout=120)]
    for p in procs:
        p.join(timeout=60)
    assert sorted(seqs) == list(range(1, 121))
    # each process saw its own numbers rise: one order that every writer agrees on
    assert len({e.records[0]["doc_id"] for e in WriteLog(tmp_path).entries_after(0)}) == 120


def test_temporaries_and_unreadable_entries_are_not_taken_for_writes(tmp_path):
    log = WriteLog(tmp_path)
    _upsert(log, "a")
    (log.dir / ".deadbeef.tmp").write_text('{"operation": "upsert", "nonce"')  # a writer killed mid-write
    (log.dir / "notes.txt").write_text("x")
    (log.dir / entry_name(2)).write_text('{"operation": "upsert", "no')  # a damaged file at a number
    assert log.numbers() == [1, 2]
    entries = log.entries_after(0)
    assert entries[0].error is None
    assert entries[1].error is not None and "unreadable" in entries[1].error and entries[1].records is None
    assert _upsert(log, "b").seq == 3  # the next writer goes past both


def test_pruning_keeps_numbers_rising_and_a_racing_writer_never_reuses_one(tmp_path):
    log = WriteLog(tmp_path)
    for tag in "abcd":
        _upsert(log, tag)
    assert log.prune(3) == 3
    assert log.numbers() == [4] and log.floor() == 3 and (log.dir / FLOOR).read_text().strip() == "3"
    assert _upsert(log, "e").seq == 5
    log.prune(5)
    assert log.numbers() == [] and log.last_seq() == 5
    # a writer that listed the folder before the pruning links into a freed number: it must notice
    stale = WriteLog(tmp_path)
    stale._next_hint = 2
    stale.last_seq = lambda: 1  # what it saw before the pruning
    entry = _upsert(stale, "late")
    assert entry.seq == 6 and WriteLog(tmp_path).numbers() == [6]
    assert json.loads((log.dir / entry_name(6)).read_text())["records"][0]["doc_id"] == "late"


def test_an_unknown_operation_is_refused(tmp_path):
    with pytest.raises(ValueError):
        WriteLog(tmp_path).append("merge", {})
