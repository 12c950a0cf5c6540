#!/usr/bin/env bash
# The full test run (README's test command, called by .ci/run), in phases, each stamped when it starts
# and ends ("[test] HH:MM:SS phase ...") and listed with its minutes at the end:
#   lint     ruff over the repository's Python (pyproject's [tool.ruff], `make lint`): a finding ends the run
#            here, in seconds, before half an hour of tests
#   fast     the unit and integration tiers (pytest -m "not slow")
#   install  the fresh-user install checks (tests/test_install.py), in the background at a lower CPU and
#            I/O priority, started when the fast tier ends; their output is printed when they end
#   slices   the CI slice of the multi-dataset suite with the regression matrix's ci conditions, in one
#            process (when the shared data folder is there)
#   slow     the slow tests (real vLLM-CPU generation, a 3-node local Ray cluster), in one process
# Reports of the run go to ${QRAG_TEST_REPORTS:-runs/test-reports}/: phases.tsv (phase, exit status,
# seconds) and durations-<phase>.tsv (every test's setup/call/teardown seconds, slowest first:
# tests/support/durations.py), whose slowest lines are printed at the end. Index builds are shared by
# content across the run's pytest processes (QRAG_TEST_BUILD_CACHE: tests/support/build_cache.py), in a
# folder of this run removed at its end. A hung test fails alone, with its name, at pytest-timeout's limit
# (pyproject's `timeout`; a test that needs longer says so with @pytest.mark.timeout).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Output reaches the log as it is written: a run stopped from outside shows how far it got.
export PYTHONUNBUFFERED=1
# After a full setup the LLM tests must run: a missing vLLM or Qwen fails them instead of skipping.
if [[ "${QRAG_NO_LLM:-0}" != "1" ]]; then export QRAG_REQUIRE_LLM=1; fi

REPORTS="${QRAG_TEST_REPORTS:-runs/test-reports}"
mkdir -p "$REPORTS"
rm -f "$REPORTS"/phases.tsv "$REPORTS"/durations-*.tsv "$REPORTS"/install.log
WORK="$(mktemp -d "${TMPDIR:-/tmp}/qrag-test.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export QRAG_TEST_BUILD_CACHE="${QRAG_TEST_BUILD_CACHE:-$WORK/builds}"
RUN_START=$(date +%s)

stamp() { echo "[test] $(date +%H:%M:%S) $*"; }
# The install checks build a fresh user's venv (several GB): a run that fails on a full disk says so up front.
stamp "disk: $(df -h --output=avail "$WORK" | tail -1 | tr -d ' ') free under $(dirname "$WORK")"
mmss() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }
# phase NAME CMD...: CMD between two stamps, its exit status and seconds appended to phases.tsv
phase() {
  local name=$1 t0 rc=0 s
  shift
  t0=$(date +%s)
  stamp "$name: start"
  "$@" || rc=$?
  s=$(($(date +%s) - t0))
  stamp "$name: exit $rc after $(mmss "$s")"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$s" >>"$REPORTS/phases.tsv"
  return "$rc"
}
# tier NAME PYTEST-ARGS...: one pytest process whose tests' times go to durations-NAME.tsv
tier() {
  local name=$1
  shift
  QRAG_TEST_DURATIONS="$REPORTS/durations-$name.tsv" python -m pytest -q -p no:cacheprovider "$@"
}

# ruff lists every finding as file:line:column: rule message
phase lint ruff check --output-format concise

fast_rc=0
# The fast tier's tests take 3 minutes at most on a quiet 2-core box: a fast test that hangs fails at 10
# minutes, not at the 20 of pyproject's limit, which the slow tests' long builds need.
phase fast tier fast -m "not slow" --timeout 600 "$@" || fast_rc=$?

# The install checks (setup as a fresh user with the public index only, the GPU extra's resolution) mostly
# wait on the network and the disk, but the fresh user's PyTorch (several GB unpacked) churns the page
# cache that every embedding actor imports torch from: beside the fast tier it stalled actor start-ups by
# minutes (docs/research/CI-log.md). So they start when the fast tier ends, beside the slices and the slow
# tier, at a lower CPU priority (nice 10: a tenth of a neighbour's share when both want the CPU; not 19,
# which would all but stop them beside vLLM-CPU's spinning threads and put them on the run's critical
# path) and in the idle I/O class (the disk goes to the timed phases first; mq-deadline's aging still
# serves an idle request within seconds).
LOW=(nice -n 10)
if command -v ionice >/dev/null; then LOW+=(ionice -c 3); fi
(export QRAG_TEST_DURATIONS="$REPORTS/durations-install.tsv"
 phase install "${LOW[@]}" python -m pytest -q -p no:cacheprovider -m slow tests/test_install.py) >"$REPORTS/install.log" 2>&1 &
INSTALL_PID=$!

# The regression slices run before the slow tests, not beside them: vLLM-CPU binds its threads to every
# core and spins, which starves an embedding run beside it (docs/research/CI-log.md). Their indexes go to
# this run's folder: an index left by an earlier run (of other code) is never reused.
DATA="${QRAG_DATA:-$(cd .. && pwd)/shared/data}"
eval_rc=0
if [[ -f "$DATA/squad-v1.1/dev-v1.1.json" ]]; then
  # the CI slice of the multi-dataset suite (eval/suite.yaml: SQuAD, BiPaR and TREC DL19) and the matrix's ci conditions
  QRAG_DATA="$DATA" phase slices qrag suite --slice ci --output "$WORK/suite-ci" || eval_rc=$?
else
  stamp "slices: skipped, no SQuAD dev set under $DATA (set QRAG_DATA)"
fi

slow_rc=0
phase slow tier slow -m "slow and not soak" --ignore=tests/test_install.py "$@" || slow_rc=$?

install_rc=0
wait "$INSTALL_PID" || install_rc=$?
echo "[test] install checks (tests/test_install.py):"
cat "$REPORTS/install.log"

total=$(($(date +%s) - RUN_START))
echo "[test] phases (the install checks beside slices and slow):"
while IFS=$'\t' read -r name rc s; do
  printf '[test]   %-8s exit %-3s %s\n' "$name" "$rc" "$(mmss "$s")"
done <"$REPORTS/phases.tsv"
echo "[test] total $(mmss "$total")"
for f in "$REPORTS"/durations-*.tsv; do
  [[ -f "$f" ]] || continue
  echo "[test] slowest of $(basename "$f" .tsv) (all in $f):"
  # one process, no pipe: under pipefail a reader that stops early (head) fails the run with SIGPIPE
  sed -n "2,16s/^/[test]   /p" "$f"
done
if [[ $fast_rc -ne 0 || $slow_rc -ne 0 || $eval_rc -ne 0 || $install_rc -ne 0 ]]; then
  echo "[test] failed: fast tests rc=$fast_rc, slow tests rc=$slow_rc, regression slices rc=$eval_rc," \
       "install checks rc=$install_rc" >&2
  exit 1
fi
