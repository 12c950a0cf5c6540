"""freeze_long_lived: what is alive is frozen (out of the collector's scans), what is garbage is collected first."""

from __future__ import annotations

import gc
import weakref

from qrag_ray.runtime.long_lived import freeze_long_lived


class _Node:
    def __init__(self):
        self.other = self  # a reference cycle: only the cyclic collector frees it


def test_live_objects_leave_the_scans_and_garbage_cycles_are_collected_first():
    kept = _Node()
    dropped = _Node()
    gone = weakref.ref(dropped)
    del dropped  # garbage, but only a collection can free the cycle
    assert gone() is not None
    try:
        freeze_long_lived()
        assert gone() is None  # collected before the freeze, not frozen with the living
        assert gc.get_freeze_count() > 0
        assert not any(o is kept for o in gc.get_objects())  # no collection walks it any more
        later = _Node()
        assert any(o is later for o in gc.get_objects())  # what comes after is scanned as before
    finally:
        gc.unfreeze()  # the test process's collector as it was
