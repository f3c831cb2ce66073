#!/usr/bin/env bash
# xinda as a peer of ../shared/bench (same data, config, budget and decode settings).
#   xinda.sh train SECONDS OUTDIR      train on $DATA (shared sentencepiece model) for SECONDS
#   xinda.sh translate OUTDIR IN OUT   IN/OUT: sentencepiece pieces, beam 5, 64 sentences/batch
#   xinda.sh version
#   xinda.sh export-ctranslate2 OUTDIR CT2_DIR   the model `train` wrote (OUTDIR/model) as a
#       CTranslate2 model directory (float32; the harness quantises at load time), decoded by
#       peers/ctranslate2.sh in the same run. Needs ctranslate2 in xinda's environment:
#       pip install -e '.[export]'
# Run beside the peers:
#   EXTRA_PEER_DIR=benchmarks/peers PEER_LIST="xinda fairseq" bash ../shared/bench/run_peers.sh
# XINDA_DECODE: more `xinda translate` options, e.g. "--precision int8 --workers 2" (default:
#   none, i.e. fp32 in one process with THREADS threads)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BENCH_COMMON=${BENCH_COMMON:-$ROOT/../shared/bench/peers/common.sh}
source "$BENCH_COMMON"
PY=${XINDA_PY:-$ROOT/.venv/bin/python}
XINDA_DECODE=${XINDA_DECODE:-}
[ -x "$PY" ] || PY=python3

cmd=${1:?usage: train SECONDS OUTDIR | translate OUTDIR IN OUT | version | export-ctranslate2 OUTDIR CT2_DIR}; shift
case $cmd in
  version)
    "$PY" -c 'import torch, xinda; print(f"xinda {xinda.__version__} / torch {torch.__version__}")'
    ;;
  train)
    SECS=$1; OUT=$(realpath -m "$2"); mkdir -p "$OUT"
    cat > "$OUT/config.yaml" <<YAML
data:
  src_lang: en
  tgt_lang: de
  train: $DATA/train
  valid: $DATA/valid
  test: {test: $DATA/test}
  out_dir: $OUT/data-bin
  spm_model: $DATA/spm.model   # the shared model: byte-identical pieces for every peer
  normalize: none
  max_len: 250
  max_len_ratio: 1.0e9          # no filter that bites, as for the peers
  dedup: false
model:
  preset: transformer-small     # 3+3 layers, d 256, 4 heads, FFN 1024, pre-norm, tied
train:
  out_dir: $OUT/model
  seed: 1
  threads: $THREADS
  max_tokens: 4096
  lr: 5.0e-4
  warmup_steps: 1000
  schedule: inverse_sqrt
  betas: [0.9, 0.98]
  label_smoothing: 0.1
  clip_norm: 0.0
  max_seconds: $SECS
  max_epochs: 100000
  run_validation: false         # no validation inside the budget (same for all)
  keep_last: 1
  progress: false
YAML
    "$PY" -m xinda.cli prepare "$OUT/config.yaml" > "$OUT/prepare.log" 2>&1 \
      || { tail -n 20 "$OUT/prepare.log"; exit 1; }
    rm -rf "$OUT/model"
    TIMEFILE=$OUT/time_train.txt
    timed "$PY" -m xinda.cli train "$OUT/config.yaml" > "$OUT/train.stdout" 2>&1 \
      || { tail -n 30 "$OUT/train.stdout"; exit 1; }
    "$PY" - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
s = json.load(open(f"{out}/model/train_stats.json"))
keep = {k: s[k] for k in ("steps", "tgt_tokens", "train_seconds", "tgt_tok_per_s")}
json.dump(keep, open(f"{out}/train_stats.json", "w"), indent=1)
PYEOF
    echo "train_stats: $(tr -d '\n ' < "$OUT/train_stats.json")"
    echo "peak_rss_mb: $(peak_rss_mb "$TIMEFILE")  wall_s: $(wall_s "$TIMEFILE")"
    ;;
  translate)
    MODEL=$(realpath "$1"); IN=$(realpath "$2"); OUT=$(realpath -m "$3")
    [ -d "$MODEL/model" ] && MODEL=$MODEL/model
    TIMEFILE=$OUT.time.txt
    timed "$PY" -m xinda.cli translate "$MODEL" -i "$IN" -o "$OUT" --input-format pieces \
      --output-format pieces --beam "$BEAM" --batch-size "$TRANSLATE_BATCH" \
      --max-len-a 1.5 --max-len-b 10 --threads "$THREADS" $XINDA_DECODE > "$OUT.log" 2>&1 \
      || { tail -n 30 "$OUT.log"; exit 1; }
    N=$(wc -l < "$IN"); M=$(wc -l < "$OUT")
    [ "$N" = "$M" ] || { echo "xinda produced $M of $N lines" >&2; exit 1; }
    DEC=$(grep -o 'in [0-9.]* s (' "$OUT.log" | awk '{print $2}')
    echo "{\"decode_seconds\": $DEC}" > "$OUT.stats.json"
    echo "decode_stats: $(tr -d '\n ' < "$OUT.stats.json") sentences: $N"
    echo "peak_rss_mb: $(peak_rss_mb "$TIMEFILE")  wall_s: $(wall_s "$TIMEFILE")"
    ;;
  export-ctranslate2)
    MODEL=$(realpath "$1"); CT2=$(realpath -m "$2")
    [ -d "$MODEL/model" ] && MODEL=$MODEL/model
    "$PY" -m xinda.cli export ctranslate2 "$MODEL" "$CT2" --force
    ;;
  *) echo "unknown subcommand $cmd" >&2; exit 2;;
esac
