#!/usr/bin/env bash
# The HTTP API against its own OpenAPI schema: schemathesis `--checks all` (60 examples per operation) on a
# real `qrag serve --tenants` over a small index whose documents have metadata (filters meet real fields),
# published as a versioned root and reached with a write key (the write routes take the batches they are sent),
# once without an LLM and once with one (the test suite's OpenAI-compatible fake stands in for the endpoint).
# Reads ./schemathesis.toml. Prints each summary and exits non-zero when either run finds a failure.
# Minutes on 2 cores; not part of `make test` (the suite fuzzes the live app with fewer examples in
# tests/serving/test_app.py).
#
#   scripts/fuzz_api.sh [EXAMPLES]
set -uo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
EXAMPLES=${1:-60}
W=$(mktemp -d)
trap 'kill -TERM $(jobs -p) 2>/dev/null; wait; rm -rf "$W"' EXIT
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
python -c "import sys, pathlib; from support.corpus import pydoc_docs, topic_metadata, write_jsonl
docs = [d | {'metadata': topic_metadata(i, d['id']), 'url': 'https://x.org/' + d['id']}
        for i, d in enumerate(pydoc_docs(with_questions=False)[:12])]
write_jsonl(pathlib.Path(sys.argv[1]), docs)" "$W/corpus.jsonl"
qrag index -i "$W/corpus.jsonl" -o "$W/idx" -r chunk --bm25 --shards 2 >"$W/index.log" 2>&1 \
  || { echo "error: qrag index failed; the end of its log:" >&2; tail -5 "$W/index.log"; exit 1; }
qrag publish "$W/idx" --root "$W/root" >/dev/null 2>&1 || { echo "error: qrag publish failed" >&2; exit 1; }
KEY=$(qrag tenants add --file "$W/tenants.yaml" --name alpha --index "$W/root" --scope write | awk 'END {print $NF}')
free_port() { python -c "from qrag_ray.runtime.ports import free_port; print(free_port())"; }
rc=0
for llm in none fake; do
  port=$(free_port)
  extra=()
  if [[ $llm == fake ]]; then
    lport=$(free_port)
    python -c "import sys, time; from fake_openai_server import running_fake_openai
with running_fake_openai(port=int(sys.argv[1])): time.sleep(1e9)" "$lport" &
    extra=(--llm-url "http://127.0.0.1:$lport/v1" --llm-model fake)
  fi
  qrag serve --tenants "$W/tenants.yaml" --port "$port" "${extra[@]}" >"$W/serve-$llm.log" 2>&1 &
  serve_pid=$!
  ready=0
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && { ready=1; break; }; sleep 2; done
  if [[ $ready == 0 ]]; then
    echo "error: qrag serve (LLM: $llm) not ready after 10 minutes; the end of its log:" >&2
    tail -5 "$W/serve-$llm.log"; exit 1
  fi
  echo "=== schemathesis --checks all, $EXAMPLES examples per operation, LLM: $llm"
  st run --checks all --max-examples "$EXAMPLES" -H "Authorization: Bearer $KEY" \
    "http://127.0.0.1:$port/openapi.json" >"$W/st-$llm.log" 2>&1 || rc=1
  sed -n '/SUMMARY/,$p' "$W/st-$llm.log"
  kill -TERM "$serve_pid"; wait "$serve_pid" 2>/dev/null
  kill -TERM $(jobs -p) 2>/dev/null; wait 2>/dev/null
done
exit $rc
