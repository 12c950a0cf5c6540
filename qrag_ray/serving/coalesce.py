"""Calls that coalesce: what is asked for one key while that key's call runs goes into its next call,
together. The Router's query embedding (one model call per embedding model at a time) and its search
passes (one pass per index version and query parameters at a time) both run this way, so the busier the
Router, the bigger its calls and the fewer of them, and a lone request is never made to wait for company.

Serve's `@serve.batch` is not used for this: it closes a batch as soon as its loop runs and then queues the
closed batch for a free slot, so under load it sends many small batches one after another instead of one
big one; a shard pass has a fixed cost (the handle call on both sides, FAISS's per-call work, the reply),
which small passes pay again and again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class _Key:
    """One key's items waiting for its next call, and its calls running."""

    waiting: list[tuple[object, asyncio.Future]] = field(default_factory=list)
    running: int = 0
    tasks: set = field(default_factory=set)  # the running calls' tasks (asyncio keeps only weak references)


class Coalescer(Generic[Item, Result]):
    """`await submit(key, item)` is `run(key, items)`'s result for `item`, where `items` are the items of
    `key` that waited together: a key with no call running starts one at once; items submitted while
    one runs wait and go in the next, all of them, or `max_items` at a time. With `max_items`, that many
    waiting start another call beside the running one: a full call never waits for a partial one. A
    caller cancelled (its deadline) before its call starts is left out; one cancelled during its call
    does not stop it for the others. `run` raising reaches every caller of that call."""

    def __init__(self, run: Callable[[Hashable, list], Awaitable[list]], max_items: int | None = None):
        self.run, self.max_items = run, max_items
        self._keys: dict[Hashable, _Key] = {}

    async def submit(self, key: Hashable, item: Item) -> Result:
        k = self._keys.get(key)
        if k is None:
            k = self._keys[key] = _Key()
        fut = asyncio.get_running_loop().create_future()  # a deadline cancels it, not the call
        k.waiting.append((item, fut))
        if k.running == 0 or (self.max_items is not None and len(k.waiting) >= self.max_items):
            k.running += 1
            task = asyncio.ensure_future(self._calls(key, k))
            k.tasks.add(task)
            task.add_done_callback(k.tasks.discard)
        return await fut

    async def _calls(self, key: Hashable, k: _Key) -> None:
        """Calls while items wait, each over the items waiting when it starts (at most max_items)."""
        try:
            while k.waiting:
                n = self.max_items or len(k.waiting)
                now, k.waiting = [(i, f) for i, f in k.waiting[:n] if not f.done()], k.waiting[n:]
                if not now:
                    continue
                try:
                    results = await self.run(key, [i for i, _ in now])
                except Exception as e:  # noqa: BLE001 - each caller gets the error (a model that fails to load)
                    for _, f in now:
                        if not f.done():
                            f.set_exception(e)
                    continue
                for (_, f), r in zip(now, results):
                    if not f.done():
                        f.set_result(r)
        finally:
            k.running -= 1
            if k.running == 0 and not k.waiting and self._keys.get(key) is k:
                del self._keys[key]
