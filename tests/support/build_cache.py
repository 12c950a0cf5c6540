"""Index builds shared by content across the pytest processes of one test run.

`scripts/test.sh` runs several pytest processes (the fast tier, the slow tier, parallel lanes), and each
used to build the same session indexes again (the serving tenants: minutes on 2 cores). With
QRAG_TEST_BUILD_CACHE set to a folder (test.sh sets a new one per run and removes it at the end),
`shared(spec, out, make)` runs `make()` (which builds the index folder `out` and returns a picklable
result, e.g. a BuildReport) only for the first process that asks for a given content key; every later
one gets a fresh copy of that folder at its own `out`, and the first build's result.

What makes it safe:
- The key is everything that decides the build: `spec` (the config overrides, with every input file
  replaced by the hash of its bytes), the hash of every file of the package (qrag_ray/), every installed
  distribution's version, the Python version and the QRAG_* environment. A change to any of them is a
  new key, so a developer may also point QRAG_TEST_BUILD_CACHE at a folder kept between runs.
- Each process gets its own copy: a test that changes its index (a corrupted file, an appended
  version) cannot reach another process. Within one process a session fixture is shared as before:
  tests only read it, or copy it first.
- Entries are published by an atomic rename and never changed; a build happens under a file lock on
  its key, so two processes that ask at once build once (the second waits, then copies). A build that
  fails stores nothing: the next process builds, and fails, itself.
- The copy's manifest records the first build's paths (its input file and output folder); what the index
  holds (checksums, vectors, counts) is the same bytes.

Unset: `make()` runs every time, as a single `pytest tests/x.py` always did.

Use `support.indexes.shared_build(cfg_kwargs)` for a `build_index` (what most fixtures need); `shared`
directly for another way of building (the CLI fixture in tests/conftest.py). Share only a build a test
reads; a test that checks the build itself (its timings, its checkpoints, a crash in it) builds its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import pickle
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

ENV = "QRAG_TEST_BUILD_CACHE"
PACKAGE = Path(__file__).resolve().parents[2] / "qrag_ray"
RESULT = "result.pickle"
INDEX = "index"
SPEC = "spec.json"

Built = TypeVar("Built")


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes, or of a folder's files (relative paths and bytes, sorted)."""
    hasher = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        hasher.update(str(file.relative_to(path) if file != path else "").encode() + b"\0")
        hasher.update(hashlib.sha256(file.read_bytes()).digest())
    return hasher.hexdigest()


@functools.cache
def environment_digest() -> str:
    """What every build of this process depends on besides its own inputs: the package's files, the
    installed distributions, the Python version and the QRAG_* variables (not the tests' own QRAG_TEST_*)."""
    hasher = hashlib.sha256()
    for file in sorted(p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        hasher.update(str(file.relative_to(PACKAGE)).encode() + b"\0" + hashlib.sha256(file.read_bytes()).digest())
    # the installed distributions by their metadata folders' names (name-version.dist-info): a listing,
    # not a read of every METADATA file
    dists = sorted(e for d in sys.path if os.path.isdir(d) for e in os.listdir(d)
                   if e.endswith((".dist-info", ".egg-info")))
    env = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("QRAG_") and not k.startswith("QRAG_TEST_"))
    hasher.update("\n".join([sys.version, *dists, *env]).encode())
    return hasher.hexdigest()


def content_key(spec: Mapping[str, Any]) -> str:
    """The cache key of a build: its spec (JSON, keys sorted) and `environment_digest`."""
    text = json.dumps(spec, sort_keys=True, default=str)
    return hashlib.sha256(f"{environment_digest()}\n{text}".encode()).hexdigest()[:32]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as file:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        yield


def _copy_out(entry: Path, out: Path) -> Any:
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(entry / INDEX, out)
    return pickle.loads((entry / RESULT).read_bytes())


def shared(spec: Mapping[str, Any], out: Path, make: Callable[[], Built]) -> Built:
    """`make()` builds the folder `out` and returns its result; with QRAG_TEST_BUILD_CACHE set, only
    once per content key across the processes of the run (see the module doc). `spec` names everything
    the build depends on besides the package and the environment: input files as `file_digest`s. A copy
    replaces whatever `out` held."""
    root = os.environ.get(ENV)
    if not root:
        return make()
    cache = Path(root)
    out = Path(out)
    cache.mkdir(parents=True, exist_ok=True)
    key = content_key(spec)
    entry = cache / key
    if not (entry / RESULT).is_file():
        with _locked(cache / f"{key}.lock"):
            if not (entry / RESULT).is_file():
                result = make()
                if not out.is_dir():  # nothing built (a CLI run that failed): nothing to share
                    return result
                tmp = cache / f".{key}.{uuid.uuid4().hex}"
                shutil.copytree(out, tmp / INDEX)
                (tmp / SPEC).write_text(json.dumps({"spec": spec, "built_at": str(out)}, indent=1, default=str))
                (tmp / RESULT).write_bytes(pickle.dumps(result))
                tmp.rename(entry)  # published whole, or not at all
                return result
    return _copy_out(entry, out)
