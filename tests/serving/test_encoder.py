"""The Router's QueryEncoder shares model calls: encode calls for one model that arrive while a model call
runs go in the next one together, each caller gets its own vectors, a caller cancelled while its call runs
does not stop it for the others, one cancelled before its call starts is left out of it, and a model that
fails reaches every caller waiting on it. The model call itself is replaced by one
that records its texts and blocks until released (no model loaded: this tests the scheduling)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from qrag_ray.serving.encoder import QueryEncoder


class _Recording(QueryEncoder):
    def __init__(self, fail: bool = False):
        super().__init__()
        self.calls: list[list[str]] = []
        self.release = threading.Event()
        self.fail = fail

    async def model(self, name: str):
        if self.fail:
            raise OSError(f"no model {name}")
        return name

    def _encode(self, model, texts):
        self.calls.append(list(texts))
        self.release.wait(10)
        return np.array([[float(len(t))] for t in texts], np.float32)


def test_calls_that_arrive_while_one_runs_share_the_next_model_call():
    encoder = _Recording()

    async def go():
        first = asyncio.ensure_future(encoder.encode(["a"], "m"))
        quitter = asyncio.ensure_future(encoder.encode(["b"], "m"))  # the same tick: the same first call
        await asyncio.sleep(0.1)  # the first model call runs (blocked)
        quitter.cancel()  # its deadline passed while the call runs
        rest = [asyncio.ensure_future(encoder.encode([t * 2, t * 3], "m")) for t in "xyz"]
        late = asyncio.ensure_future(encoder.encode(["gone"], "m"))
        await asyncio.sleep(0.1)
        late.cancel()  # a request past its deadline before its call started
        encoder.release.set()
        return await first, await asyncio.gather(*rest)

    (first_vectors, first_shared), rest = asyncio.run(go())
    assert encoder.calls == [["a", "b"], ["xx", "xxx", "yy", "yyy", "zz", "zzz"]]
    assert first_shared == 2 and [n for _, n in rest] == [6, 6, 6]
    assert [[float(x[0]) for x in v] for v, _ in rest] == [[2.0, 3.0]] * 3
    assert float(first_vectors[0][0]) == 1.0


def test_a_model_that_fails_reaches_every_waiting_caller():
    encoder = _Recording(fail=True)

    async def go():
        return await asyncio.gather(*[encoder.encode(["q"], "m") for _ in range(3)], return_exceptions=True)

    outcomes = asyncio.run(go())
    assert len(outcomes) == 3 and all(isinstance(e, OSError) for e in outcomes) and encoder.calls == []
    encoder.fail = False  # the encoder serves again once the model loads
    encoder.release.set()
    vectors, shared = asyncio.run(encoder.encode(["ok"], "m"))
    assert shared == 1 and encoder.calls == [["ok"]] and float(vectors[0][0]) == 2.0
