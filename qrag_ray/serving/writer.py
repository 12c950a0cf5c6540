"""The Writer deployment (one replica): applies every tenant's logged writes with the applier
(serving/applier.py) when a Router nudges it and on a timer, and starts compactions by size or age."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time

from qrag_ray.index.versions import is_versioned_root
from qrag_ray.index.write_log import writes_dir
from qrag_ray.index.write_state import COMPACT_LOCK, is_locked, read_write_state
from qrag_ray.serving.applier import Applier
from qrag_ray.serving.config import assigned_cpus, assigned_device

logger = logging.getLogger("ray.serve")

COMPACT_RETRY_S = 600.0  # a compaction that failed (its inputs gone, say) is not started again sooner


class Writer:
    """The Serve deployment that applies every tenant's writes (one replica: `Writer` in the serve config).
    The Routers nudge it after each append; it also looks at every tenant's log every `writes.scan_s`, so
    a restarted replica replays what was logged before it died, and a lost nudge only costs that interval.
    It starts a compaction (`qrag compact ROOT`, a process of its own on the same Ray) when a tenant's
    deltas reach `writes.compact_vectors` vectors or `writes.compact_age_s` of age."""

    async def __init__(self, args: dict):
        from qrag_ray.serving.config import AppArgs
        from qrag_ray.serving.registry import TenantRegistry

        app_args = AppArgs.model_validate(args)
        self.settings = app_args.writes
        if app_args.tenants:
            self.registry = TenantRegistry.from_file(app_args.tenants)
        else:
            self.registry = TenantRegistry(app_args.load_tenants())
        # its CPUs are the embedder's threads; with a GPU (the deployment's ray_actor_options) it embeds there
        self.applier = Applier(app_args.writes, threads=assigned_cpus(), device=assigned_device())
        self._wake: dict[str, asyncio.Event] = {}
        self._drains: dict[str, asyncio.Task] = {}
        self._compactions: dict[str, asyncio.Task] = {}
        self._compact_failed: dict[str, float] = {}
        self.errors: dict[str, str] = {}
        self.last: dict[str, dict] = {}
        self._scanner = asyncio.get_running_loop().create_task(self._scan())

    def _roots(self) -> set[str]:
        return {t.index for t in self.registry.tenants.by_name.values()}

    async def nudge(self, root: str) -> bool:
        """A Router logged a batch for the tenant at `root`: apply it now (False: not a tenant's root)."""
        if root not in self._roots():
            return False
        self._wake_up(root)
        return True

    def _wake_up(self, root: str) -> None:
        self._wake.setdefault(root, asyncio.Event()).set()
        task = self._drains.get(root)
        if task is None or task.done():
            self._drains[root] = asyncio.get_running_loop().create_task(self._drain(root))

    async def _scan(self) -> None:
        while True:
            try:
                self.registry.refresh()
                for root in await asyncio.to_thread(_needing_a_pass, sorted(self._roots())):
                    self._wake_up(root)
            except Exception:
                logger.exception("writer scan failed")
            await asyncio.sleep(self.settings.scan_s)

    async def _drain(self, root: str) -> None:
        """Apply `root`'s log whenever woken, until nothing is pending; then see whether to compact."""
        wake = self._wake[root]
        backoff = 1.0
        while True:
            await wake.wait()
            wake.clear()
            try:
                while True:
                    result = await asyncio.to_thread(self.applier.apply, root)
                    if result is not None and result.entries:
                        self.last[root] = result.__dict__.copy()
                    if result is None or not result.more:
                        break
                self.errors.pop(root, None)
                backoff = 1.0
                self._maybe_compact(root)
            except Exception as error:
                self.errors[root] = f"{type(error).__name__}: {error}"
                logger.exception("applying the writes of %s failed; retrying in %.0f s", root, backoff)
                await asyncio.sleep(backoff)
                backoff = min(60.0, backoff * 2)
                wake.set()

    def _maybe_compact(self, root: str) -> None:
        settings = self.settings
        if not settings.auto_compact or (root in self._compactions and not self._compactions[root].done()):
            return
        if time.time() - self._compact_failed.get(root, 0.0) < COMPACT_RETRY_S:
            return
        state = read_write_state(root)
        if state is None or (not state.deltas and not state.tombstones):
            return
        vectors = sum(d.vectors for d in state.deltas)
        age = time.time() - (state.changed_since or time.time())
        if (vectors >= settings.compact_vectors or age >= settings.compact_age_s) and not is_locked(root, COMPACT_LOCK):
            self._compactions[root] = asyncio.get_running_loop().create_task(self._compact(root))

    async def _compact(self, root: str) -> None:
        """`qrag compact ROOT` as a process of its own (a build is the CLI's to drive), joined to this Ray."""
        import ray

        env = dict(os.environ)
        with contextlib.suppress(Exception):
            env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        out = writes_dir(root) / "compact.log"
        with open(out, "ab") as log_file:
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "qrag_ray.cli", "compact", root,
                                                        stdout=log_file, stderr=log_file, env=env)
            code = await proc.wait()
        if code:
            self.errors[root] = f"compaction exited with {code} (see {out})"
            self._compact_failed[root] = time.time()
        self._wake_up(root)  # the state was reset: anything that waited on the lock goes on

    async def status(self) -> dict:
        """Each tenant's write state, its last pass and its problems."""
        out = {}
        for root in sorted(self._roots()):
            state = await asyncio.to_thread(read_write_state, root) if is_versioned_root(root) else None
            out[root] = {"generation": state.generation if state else None,
                         "deltas": len(state.deltas) if state else 0,
                         "tombstones": len(state.tombstones) if state else 0,
                         "last": self.last.get(root), "error": self.errors.get(root)}
        return out

    def check_health(self) -> None:
        """Serve's probe: restart a replica whose scan loop died (it would stop replaying)."""
        if self._scanner.done() and not self._scanner.cancelled() and self._scanner.exception() is not None:
            raise RuntimeError(f"writer scan failed: {self._scanner.exception()!r}")


def _needing_a_pass(roots: list[str]) -> list[str]:
    """The roots with log entries above their write state's generation, or retired deltas to sweep: a few
    stats and a listing each (a root that never took a write has no log folder)."""
    from qrag_ray.index.write_log import WriteLog

    out = []
    for root in roots:
        if not (writes_dir(root) / "log").is_dir() or not is_versioned_root(root):
            continue
        with contextlib.suppress(Exception):  # a root that cannot be read now is looked at next time
            state = read_write_state(root)
            generation = state.generation if state else 0
            if WriteLog(root).last_seq() > generation or (state is not None and state.retired):
                out.append(root)
    return out
