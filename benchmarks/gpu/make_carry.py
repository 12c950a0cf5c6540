"""The carry of the GPU machine's `qrag index` run (benchmarks/gpu/run.sh): Ray, FAISS (CPU build) and the few
packages that machine's image lacks, installed for its Python into one folder, trimmed to what `qrag index`
runs, and packed as one archive. A device call carries the repository and its carried paths, 64 MiB in all,
and the machine reaches no network, so nothing is installed there: run.sh unpacks the archive and puts the
folder on PYTHONPATH.

    python benchmarks/gpu/make_carry.py     # wheels from PyPI for the device (CPython 3.12, manylinux x86_64)
                                            # -> benchmarks/gpu/carry/site.tar.xz (git-ignored), its size printed
    python benchmarks/gpu/make_carry.py --from-site --out /tmp/c --compress none   # this interpreter's own
                                            # packages (same Python): the CPU soak test of run.sh

Versions are the ones installed here (what the CPU tests ran), unless --pin NAME==VERSION says otherwise.
The device image's packages (KINDS.md of the device tool: torch, transformers, sentence-transformers,
pyarrow, pandas, grpcio, msgpack, protobuf, pyyaml, typer, rich, httpx, aiohttp, psutil ...) are not carried.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# distribution -> the import names it installs (run.sh's soak test hides these unless they come from the carry)
CARRIED = {"ray": ["ray"], "faiss-cpu": ["faiss"], "pydantic": ["pydantic"], "pydantic-core": ["pydantic_core"],
           "annotated-types": ["annotated_types"], "typing-inspection": ["typing_inspection"],
           "PyStemmer": ["Stemmer"], "bm25s": ["bm25s"], "beautifulsoup4": ["bs4"], "soupsieve": ["soupsieve"],
           "jsonschema": ["jsonschema"], "jsonschema-specifications": ["jsonschema_specifications"],
           "referencing": ["referencing"], "rpds-py": ["rpds"]}
# what `qrag index` never imports from Ray: the Java jar, RLlib, Tune, Train, Serve, Ray LLM (the vLLM
# backend is not carried: the machine has no vLLM), the dashboard's web client, C++ API, tests, source maps
TRIM = ("ray/jars", "ray/rllib", "ray/tune", "ray/train", "ray/serve", "ray/llm", "ray/dashboard/client", "ray/cpp")
DEVICE = dict(python="3.12", platforms=("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_27_x86_64",
                                        "manylinux_2_28_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64"))


def requirements(pins: list[str]) -> list[str]:
    """NAME==VERSION for every carried distribution: the version installed here unless pinned."""
    given = {p.split("==")[0].lower(): p for p in pins}
    return [given.get(d.lower()) or f"{d}=={md.version(d)}" for d in CARRIED]


def install_wheels(stage: Path, reqs: list[str]) -> None:
    """pip (the ordinary client) installs the device's wheels into `stage` without running them here."""
    plat = [a for p in DEVICE["platforms"] for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                    "--only-binary=:all:", "--target", str(stage), "--python-version", DEVICE["python"],
                    "--implementation", "cp", *plat, *reqs], check=True)


def copy_site(stage: Path) -> None:
    """This interpreter's installed files of every carried distribution (their .libs folders included)."""
    for dist in CARRIED:
        d = md.distribution(dist)
        for f in d.files or []:
            src = Path(d.locate_file(f))
            if src.is_file() and "__pycache__" not in f.parts and not str(f).startswith(".."):
                dst = stage / f
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)


def trim(stage: Path) -> None:
    """Remove what `qrag index` never imports (TRIM, tests, caches, source maps)."""
    for rel in TRIM:
        shutil.rmtree(stage / rel, ignore_errors=True)
    for p in sorted(stage.rglob("*"), reverse=True):
        if p.is_dir() and p.name in ("tests", "__pycache__"):
            shutil.rmtree(p, ignore_errors=True)
        elif p.is_file() and p.suffix == ".map":
            p.unlink()


def pack(stage: Path, out: Path, compress: str) -> Path:
    """The folder as site.tar.xz (or site.tar, or the folder itself for --compress none)."""
    out.mkdir(parents=True, exist_ok=True)
    if compress == "none":
        dst = out / "site"
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(stage, dst, symlinks=True)
        return dst
    dst = out / ("site.tar.xz" if compress == "xz" else "site.tar")
    with tarfile.open(dst, "w:xz" if compress == "xz" else "w", **({"preset": 9} if compress == "xz" else {})) as tar:
        for p in sorted(stage.iterdir()):
            tar.add(p, arcname=p.name)
    return dst


def size_of(path: Path) -> int:
    """The bytes of a file, or of the files under a folder."""
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    """Install or copy, trim, pack and say how big."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(HERE / "carry"))
    ap.add_argument("--from-site", action="store_true", help="copy this interpreter's packages (same Python only)")
    ap.add_argument("--compress", choices=("xz", "tar", "none"), default="xz")
    ap.add_argument("--pin", action="append", default=[], help="NAME==VERSION instead of the version installed here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="qrag-carry-") as tmp:
        stage = Path(tmp) / "site"
        stage.mkdir()
        copy_site(stage) if a.from_site else install_wheels(stage, requirements(a.pin))
        installed = size_of(stage)
        trim(stage)
        trimmed = size_of(stage)
        dst = pack(stage, Path(a.out), a.compress)
    mib = 2**20
    print(f"carry {dst}: {size_of(dst) / mib:.1f} MiB ({a.compress}); installed {installed / mib:.0f} MiB, "
          f"trimmed {trimmed / mib:.0f} MiB; the device call carries it with the repository (64 MiB in all)")


if __name__ == "__main__":
    main()
