"""Every RNN preset on Multi30k en->de with the same wall-clock budget, one table.

    python benchmarks/rnn_variants.py [--budget 1200] [--presets rnn-sutskever,gnmt,...]

For each preset: ``xinda train`` for the budget (shared prepared data, joint 8k BPE), then
``xinda translate`` test2016 with beam 5, without and with the GNMT coverage penalty. Prints
preset, parameters, train target tokens/s, BLEU and BLEU with coverage. Not a test: it takes
len(presets) x (budget + decode) seconds. Needs ../shared/data.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multi30k import PAIRS, ROOT, SHARED, experiment, markdown_table, timed

from xinda.config import apply_overrides

LR_PEAK = 3e-3
PRESETS = ["rnn-sutskever", "rnn-bahdanau", "rnn-luong-global", "rnn-luong-local-p", "gnmt"]


def rnn_config(work: Path, preset: str, budget: float, threads: int,
               overrides: list[str] = ()) -> dict:
    cfg = experiment(PAIRS["en-de"], work, budget, threads)
    cfg["data"]["out_dir"] = str(work.parent / "data-bin")
    cfg["model"] = {"preset": preset}
    # RNNs learn fastest per second here with small batches and a high rate: Adam peak LR_PEAK
    # after 400 updates, inverse-sqrt decay, 2048 tokens per batch, clipping at 5 (Luong et al.
    # 2015). Tuned on rnn-luong-global, 240 s runs (docs/results/rnn-tuning.md).
    cfg["train"].update(lr=LR_PEAK, warmup_steps=400, schedule="inverse_sqrt", clip_norm=5.0,
                        max_tokens=2048)
    return apply_overrides(cfg, list(overrides))


def bleu(hyp: Path, ref: Path) -> float:
    import sacrebleu

    hyps = hyp.read_text(encoding="utf-8").splitlines()
    refs = ref.read_text(encoding="utf-8").splitlines()
    return round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)


def run_preset(work: Path, preset: str, budget: float, threads: int,
               overrides: list[str] = ()) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    cfg_path = work / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(rnn_config(work, preset, budget, threads, overrides)))
    xinda = [sys.executable, "-m", "xinda.cli"]
    if not (work.parent / "data-bin" / "manifest.json").exists():
        timed([*xinda, "prepare", str(cfg_path)], work / "prepare.log")
    shutil.rmtree(work / "model", ignore_errors=True)
    timed([*xinda, "train", str(cfg_path)], work / "train.log")
    stats = json.loads((work / "model" / "train_stats.json").read_text())
    test = SHARED / "multi30k" / "test2016"
    row = {"preset": preset, "params": stats["parameters"], "updates": stats["steps"],
           "tok_per_s": round(stats["tgt_tok_per_s"])}
    for name, extra in (("bleu", []), ("bleu_cp", ["--coverage", "0.2"])):
        if name == "bleu_cp" and preset == "rnn-sutskever":
            row[name] = None  # no attention, no coverage
            continue
        hyp = work / f"test2016.{name}.hyp"
        timed([*xinda, "translate", str(work / "model"), "-i", f"{test}.en", "-o", str(hyp),
               "--beam", "5", "--threads", str(threads), *extra], work / f"translate.{name}.log")
        row[name] = bleu(hyp, Path(f"{test}.de"))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=1200.0)
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--workdir", type=Path, default=ROOT / "runs" / "rnn-variants")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    metavar="SECTION.KEY=VALUE", help="override the recipe, e.g. train.lr=2e-3")
    args = ap.parse_args()
    if not (SHARED / "multi30k").is_dir():
        print(f"skipped: {SHARED / 'multi30k'} not found (set XINDA_SHARED_DATA)")
        return
    rows = []
    for preset in args.presets.split(","):
        rows.append(run_preset(args.workdir / preset, preset, args.budget, args.threads,
                               args.overrides))
        print(json.dumps(rows[-1]), flush=True)
    header = ["preset", "params", "updates", "train tok/s", "BLEU test2016", "BLEU + coverage"]
    body = [[r["preset"], f"{r['params']:,}", r["updates"], r["tok_per_s"], r["bleu"],
             r["bleu_cp"] if r["bleu_cp"] is not None else "–"] for r in rows]
    print("", *markdown_table(header, body), sep="\n")
    (args.workdir / "table.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
