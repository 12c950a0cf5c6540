"""A least-recently-used cache bounded in bytes (pure).

Tenants' shards differ by orders of magnitude in size, so a cache bounded by a count (8 shards) either
wastes memory on tiny tenants or runs out on big ones; the bound is the replica's memory. An entry
bigger than the whole budget is still admitted alone (the request that needs it must be served).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable


class ByteLRU:
    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self._d: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.bytes = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def get(self, key: Hashable) -> Any | None:
        hit = self._d.get(key)
        if hit is None:
            return None
        self._d.move_to_end(key)
        return hit[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> list[Hashable]:
        """Insert (or replace) and return the keys evicted to stay within the budget."""
        self.pop(key)
        self._d[key] = (value, int(nbytes))
        self.bytes += int(nbytes)
        evicted = []
        while self.bytes > self.max_bytes and len(self._d) > 1:
            k, (_, n) = self._d.popitem(last=False)
            self.bytes -= n
            evicted.append(k)
        return evicted

    def pop(self, key: Hashable) -> Any | None:
        hit = self._d.pop(key, None)
        if hit is None:
            return None
        self.bytes -= hit[1]
        return hit[0]

    def keys(self) -> list[Hashable]:
        return list(self._d)
