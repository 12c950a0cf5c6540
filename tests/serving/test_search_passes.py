"""The Router's side of a retrieval (serving/search_passes.py, serving/shard_searcher.py's RemoteShards) with
stand-in deployment handles and encoder: no Ray cluster, no Serve, no model. RemoteShards' calls, retries and
errors, and SearchPasses' one path (version, the embedding batch, the search pass of one group over the
version's backend, timings)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from ray.exceptions import ActorDiedError
from ray.serve.exceptions import BackPressureError

from qrag_ray.config.search_policy import SearchConfig
from qrag_ray.errors import QragError
from qrag_ray.serving.api_errors import ApiError
from qrag_ray.serving.api_models import SearchRequest
from qrag_ray.serving.search_passes import PASS_QUERIES, QueuedQuery, SearchPasses, passes_at_once, resolve_query
from qrag_ray.serving.shard_cache import VersionKey, VersionMoved
from qrag_ray.serving.shard_searcher import RemoteShards, affinity_id
from qrag_ray.serving.tenant_versions import IndexVersion
from qrag_ray.serving.tenants import Tenant
from tests.search.test_retrieve import CHUNK_A, CHUNK_C, HITS, StandInShards


class _Method:
    def __init__(self, outcomes: list):
        self.outcomes = list(outcomes)
        self.calls = 0

    async def remote(self, key, *args):
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


class _Handle:
    """A deployment handle: `handle.method` is a handle of its own, whose `options` keep the method."""

    def __init__(self, **methods):
        self.model_ids: list[str] = []
        for name, method in methods.items():
            method.options = self._options(method)
            setattr(self, name, method)

    def _options(self, method):
        def options(multiplexed_model_id: str):
            self.model_ids.append(multiplexed_model_id)
            return method
        return options


KEY = VersionKey("acme", "/idx/v7", "v7")


def test_a_shard_call_asks_serve_for_a_replica_holding_the_tenants_version_of_that_shard():
    handle = _Handle(fetch=_Method([["a record"]]))
    assert asyncio.run(RemoteShards([_Handle(), handle]).fetch(KEY, 1, [5], None)) == ["a record"]
    assert handle.model_ids == [affinity_id(KEY, 1)] == ["acme/v7/1"]
    assert affinity_id(VersionKey("acme", "/idx/v8", "v8"), 1) != affinity_id(KEY, 1) != affinity_id(KEY, 0)


def test_grouped_shards_make_one_call_per_deployment_with_the_groups_affinity_and_replies_in_shard_order():
    class Searcher:  # a ShardSearcher deployment answering for the shards it is asked
        def __init__(self):
            self.asked: list = []

        async def remote(self, key, shards, *args):
            self.asked.append(shards)
            return [f"reply {shard}" for shard in shards] if isinstance(shards, list) else f"{shards} prepared"

    handles = [_Handle(search=Searcher(), prepare=Searcher()) for _ in range(2)]
    remote = RemoteShards(handles, per=2)
    assert asyncio.run(remote.search(KEY, 3, np.zeros((1, 4), np.float32), None)) == ["reply 0", "reply 1", "reply 2"]
    assert [handle.search.asked for handle in handles] == [[[0, 1]], [[2]]]  # one call each
    assert [handle.model_ids for handle in handles] == [["acme/v7/0"], ["acme/v7/1"]]
    asyncio.run(remote.prepare(KEY, 2))  # one shard, at its group's deployment
    assert handles[1].prepare.asked == [2] and handles[1].model_ids[-1] == "acme/v7/1"


def test_a_dead_replica_is_retried_once_then_the_shard_is_a_503():
    flaky = _Method([ActorDiedError(), ["reply"]])
    assert asyncio.run(RemoteShards([_Handle(search=flaky)]).search(KEY, 1, None, None)) == ["reply"]
    assert flaky.calls == 2
    dead = _Method([ActorDiedError(), ActorDiedError()])
    with pytest.raises(ApiError) as error:
        asyncio.run(RemoteShards([_Handle(search=dead)]).search(KEY, 1, None, None))
    assert (error.value.status, error.value.kind) == (503, "shard_unavailable")
    assert "ShardSearcher0" in error.value.message


def test_a_full_shard_queue_is_overloaded_and_a_user_error_passes_through():
    full = _Method([BackPressureError(num_queued_requests=1, max_queued_requests=1)])
    with pytest.raises(ApiError) as error:
        asyncio.run(RemoteShards([_Handle(search=full)]).search(KEY, 1, None, None))
    assert (error.value.status, error.value.kind) == (503, "overloaded") and full.calls == 1
    bad = _Method([QragError("index /x has 1 shards, no shard 3")])
    with pytest.raises(QragError, match="no shard 3"):
        asyncio.run(RemoteShards([_Handle(search=bad)]).search(KEY, 1, None, None))
    assert bad.calls == 1  # not retried


class _Encoder:
    def __init__(self):
        self.batches: list[list[str]] = []

    async def encode(self, texts, model):
        self.batches.append(list(texts))
        return np.repeat(np.arange(len(texts), dtype=np.float32)[:, None], 4, axis=1), len(texts)


class _Versions:
    def __init__(self, version: IndexVersion):
        self.version = version
        self.moved_calls = 0

    async def current(self, tenant):
        return self.version

    def moved(self, tenant):
        self.moved_calls += 1


class _Remote(StandInShards):
    path = "shards"  # as RemoteShards names itself in the response's timings


class _Moving(_Remote):
    """Shards that find another version in the directory the first `n` times."""

    def __init__(self, n: int):
        super().__init__(HITS[:1])
        self.n = n

    async def search(self, key, num_shards, vectors, batch):
        if self.n:
            self.n -= 1
            raise VersionMoved("republished")
        return await super().search(key, num_shards, vectors, batch)


def _retriever(remote) -> tuple[SearchPasses, _Versions, _Encoder]:
    version = IndexVersion("/idx/v1", "v1", None, SearchConfig(), 2, "all-MiniLM-L6-v2", remote)
    versions = _Versions(version)
    encoder = _Encoder()
    return SearchPasses(encoder, versions, "router-1"), versions, encoder


def test_retriever_runs_the_core_over_the_tenant_backend():
    remote = _Remote(HITS[:1])
    retriever, _, encoder = _retriever(remote)
    response = asyncio.run(retriever.search(Tenant(name="acme", index="/idx"), SearchRequest(query="q", k=2), "q", {}))
    assert [x.doc_id for x in response.results] == [f"d{CHUNK_A}", f"d{CHUNK_C}"]
    assert response.index_version == "v1" and encoder.batches == [["q"]]
    timings = response.timings
    assert (timings.path, timings.embed_batch, timings.rounds, timings.candidates) == ("shards", 1, 1, 4)
    assert timings.model_dump()["shard_replicas"] == ["", ""]  # the JSON keys of the HTTP `timings`
    assert timings.model_dump()["router_replica"] == "router-1"
    assert remote.calls == 1  # one call to the version's backend: the replies carried the page


def test_a_version_moved_mid_request_is_resolved_again_once():
    retriever, versions, _ = _retriever(_Moving(1))
    response = asyncio.run(retriever.search(Tenant(name="acme", index="/idx"), SearchRequest(query="q", k=2), "q", {}))
    assert len(response.results) == 2 and versions.moved_calls == 1
    retriever, versions, _ = _retriever(_Moving(2))
    with pytest.raises(ApiError, match="changed twice"):
        asyncio.run(retriever.search(Tenant(name="acme", index="/idx"), SearchRequest(query="q", k=2), "q", {}))


def _asks(retriever, remote, *requests: SearchRequest) -> list:
    version = retriever.versions.version
    return [QueuedQuery(r.query, version, version.key("acme"), resolve_query(version, "acme", r), {}) for r in requests]


def _batches(retriever, asks) -> list:
    """The asks submitted to the search passes at once (the first pass of each group starts with all of
    its asks waiting): each ask's (page, timings, query vector), or its group's error."""
    async def go():
        return await asyncio.gather(*[retriever.passes.submit(a.group, a) for a in asks], return_exceptions=True)
    return asyncio.run(go())


def test_concurrent_queries_of_one_group_embed_in_one_call_and_ask_each_shard_once():
    class Counting(_Remote):
        sizes: list = []

        async def search(self, key, num_shards, vectors, batch):
            self.sizes.append(len(vectors))
            return await super().search(key, num_shards, vectors, batch)

    remote = Counting(HITS[:1] * 3)
    retriever, _, encoder = _retriever(remote)
    asks = _asks(retriever, remote, SearchRequest(query="a", k=2), SearchRequest(query="b", k=2),
                 SearchRequest(query="c", k=1))
    outcomes = _batches(retriever, asks)
    assert encoder.batches == [["a", "b"], ["c"]]  # one encode per pass: k=2's two, then k=1's own
    assert remote.sizes == [2, 1]  # k=2 twice in one pass of the core, k=1 apart
    assert [len(page) for page, _, _ in outcomes] == [2, 2, 1]
    assert [(t.embed_batch, t.search_batch) for _, t, _ in outcomes] == [(2, 2), (2, 2), (1, 1)]


def test_a_group_waits_only_for_its_own_pass_and_a_full_pass_starts_beside_a_running_one():
    """Queries of one group that arrive while its pass runs go in its next pass, all together; another
    group's query starts its own pass at once; PASS_QUERIES waiting start another pass without waiting."""
    class Blocking(_Remote):
        def __init__(self):
            super().__init__(HITS[:1] * PASS_QUERIES)
            self.asked = []
            self.release = asyncio.Event()

        async def search(self, key, num_shards, vectors, batch):
            self.asked.append((batch.k, len(vectors)))
            if len(self.asked) == 1:
                await self.release.wait()  # the group's first pass runs until released
            return await super().search(key, num_shards, vectors, batch)

    async def go():
        remote = Blocking()
        retriever, _, _ = _retriever(remote)
        def submit(k: int) -> asyncio.Future:
            queued = _asks(retriever, remote, SearchRequest(query="q", k=k))[0]
            return asyncio.ensure_future(retriever.passes.submit(queued.group, queued))

        first = submit(2)
        await asyncio.sleep(0.01)  # its pass runs (blocked)
        waiting = [submit(2) for _ in range(3)]
        other = submit(1)  # another group: a pass of its own, now
        await asyncio.wait_for(other, 5)
        calls_while_blocked = list(remote.asked)
        full = [submit(2) for _ in range(PASS_QUERIES - 3)]  # with the 3 waiting: a full pass starts now
        await asyncio.wait_for(asyncio.gather(*full[-1:], *waiting), 5)
        remote.release.set()
        await first
        return calls_while_blocked, remote.asked, [t.search_batch for _, t, _ in await asyncio.gather(*waiting)]

    blocked, calls, batches = asyncio.run(go())
    assert blocked == [(2, 1), (1, 1)]
    assert calls == [(2, 1), (1, 1), (2, PASS_QUERIES)] and batches == [PASS_QUERIES] * 3


def test_a_groups_error_reaches_its_requests_and_not_the_others():
    class FailsForK1(_Remote):
        async def search(self, key, num_shards, vectors, batch):
            if batch.k == 1:
                raise VersionMoved("republished")
            return await super().search(key, num_shards, vectors, batch)

    remote = FailsForK1(HITS[:1] * 2)
    retriever, _, _ = _retriever(remote)
    asks = _asks(retriever, remote, SearchRequest(query="a", k=1), SearchRequest(query="b", k=2))
    outcomes = _batches(retriever, asks)
    assert isinstance(outcomes[0], VersionMoved) and len(outcomes[1][0]) == 2


def test_a_backend_with_two_replicas_gets_two_passes_of_a_group_at_once_and_the_waiting_split_among_them():
    """RemoteShards' `passes_at_once` (its deployments' running replicas) is how many passes of one group
    are in flight: a burst is split over the two passes; with one replica they run one after the other."""
    class Overlapping(_Remote):
        def __init__(self, replicas: int):
            super().__init__(HITS[:1] * 8)
            self.passes_at_once = replicas
            self.running = 0
            self.most = 0
            self.sizes: list[int] = []

        async def search(self, key, num_shards, vectors, batch):
            self.running += 1
            self.most = max(self.most, self.running)
            self.sizes.append(len(vectors))
            await asyncio.sleep(0.01)
            self.running -= 1
            return await super().search(key, num_shards, vectors, batch)

    for replicas, sizes in ((2, [3, 3]), (1, [6])):
        remote = Overlapping(replicas)
        retriever, _, _ = _retriever(remote)
        outcomes = _batches(retriever, _asks(retriever, remote, *[SearchRequest(query=f"q{n}", k=2) for n in range(6)]))
        assert [len(page) for page, _, _ in outcomes] == [2] * 6
        assert remote.sizes == sizes and remote.most == len(sizes), (replicas, remote.sizes)


def test_the_passes_at_once_of_a_group_are_its_backends():
    remote = _Remote(HITS[:1])
    remote.passes_at_once = 3
    retriever, _, _ = _retriever(remote)
    queued = _asks(retriever, remote, SearchRequest(query="q", k=2))[0]
    assert passes_at_once(queued.group) == 3
    local = _retriever(StandInShards(HITS[:1]))[0]
    assert passes_at_once(_asks(local, None, SearchRequest(query="q", k=2))[0].group) == 1  # no such attribute: 1


def test_a_written_tenants_passes_at_once_are_its_bases():
    from qrag_ray.serving.segments import Segments

    remote = _Remote(HITS[:1])
    remote.passes_at_once = 3
    segments = Segments(remote, StandInShards(HITS[:1]), "/root", 2, 0, (), {})
    assert segments.passes_at_once == 3
