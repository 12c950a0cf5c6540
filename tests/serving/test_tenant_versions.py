"""TenantVersions without Serve: a stand-in shard backend and index reader take the place of the shard
deployments and the index directories (milliseconds, no Ray)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from qrag_ray.errors import QragError
from qrag_ray.serving.api_errors import ApiError, shard_unavailable
from qrag_ray.serving.tenant_versions import IndexVersion, TenantVersions
from qrag_ray.serving.tenants import Tenant

ALPHA = Tenant(name="alpha", index="/idx/alpha")
BETA = Tenant(name="beta", index="/idx/beta")


def version(index_version: str, shards: int = 3) -> IndexVersion:
    return IndexVersion(f"/idx/versions/{index_version}", index_version, None, None, shards, "minilm", backend=None)


class Backend:
    """A version's shard backend: each call reported to `fakes.call`."""

    def __init__(self, fakes: "Fakes"):
        self.fakes = fakes

    async def prepare(self, key, number: int) -> None:
        await self.fakes.call(key, number, "prepare")

    async def retire(self, key, number: int) -> None:
        await self.fakes.call(key, number, "retire")


class Fakes:
    """`points[path]` is what each index path points at; `fail` holds (version, shard) loads that
    fail; `gate` (when set) holds every prepare until it opens."""

    def __init__(self):
        self.points: dict[str, IndexVersion | Exception] = {ALPHA.index: version("v1"), BETA.index: version("b1", 2)}
        self.calls: list[tuple[str, str, int]] = []  # (method, version, shard)
        self.fail: set[tuple[str, int]] = set()
        self.gate: asyncio.Event | None = None
        self.warmed: list[str] = []
        self.now = 100.0

    def read(self, path: str) -> IndexVersion:
        got = self.points[path]
        if isinstance(got, Exception):
            raise got
        return replace(got, backend=Backend(self))

    async def call(self, key, shard: int, method: str) -> dict:
        assert key.index_dir == f"/idx/versions/{key.version}"
        if method == "prepare" and self.gate is not None:
            await self.gate.wait()
        self.calls.append((method, key.version, shard))
        if method == "prepare" and (key.version, shard) in self.fail:
            raise shard_unavailable(f"ShardSearcher{shard}", "ActorDiedError")
        return {}

    async def warm(self, model: str) -> None:
        self.warmed.append(model)

    def versions(self) -> TenantVersions:
        return TenantVersions(self.read, self.warm, retire_after_s=0.0, retry_s=30.0, clock=lambda: self.now)


def run(coro):
    return asyncio.run(coro)


def test_first_use_loads_without_warm_up_and_start_up_warms_the_first_tenants():
    fakes = Fakes()

    async def go():
        versions = fakes.versions()
        assert (await versions.current(ALPHA)).index_version == "v1"
        assert fakes.calls == []  # first use: no traffic to protect, no prepare
        await versions.sync({"alpha": ALPHA, "beta": BETA}, warm_first=2)
        return versions

    versions = run(go())
    assert versions.active["beta"].index_version == "b1"
    assert {("prepare", "b1", 0), ("prepare", "b1", 1)} <= set(fakes.calls)
    assert fakes.warmed == ["minilm"]  # beta warmed its embedder; alpha was already served on v1


def test_swap_only_after_every_shard_prepared_then_old_version_retired():
    fakes = Fakes()

    async def go():
        versions = fakes.versions()
        await versions.current(ALPHA)
        fakes.points[ALPHA.index] = version("v2")
        fakes.gate = asyncio.Event()
        swap = asyncio.ensure_future(versions.sync({"alpha": ALPHA}))
        await asyncio.sleep(0.01)
        assert (await versions.current(ALPHA)).index_version == "v1"  # still loading v2: requests stay on v1
        fakes.gate.set()
        await swap
        assert (await versions.current(ALPHA)).index_version == "v2"
        await asyncio.sleep(0.01)  # the retirement task (retire_after_s=0)

    run(go())
    prepared = [c for c in fakes.calls if c[0] == "prepare"]
    assert sorted(prepared) == [("prepare", "v2", i) for i in range(3)]
    assert sorted(c for c in fakes.calls if c[0] == "retire") == [("retire", "v1", i) for i in range(3)]


def test_failed_warm_keeps_the_old_version_and_retries_after_the_delay():
    fakes = Fakes()

    async def go():
        versions = fakes.versions()
        await versions.current(ALPHA)
        fakes.points[ALPHA.index] = version("v2")
        fakes.fail.add(("v2", 1))
        await versions.sync({"alpha": ALPHA})
        assert versions.active["alpha"].index_version == "v1"
        assert versions.problems["alpha"].startswith("version v2 failed to load, still serving v1: ShardSearcher1")
        calls_before = len(fakes.calls)
        fakes.now += 10
        await versions.sync({"alpha": ALPHA})  # before retry_s: not tried again
        assert len(fakes.calls) == calls_before
        fakes.fail.clear()
        fakes.now += 25
        await versions.sync({"alpha": ALPHA})
        assert versions.active["alpha"].index_version == "v2" and "alpha" not in versions.problems
        await asyncio.sleep(0.01)

    run(go())
    assert ("retire", "v2", 1) not in fakes.calls and ("retire", "v1", 0) in fakes.calls


def test_unreadable_index_keeps_serving_and_is_reported():
    fakes = Fakes()

    async def go():
        versions = fakes.versions()
        await versions.current(ALPHA)
        fakes.points[ALPHA.index] = QragError("no manifest.json in /idx/alpha")
        await versions.sync({"alpha": ALPHA})
        assert versions.active["alpha"].index_version == "v1"
        assert versions.newest(ALPHA) == (None, "no manifest.json in /idx/alpha")
        with pytest.raises(ApiError) as raised:
            await versions.current(BETA.model_copy(update={"index": ALPHA.index}))
        assert raised.value.status == 503 and raised.value.kind == "index_unavailable"
        assert "manifest" in raised.value.message

    run(go())


def test_removed_tenant_is_retired_on_every_shard():
    fakes = Fakes()

    async def go():
        versions = fakes.versions()
        await versions.current(ALPHA)
        await versions.current(BETA)
        await versions.sync({"alpha": ALPHA})  # beta left the tenants file
        await asyncio.sleep(0.01)
        return versions

    versions = run(go())
    assert set(versions.active) == {"alpha"}
    assert sorted(c for c in fakes.calls if c[0] == "retire") == [("retire", "b1", 0), ("retire", "b1", 1)]


def test_version_moved_resolves_again_without_warm_up():
    """A plain directory republished in place: a shard saw another version, so the pointer is dropped
    and the next request resolves the directory again (no prepare: traffic is waiting)."""
    fakes = Fakes()

    async def go():
        versions = fakes.versions()
        await versions.current(ALPHA)
        fakes.points[ALPHA.index] = version("v3")
        versions.moved("alpha")
        assert (await versions.current(ALPHA)).index_version == "v3"

    run(go())
    assert fakes.calls == []
