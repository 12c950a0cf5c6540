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


def test_with_two_slots_a_burst_is_split_over_two_calls_at_once():
    calls = []

    async def go():
        async def run(key, items):
            calls.append(list(items))
            await asyncio.sleep(0.01)
            return items

        coalescer = Coalescer(run, slots=lambda key: 2)
        return await asyncio.gather(*[coalescer.submit("k", n) for n in range(6)])

    assert asyncio.run(go()) == list(range(6))
    assert calls == [[0, 1, 2], [3, 4, 5]]


def test_a_free_slot_starts_a_call_for_a_lone_item_beside_the_running_one():
    calls = []

    async def go():
        gate = asyncio.Event()

        async def run(key, items):
            calls.append(list(items))
            if items == [0]:
                await gate.wait()
            return items

        coalescer = Coalescer(run, slots=lambda key: 2)
        first = asyncio.ensure_future(coalescer.submit("k", 0))
        await asyncio.sleep(0.01)
        second = await asyncio.wait_for(coalescer.submit("k", 1), 5)  # does not wait for the blocked call
        third = asyncio.ensure_future(coalescer.submit("k", 2))
        fourth = asyncio.ensure_future(coalescer.submit("k", 3))
        await asyncio.sleep(0.01)
        gate.set()
        return [await first, second, await third, await fourth]

    assert asyncio.run(go()) == [0, 1, 2, 3]
    assert calls == [[0], [1], [2, 3]]  # 2 and 3 arrived while a call ran in each slot: the next call took both


def test_slots_that_grow_while_items_wait_split_them_over_new_calls():
    slots = {"k": 1}
    calls = []

    async def go():
        gate = asyncio.Event()

        async def run(key, items):
            calls.append(list(items))
            if items == [0]:
                await gate.wait()
            await asyncio.sleep(0.01)  # a call takes time: the new calls take their shares meanwhile
            return items

        coalescer = Coalescer(run, slots=slots.get)
        first = asyncio.ensure_future(coalescer.submit("k", 0))
        await asyncio.sleep(0.01)
        waiting = [asyncio.ensure_future(coalescer.submit("k", n)) for n in range(1, 7)]
        await asyncio.sleep(0.01)
        slots["k"] = 3  # the group got replicas while six waited
        gate.set()
        return [await first, *await asyncio.gather(*waiting)]

    assert asyncio.run(go()) == list(range(7))
    assert calls == [[0], [1, 2], [3, 4], [5, 6]]
