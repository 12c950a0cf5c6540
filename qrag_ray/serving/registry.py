"""The live tenant table of a Router replica (no Ray): the tenants file, re-parsed when its identity
(inode, size, mtime; a kubelet symlink swap included) changes. A file that fails to parse keeps the
last good table in force and is reported on the admin status."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from qrag_ray.errors import QragError
from qrag_ray.serving.tenants import Tenants, load_tenants

logger = logging.getLogger("ray.serve")


def _identity(path: Path) -> tuple | None:
    try:
        status = os.stat(path)  # follows symlinks: a ConfigMap swap changes the target's identity
    except OSError:
        return None
    return (status.st_ino, status.st_size, status.st_mtime_ns)


class TenantRegistry:
    """`tenants` is the table in force: the one given, or the file at `path` (see `refresh`)."""

    def __init__(self, tenants: Tenants | None = None, path: str | Path | None = None):
        self.path = Path(path) if path else None
        self._seen = _identity(self.path) if self.path else None  # first: a change during the parse shows next time
        self.tenants = tenants if tenants is not None else load_tenants(self.path)
        self.error: str | None = None
        self.loaded_at = time.time()
        self.reloads = 0

    @classmethod
    def from_file(cls, path: str | Path) -> "TenantRegistry":
        return cls(path=path)

    def refresh(self) -> bool:
        """Re-read the file if it changed; True when a new table came into force."""
        if self.path is None or (ident := _identity(self.path)) == self._seen:
            return False
        self._seen = ident
        try:
            tenants = load_tenants(self.path)
        except QragError as error:
            self.error = f"kept the previous tenants table: {error}"
            logger.error("tenants file %s: %s", self.path, self.error)
            return False
        self.tenants, self.error = tenants, None
        self.loaded_at, self.reloads = time.time(), self.reloads + 1
        logger.info("tenants file %s reloaded: %d tenants", self.path, len(tenants.by_name))
        return True
