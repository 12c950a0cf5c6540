"""serving/coalesce.py beyond what the encoder's and the search passes' tests drive through it: a shared
call carries no caller's context (in a Serve replica, the request context that would make its handle
calls one request's children), and a call task that is cancelled fails its callers instead of leaving
them waiting."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from qrag_ray.serving.coalesce import Coalescer

REQUEST = contextvars.ContextVar("request", default=None)


def test_a_shared_call_runs_in_no_callers_context():
    seen = []

    async def run(key, items):
        seen.append(REQUEST.get())
        return items

    async def caller(name: str, coalescer: Coalescer):
        REQUEST.set(name)
        return await coalescer.submit("k", name)

    async def go():
        coalescer = Coalescer(run)
        return await asyncio.gather(caller("a", coalescer), caller("b", coalescer))

    assert asyncio.run(go()) == ["a", "b"] and seen == [None]


def test_a_cancelled_call_fails_its_callers_and_those_waiting_behind_it():
    async def go():
        running = asyncio.Event()

        async def run(key, items):
            running.set()
            await asyncio.sleep(60)
            return items

        coalescer = Coalescer(run)
        first = asyncio.ensure_future(coalescer.submit("k", 1))
        await running.wait()
        second = asyncio.ensure_future(coalescer.submit("k", 2))  # waits for the running call
        await asyncio.sleep(0)
        for task in list(coalescer._keys["k"].tasks):
            task.cancel()
        out = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 5)
        return out, coalescer._keys

    out, keys = asyncio.run(go())
    assert all(isinstance(x, asyncio.CancelledError) for x in out) and keys == {}


def test_with_max_items_a_full_call_starts_beside_the_running_one():
    calls = []

    async def go():
        gate = asyncio.Event()

        async def run(key, items):
            calls.append(list(items))
            if len(calls) == 1:
                await gate.wait()
            return items

        coalescer = Coalescer(run, max_items=2)
        first = asyncio.ensure_future(coalescer.submit("k", 0))
        await asyncio.sleep(0.01)
        rest = [asyncio.ensure_future(coalescer.submit("k", i)) for i in (1, 2, 3)]  # 1, 2 full: a call now; 3 waits
        await asyncio.wait_for(asyncio.gather(*rest[:2]), 5)
        gate.set()
        return await asyncio.gather(first, *rest)

    assert asyncio.run(go()) == [0, 1, 2, 3]
    assert calls == [[0], [1, 2], [3]]


@pytest.mark.parametrize("max_items", [None, 3])
def test_an_error_reaches_every_caller_of_its_call_and_the_next_call_runs(max_items):
    async def go():
        async def run(key, items):
            if 0 in items:
                raise ValueError("bad batch")
            return items

        coalescer = Coalescer(run, max_items)
        bad = await asyncio.gather(coalescer.submit("k", 0), coalescer.submit("k", 1), return_exceptions=True)
        return bad, await coalescer.submit("k", 5)

    bad, good = asyncio.run(go())
    assert all(isinstance(x, ValueError) for x in bad) and good == 5
