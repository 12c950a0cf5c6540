"""Keeping a server process's long-lived objects out of Python's cyclic garbage collector."""

from __future__ import annotations

import gc


def freeze_long_lived() -> None:
    """Collect what is garbage now, then move every object still alive out of the collector's scans
    (`gc.freeze`). A Serve replica holds a great many objects for its whole life (Ray, Serve,
    FastAPI, torch, the models, the loaded indexes' Python parts), and every full collection walks them
    all again, however few of the objects a request makes survive; frozen, a collection walks only what
    came after. Call it once the process holds what it keeps (models and warm tenants loaded): what is
    frozen is never collected, so a cycle made garbage later stays in memory."""
    gc.collect()
    gc.freeze()
