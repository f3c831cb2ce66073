"""Fusion-paper ablation: baseline vs layer fusion vs sub-layer fusion vs DLCL, several seeds.

    python benchmarks/ablation.py [--budget 300] [--pairs en-de,zh-en] [--seeds 1,2,3]
        [--systems baseline,layer-fusion,sublayer-fusion,dlcl,dlcl-last] [--workdir runs/ablation]
        [--threads 2] [--set section.key=value ...]

Every system is the transformer-small recipe of ``multi30k.py`` (3+3 x 256, pre-norm, same
optimiser and batch size) with one change to how layers feed each other:

* baseline         -- transformer-small as is
* layer-fusion     -- fusion: layer, fusion_function: mean, fusion_side: both
* sublayer-fusion  -- fusion: sublayer, fusion_function: mean, fusion_side: both
* dlcl             -- dense: both (dynamic linear combination of layers), mean-initialised
* dlcl-last        -- the same, initialised with all weight on the newest layer (dense_init)

Each (pair, system, seed) run is ``xinda train`` for the same wall-clock budget (train.seed =
seed) on data prepared once per pair, then ``xinda translate`` of the pair's test set with beam 5.
Per pair it prints a markdown table: parameters, BLEU mean +- std over seeds (sacreBLEU, default
13a tokenisation; both targets are de/en), mean updates, mean target tokens/s and BLEU by source
length (buckets 1-10, 11-20, 21+: whitespace words of the raw English source, characters of the
raw Chinese source; per-bucket BLEU averaged over seeds). Raw results go to WORKDIR/ablation.json,
the tables to WORKDIR/ablation.md. Runs whose result.json exists are skipped, so an interrupted
benchmark resumes where it stopped (delete a run's folder to redo it).

Not a test. It takes about pairs x systems x seeds x (budget + ~1-2 min of decoding) plus ~1 min
of data preparation per pair: with the defaults 2 x 5 x 3 x ~7 min, i.e. roughly 3.5 hours on a
2-core CPU. Needs ../shared/data (a pair whose corpus folder is absent is skipped with a message).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multi30k import (
    PAIRS,
    ROOT,
    SHARED,
    add_study_arguments,
    cached_result,
    experiment,
    markdown_table,
    prepare_once,
    set_threads,
    timed,
    write_run_config,
)

from xinda.config import apply_overrides
from xinda.evaluate.metrics import bleu_by_length, corpus_scores
from xinda.train.curves import read_log
from xinda.utils import read_lines

SMALL = {"preset": "transformer-small"}
SYSTEMS = {
    "baseline": SMALL,
    "layer-fusion": {**SMALL, "fusion": "layer", "fusion_function": "mean", "fusion_side": "both"},
    "sublayer-fusion": {**SMALL, "fusion": "sublayer", "fusion_function": "mean",
                        "fusion_side": "both"},
    "dlcl": {**SMALL, "dense": "both"},
    "dlcl-last": {**SMALL, "dense": "both", "dense_init": "last"},
}
EDGES = (10, 20)  # buckets 1-10, 11-20, 21+: the test sets are short captions / sentences


def raw_file(prefix: Path, lang: str) -> Path:
    """The raw split file ``prefix.lang`` (or ``prefix.lang.gz``)."""
    plain = Path(f"{prefix}.{lang}")
    return plain if plain.exists() else Path(f"{plain}.gz")


def run_config(pair_name: str, pair_dir: Path, run_dir: Path, model: dict, seed: int,
               budget: float, threads: int, overrides: list[str]) -> dict:
    cfg = experiment(PAIRS[pair_name], run_dir, budget, threads)
    cfg["data"]["out_dir"] = str(pair_dir / "data-bin")  # prepared once per pair, shared
    cfg["model"] = copy.deepcopy(model)
    cfg["train"]["seed"] = seed
    apply_overrides(cfg, overrides)
    return cfg


def prepare_pair(pair_name: str, pair_dir: Path, budget: float, threads: int,
                 overrides: list[str]) -> None:
    cfg = run_config(pair_name, pair_dir, pair_dir, SMALL, 1, budget, threads, overrides)
    prepare_once(cfg, pair_dir, f"[{pair_name}] ")


def train_curve(run_dir: Path) -> list[list[float]]:
    """[update, label-smoothed train loss] of every row of the run's log.csv."""
    log = run_dir / "model" / "log.csv"
    rows = read_log(log) if log.exists() else []
    return [[int(r["step"]), r["train_loss"]] for r in rows if "train_loss" in r]


def run_one(pair_name: str, pair_dir: Path, system: str, seed: int, budget: float, threads: int,
            overrides: list[str]) -> dict:
    """Train + decode + score one (system, seed); cached in its result.json."""
    run_dir = pair_dir / system / f"seed{seed}"
    result_path = run_dir / "result.json"
    cfg = run_config(pair_name, pair_dir, run_dir, SYSTEMS[system], seed, budget, threads,
                     overrides)
    if (result := cached_result(result_path, cfg, f"[{pair_name}]")) is not None:
        print(f"[{pair_name}] {system} seed {seed}: cached, BLEU {result['bleu']}", flush=True)
        return {**result, "train_curve": result.get("train_curve") or train_curve(run_dir)}
    cfg_path = write_run_config(run_dir, cfg)
    xinda = [sys.executable, "-m", "xinda.cli"]
    shutil.rmtree(run_dir / "model", ignore_errors=True)  # a half-finished earlier attempt
    print(f"[{pair_name}] {system} seed {seed}: training {budget:g} s", flush=True)
    train = timed([*xinda, "train", str(cfg_path)], run_dir / "train.log")
    stats = json.loads((run_dir / "model" / "train_stats.json").read_text())

    pair = PAIRS[pair_name]
    test = SHARED / pair["corpus"] / pair["test"]
    src_path, ref_path = raw_file(test, pair["src"]), raw_file(test, pair["tgt"])
    hyp_path = run_dir / f"{pair['test']}.hyp"
    dec = timed([*xinda, "translate", str(run_dir / "model"), "-i", str(src_path),
                 "-o", str(hyp_path), "--beam", "5", "--threads", str(threads)],
                run_dir / "translate.log")
    speed = re.search(r"\(([\d.]+) sentences/s\)", (run_dir / "translate.log").read_text())

    sources = list(read_lines(src_path))
    refs = list(read_lines(ref_path))
    hyps = list(read_lines(hyp_path))
    bleu, chrf = corpus_scores(hyps, refs, metrics=("bleu", "chrf"), tokenize=pair["tokenize"])
    by_length = bleu_by_length(sources, hyps, refs, edges=EDGES, tokenize=pair["tokenize"],
                               unit=pair["unit"])
    result = {
        "pair": pair_name, "system": system, "seed": seed, "model": cfg["model"],
        "budget_s": budget, "params": stats["parameters"], "updates": stats["steps"],
        "tok_per_s": round(stats["tgt_tok_per_s"], 1), "train_seconds": stats["train_seconds"],
        "train_peak_rss_mb": round(train["peak_rss_mb"] or 0),
        "bleu": round(bleu.score, 2), "chrf": round(chrf.score, 2),
        "bleu_signature": bleu.signature,
        "bleu_by_length": [{**row, "bleu": round(row["bleu"], 2)} for row in by_length],
        "length_unit": pair["unit"],
        "decode_sents_per_s": float(speed.group(1)) if speed else None,
        "decode_process_wall_s": round(dec["wall_s"], 1),
        "train_curve": train_curve(run_dir),
        "config": cfg,
    }
    result_path.write_text(json.dumps(result, indent=1))
    print(f"[{pair_name}] {system} seed {seed}: {result['updates']} updates, "
          f"BLEU {result['bleu']}", flush=True)
    return result


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation, rounded to 0.01; no deviation (None) from one value."""
    std = round(statistics.stdev(values), 2) if len(values) > 1 else None
    return round(statistics.fmean(values), 2), std


def bleu_cell(mean: float, std: float | None) -> str:
    """"mean ± std", or "mean (one seed)" where there is no deviation to show."""
    return f"{mean:.2f} (one seed)" if std is None else f"{mean:.2f} ± {std:.2f}"


def common_update(runs: list[dict]) -> int | None:
    """The latest logged update that every run reached: losses there compare per update."""
    reached = [{step for step, _ in r["train_curve"]} for r in runs]
    shared = set.intersection(*reached) if reached else set()
    return max(shared) if shared else None


def summarise(runs: list[dict], systems: list[str]) -> list[dict]:
    at = common_update(runs)
    rows = []
    for system in systems:
        mine = [r for r in runs if r["system"] == system]
        if not mine:
            continue
        bleu_mean, bleu_std = mean_std([r["bleu"] for r in mine])
        buckets: dict[str, list[float]] = {}
        sentences: dict[str, int] = {}
        for r in mine:
            for b in r["bleu_by_length"]:
                buckets.setdefault(b["bucket"], []).append(b["bleu"])
                sentences[b["bucket"]] = b["sentences"]
        rows.append({
            "system": system, "seeds": sorted(r["seed"] for r in mine),
            "params": mine[0]["params"], "bleu_mean": bleu_mean, "bleu_std": bleu_std,
            "updates_mean": round(statistics.fmean(r["updates"] for r in mine)),
            "tok_per_s_mean": round(statistics.fmean(r["tok_per_s"] for r in mine)),
            "bleu_by_length": {k: round(statistics.fmean(v), 2) for k, v in buckets.items()},
            "loss_at_update": at,
            "loss_at": (round(statistics.fmean(dict(r["train_curve"])[at] for r in mine), 3)
                        if at else None),
            "bucket_sentences": sentences,
        })
    return rows


def _bucket_key(label: str) -> int:
    return int(re.match(r"\d+", label).group())


def _loss(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def markdown(pair_name: str, rows: list[dict], budget: float) -> str:
    pair = PAIRS[pair_name]
    buckets = sorted({b for r in rows for b in r["bleu_by_length"]}, key=_bucket_key)
    sentences = {b: n for r in rows for b, n in r["bucket_sentences"].items()}
    unit = "whitespace words" if pair["unit"] == "words" else "characters"
    seeds = sorted({s for r in rows for s in r["seeds"]})
    at = rows[0]["loss_at_update"] if rows else None
    lines = [
        (f"### {pair_name} ({pair['corpus']} {pair['test']}), {budget:g} s per run, "
         f"seeds {','.join(map(str, seeds))}; BLEU by source length in {unit} of the raw "
         f"{pair['src']} source; train loss (label-smoothed, mean over seeds) at the latest "
         "logged update that every run reached, to compare learning per update"),
        "",
    ]
    header = ["system", "params", "seeds", "BLEU (mean ± std)", "updates", "tok/s",
              f"loss @ {at} upd.", *(f"BLEU {b} ({sentences[b]} sent.)" for b in buckets)]
    body = [[r["system"], f"{r['params']:,}", len(r["seeds"]),
             bleu_cell(r["bleu_mean"], r["bleu_std"]), r["updates_mean"],
             r["tok_per_s_mean"], _loss(r["loss_at"]),
             *(f"{r['bleu_by_length'][b]:.2f}" if b in r["bleu_by_length"] else "–"
               for b in buckets)] for r in rows]
    return "\n".join(lines + markdown_table(header, body))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_study_arguments(ap, ROOT / "runs" / "ablation", "every run's")
    ap.add_argument("--pairs", default="en-de,zh-en", help=f"of {','.join(PAIRS)}")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {','.join(SYSTEMS)}")
    ap.add_argument("--seeds", default="1,2,3", help="train.seed values")
    args = ap.parse_args()
    pairs = [p for p in args.pairs.split(",") if p]
    systems = [s for s in args.systems.split(",") if s]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    unknown = [p for p in pairs if p not in PAIRS] + [s for s in systems if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown pair/system: {', '.join(unknown)}; pairs {', '.join(PAIRS)}, "
                 f"systems {', '.join(SYSTEMS)}")
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    set_threads(args.threads)

    report = {"budget_s": args.budget, "systems": {s: SYSTEMS[s] for s in systems},
              "seeds": seeds, "overrides": args.overrides, "pairs": {}}
    tables = []
    for pair_name in pairs:
        corpus = SHARED / PAIRS[pair_name]["corpus"]
        if not corpus.is_dir():
            reason = f"{corpus} not found (set XINDA_SHARED_DATA)"
            print(f"[{pair_name}] skipped: {reason}", flush=True)
            report["pairs"][pair_name] = {"skipped": reason}
            tables.append(f"### {pair_name}\n\nskipped: {reason}")
            continue
        pair_dir = work / pair_name
        prepare_pair(pair_name, pair_dir, args.budget, args.threads, args.overrides)
        # Seed-major order: a slow spell of a noisy machine hits every system alike.
        runs = [run_one(pair_name, pair_dir, system, seed, args.budget, args.threads,
                        args.overrides) for seed in seeds for system in systems]
        rows = summarise(runs, systems)
        report["pairs"][pair_name] = {"summary": rows,
                                      "runs": [{k: v for k, v in r.items() if k != "config"}
                                               for r in runs]}
        tables.append(markdown(pair_name, rows, args.budget))
        print("\n" + tables[-1] + "\n", flush=True)
        # Write after each pair so a later failure keeps what is done.
        (work / "ablation.json").write_text(json.dumps(report, indent=1))
        (work / "ablation.md").write_text("\n\n".join(tables) + "\n")
    (work / "ablation.json").write_text(json.dumps(report, indent=1))
    (work / "ablation.md").write_text("\n\n".join(tables) + "\n")
    print(f"wrote {work / 'ablation.json'} and {work / 'ablation.md'}")


if __name__ == "__main__":
    main()
