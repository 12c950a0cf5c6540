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
import contextvars
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
    idle: int = 0  # calls started that have not taken their items yet
    tasks: set = field(default_factory=set)  # the running calls' tasks (asyncio keeps only weak references)


class Coalescer(Generic[Item, Result]):
    """`await submit(key, item)` is `run(key, items)`'s result for `item`, where `items` are the items of
    `key` that waited together: a key with no call running starts one at once; items submitted while
    one runs wait and go in the next, all of them, or `max_items` at a time. With `max_items`, that many
    waiting start another call beside the running one: a full call never waits for a partial one. A
    caller cancelled (its deadline) before its call starts is left out; one cancelled during its call
    does not stop it for the others. `run` raising reaches every caller of that call.

    A call runs in a task of its own with an empty context: it serves several requests, so it carries
    none's (in a Serve replica, a request's context makes the handle calls made in it that request's
    children, cancelled with it: one client going away would cancel the others' shard call).

    `slots(key)` (1 without it) is how many calls of a key may run at once before items wait: a key with a
    free slot starts a call for a new item at once, and the items waiting when calls take them are split
    evenly over the calls that take them together (the calls just started and the free slots), so a
    backend that can take several calls at once (a shard group with several replicas) gets them as soon
    as they are asked for, each of its share."""

    def __init__(self, run: Callable[[Hashable, list], Awaitable[list]], max_items: int | None = None,
                 slots: Callable[[Hashable], int] | None = None):
        self.run = run
        self.max_items = max_items
        self.slots = slots
        self._keys: dict[Hashable, _Key] = {}

    async def submit(self, key: Hashable, item: Item) -> Result:
        queue = self._keys.get(key)
        if queue is None:
            queue = self._keys[key] = _Key()
        fut = asyncio.get_running_loop().create_future()  # a deadline cancels it, not the call
        queue.waiting.append((item, fut))
        if self.max_items is not None and len(queue.waiting) >= self.max_items:  # a full call: it starts now
            full, queue.waiting = queue.waiting[:self.max_items], queue.waiting[self.max_items:]
            self._start(key, queue, full)
        elif queue.running < self._slots(key):  # takes its share of what waits when it runs (this tick's callers too)
            self._start(key, queue, None)
        return await fut

    def _slots(self, key: Hashable) -> int:
        return 1 if self.slots is None else max(1, self.slots(key))

    def _start(self, key: Hashable, k: _Key, first: list | None) -> None:
        k.running += 1
        if first is None:
            k.idle += 1
        task = asyncio.get_running_loop().create_task(self._calls(key, k, first), context=contextvars.Context())
        k.tasks.add(task)
        task.add_done_callback(k.tasks.discard)

    def _take(self, key: Hashable, k: _Key) -> list:
        """A call's share of the waiting items: split evenly over this call, the calls started that have not
        taken theirs and the free slots, which get calls of their own now (at most max_items each)."""
        free = max(0, self._slots(key) - k.running)
        share = -(-len(k.waiting) // (1 + k.idle + free))
        if self.max_items is not None:
            share = min(share, self.max_items)
        taken = k.waiting[:share]
        k.waiting = k.waiting[share:]
        for _ in range(min(free, len(k.waiting))):
            self._start(key, k, None)
        return taken

    async def _calls(self, key: Hashable, k: _Key, first: list | None) -> None:
        """Calls while items wait: `first`, then each over its share of the items waiting when it starts."""
        fresh = first is None  # started without items: counted in k.idle until it takes its share
        try:
            while True:
                if first is None:
                    if fresh:
                        k.idle -= 1
                        fresh = False
                    if not k.waiting:
                        break
                    first = self._take(key, k)
                now = [(item, future) for item, future in first if not future.done()]
                first = None
                if not now:
                    continue
                try:
                    results = await self.run(key, [item for item, _ in now])
                except asyncio.CancelledError:  # the task itself (the loop shutting down): its callers fail with it
                    for _, future in now:
                        future.cancel()
                    raise
                except Exception as error:
                    for _, future in now:
                        if not future.done():
                            future.set_exception(error)
                    continue
                for (_, future), result in zip(now, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            if fresh:
                k.idle -= 1
            k.running -= 1
            if k.running == 0:  # items still waiting here have no call left to take them (a cancelled task)
                for _, future in k.waiting:
                    future.cancel()
                if self._keys.get(key) is k:
                    del self._keys[key]
