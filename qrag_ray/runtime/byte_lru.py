"""A least-recently-used cache bounded in bytes (pure): tenants' shards differ by orders of magnitude in
size. An entry bigger than the whole budget is still admitted alone (its request must be served)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable


class ByteLRU:
    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self._d: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._d)

    def get(self, key: Hashable) -> Any | None:
        if key not in self._d:
            return None
        self._d.move_to_end(key)
        return self._d[key][0]

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
        value, nbytes = self._d.pop(key, (None, 0))
        self.bytes -= nbytes
        return value

    def keys(self) -> list[Hashable]:
        return list(self._d)
