"""A least-recently-used cache bounded in bytes (pure): tenants' shards differ by orders of magnitude in
size. An entry bigger than the whole budget is still admitted alone (its request must be served)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable


class ByteLRU:
    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Any | None:
        if key not in self._entries:
            return None
        self._entries.move_to_end(key)
        return self._entries[key][0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> list[Hashable]:
        """Insert (or replace) and return the keys evicted to stay within the budget."""
        self.pop(key)
        self._entries[key] = (value, int(nbytes))
        self.bytes += int(nbytes)
        evicted = []
        while self.bytes > self.max_bytes and len(self._entries) > 1:
            evicted_key, (_, size) = self._entries.popitem(last=False)
            self.bytes -= size
            evicted.append(evicted_key)
        return evicted

    def pop(self, key: Hashable) -> Any | None:
        value, nbytes = self._entries.pop(key, (None, 0))
        self.bytes -= nbytes
        return value

    def keys(self) -> list[Hashable]:
        return list(self._entries)
