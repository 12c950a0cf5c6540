"""The write state (qrag_ray/index/write_state.py), the interface the search side reads: the visibility
rule, the STATE file's round trip and its per-identity cache, the file locks. Unit tier: files only."""

from __future__ import annotations

import json
import os
import threading

import pytest

from qrag_ray.errors import IndexFormatError
from qrag_ray.index.write_state import (
    APPLY_LOCK,
    Delta,
    WriteState,
    delta_name,
    is_locked,
    load_write_state,
    locked,
    publish_state,
    read_write_state,
    state_path,
)


def _state(root, **kw) -> WriteState:
    deltas = (Delta(root / "writes" / "deltas" / delta_name(3, 5), 3, 5, chunks=4, vectors=20, created_at=1.0),
              Delta(root / "writes" / "deltas" / delta_name(6, 9), 6, 9, chunks=1, vectors=5, created_at=2.0))
    base = dict(root=root, generation=9, base_version="v1", base_seq=2, deltas=deltas,
                tombstones={"a": 4, "b": 7, "c": 9, "gone": 8}, metadata_schema={"lang": "string"},
                hashes={"a": "ha", "b": "hb", "c": "hc"})
    return WriteState(**{**base, **kw})


def test_every_document_is_visible_in_at_most_one_segment(tmp_path):
    """A chunk of D in a segment whose newest sequence number is G counts iff tombstones.get(D, -1) <= G:
    the base (G = base_seq) hides every document written since, each delta shows the documents whose
    latest write it holds, and a document deleted last shows nowhere."""
    st = _state(tmp_path)
    segments = [st.base_seq] + [d.last_seq for d in st.deltas]  # 2, 5, 9
    # where each document's chunks could be: untouched ones in the base only; a in the base (its old
    # version) and in delta 3-5 (its write at 4); b in the base and in 6-9 (7); c only in 6-9 (9)
    holders = {"untouched": [2], "a": [2, 5], "b": [2, 9], "c": [9], "gone": [2, 5]}
    for doc, held_by in holders.items():
        shown = [g for g in segments if g in held_by and st.visible(doc, g)]
        want = {"untouched": [2], "a": [5], "b": [9], "c": [9], "gone": []}[doc]
        assert shown == want, doc
    assert st.hidden_in_base == {"a", "b", "c", "gone"}
    assert st.hidden(5) == {"b", "c", "gone"} and st.hidden(9) == frozenset()
    segs = st.segments()
    assert [(s.path.name, s.seq) for s in segs] == [("v1", 2), (st.deltas[0].name, 5), (st.deltas[1].name, 9)]
    assert [s.hidden for s in segs] == [st.hidden(2), st.hidden(5), st.hidden(9)]
    assert st.version_key == ("v1", 9)


def test_the_state_file_round_trips_and_is_replaced_atomically(tmp_path):
    st = publish_state(_state(tmp_path))
    back = load_write_state(tmp_path)
    assert back == st and back.updated_at > 0
    assert back.deltas[0].path == tmp_path / "writes" / "deltas" / "000000000003-000000000005"
    data = json.loads(state_path(tmp_path).read_text())
    assert data["deltas"][1]["path"] == "writes/deltas/000000000006-000000000009"  # relative: the root may move
    assert not [n for n in os.listdir(tmp_path / "writes") if n.endswith(".tmp")]


def test_reading_is_cached_on_the_files_identity(tmp_path):
    assert read_write_state(tmp_path) is None
    first = publish_state(_state(tmp_path))
    assert read_write_state(tmp_path) is read_write_state(tmp_path)  # parsed once while unchanged
    second = publish_state(_state(tmp_path, generation=10))
    assert read_write_state(tmp_path).generation == 10 != first.generation
    assert second.updated_at >= first.updated_at


def test_a_damaged_state_file_is_one_line(tmp_path):
    state_path(tmp_path).parent.mkdir(parents=True)
    state_path(tmp_path).write_text('{"format": 1, "generation": ')
    with pytest.raises(IndexFormatError, match="corrupt write state"):
        load_write_state(tmp_path)
    state_path(tmp_path).write_text('{"format": 1}')
    with pytest.raises(IndexFormatError, match="generation"):
        load_write_state(tmp_path)


def test_a_lock_is_held_by_one_holder_at_a_time(tmp_path):
    assert not is_locked(tmp_path, APPLY_LOCK)
    seen = []
    with locked(tmp_path, APPLY_LOCK) as held:
        assert held and is_locked(tmp_path, APPLY_LOCK)

        def other():
            with locked(tmp_path, APPLY_LOCK, wait=False) as got:
                seen.append(got)

        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == [False]
    assert not is_locked(tmp_path, APPLY_LOCK)
