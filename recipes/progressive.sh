#!/usr/bin/env bash
# Progressive (shallow-to-deep) training, textbook ch. 15 / Li et al. 2020: train an h-layer
# encoder, grow it to 2h layers (`xinda grow` stacks a copy of the trained encoder on top),
# train on, grow to 4h, train on. After each growth the learning rate restarts at its peak
# (the schedule goes on from the end of its warm-up) with a fresh optimizer.
#
#   recipes/progressive.sh [CONFIG] [BUDGET] [H]
#     CONFIG  experiment YAML (default recipes/demo-numbers.yaml: its number-words -> digits
#             data is generated into xinda-demo/raw when missing)
#     BUDGET  per phase: "60s" = 60 seconds of training, "500" = 500 updates (default 60s);
#             phase N trains until the run has used N budgets
#     H       encoder layers of the first phase (default: the config's model)
#
# Prepares the data when its manifest is missing. Model directories: OUT-{H}l, OUT-{2H}l and
# OUT-{4H}l, OUT = the config's train.out_dir (none of them may hold checkpoints yet). Prints
# each phase's last validation loss. Run from the repository root with xinda installed.
set -euo pipefail
CONFIG=${1:-recipes/demo-numbers.yaml}
BUDGET=${2:-60s}
PY=${XINDA_PY:-python}

# one value of the config: its data dir, train.out_dir, encoder layers or first raw train file
get() {
  "$PY" - "$CONFIG" "$1" <<'EOF'
import sys
from xinda.config import load_config
from xinda.models.registry import resolve
cfg = load_config(sys.argv[1])
print({"data": cfg.data.out_dir, "out": cfg.train.out_dir,
       "layers": getattr(resolve(cfg.model), "encoder_layers", 0),
       "raw": f"{cfg.data.train}.{cfg.data.src_lang}"}[sys.argv[2]])
EOF
}
H=${3:-$(get layers)}
OUT=$(get out)
case $BUDGET in
  *s) SECONDS_PER=${BUDGET%s}; PER=0 ;;
  *)  SECONDS_PER=0; PER=$BUDGET ;;
esac
case $SECONDS_PER$PER in
  *[!0-9]*) echo "progressive.sh: BUDGET must be a whole number of updates or seconds (60s), got $BUDGET" >&2; exit 2 ;;
esac
# the limits of phase N: max_steps and max_seconds count the whole run across resumes (xinda
# grow keeps the run's clock), so phase N ends at N budgets
limits() {
  LIMIT=(--set "train.max_seconds=$(($1 * SECONDS_PER))" --set "train.max_steps=$(($1 * PER))")
}

if [ "$CONFIG" = recipes/demo-numbers.yaml ] && [ ! -f "$(get raw)" ]; then
  echo "== generating the demo corpus into xinda-demo/raw"
  "$PY" -c 'from xinda.demo.numbers import write_demo_corpus; write_demo_corpus("xinda-demo/raw")'
fi
[ -f "$(get data)/manifest.json" ] || xinda prepare "$CONFIG"

last_valid_loss() {
  "$PY" - "$1" <<'EOF'
import sys
from pathlib import Path
from xinda.train.curves import read_log
rows = [r for r in read_log(Path(sys.argv[1]) / "log.csv") if "valid_loss" in r]
print(f"{rows[-1]['valid_loss']:.3f} (update {rows[-1]['step']:.0f})" if rows else "-")
EOF
}

DIR=$OUT-${H}l
echo "== phase 1: $H encoder layers -> $DIR"
limits 1
xinda train "$CONFIG" --set "model.encoder_layers=$H" --set "train.out_dir=$DIR" "${LIMIT[@]}"
SUMMARY="phase 1 ($H layers): valid loss $(last_valid_loss "$DIR")"

for phase in 2 3; do
  layers=$((H << (phase - 1)))
  NEXT=$OUT-${layers}l
  echo "== phase $phase: grow to $layers encoder layers -> $NEXT"
  xinda grow "$DIR" --to "$layers" --output "$NEXT"
  limits "$phase"
  xinda train "$NEXT/config.yaml" --resume "${LIMIT[@]}"
  SUMMARY+=$'\n'"phase $phase ($layers layers): valid loss $(last_valid_loss "$NEXT")"
  DIR=$NEXT
done
echo "$SUMMARY"
echo "translate with: xinda translate $DIR -i INPUT"
