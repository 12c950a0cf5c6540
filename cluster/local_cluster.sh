#!/usr/bin/env bash
# Local 3-node Ray cluster (head + node_a + node_b) on this machine; see cluster/local_cluster.py.
#   cluster/local_cluster.sh up [--workers 2] [--worker-cpus 2] [--base-port auto]
#   cluster/local_cluster.sh status
#   cluster/local_cluster.sh down [--keep-logs]
# Then: qrag index ... --address "$(cluster/local_cluster.sh address)"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
cd "$ROOT"
if [ "${1:-}" = "address" ]; then
  shift
  exec "$PY" -c 'import json,sys; from cluster.local_cluster import status; s=status(*sys.argv[1:2]); print(s.get("address","")) if s["running"] else sys.exit(3)' "$@"
fi
exec "$PY" -m cluster.local_cluster "$@"
