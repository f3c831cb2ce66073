"""Peak RSS and throughput of ``xinda train`` with the peer benchmark's configuration
(benchmarks/peers/xinda.sh: transformer-small 3+3 x 256, tied, 4096-token batches), A against B.

    python benchmarks/train_memory.py [--steps 60] [--threads 2] [--repeats 3]
        [--a "train.loss_chunk=0 train.onednn_cache=0"] [--b ""] [--a-code DIR] [--b-code DIR]
        [--data DIR] [--workdir DIR] [--out PATH]

Every run is its own ``python -m xinda.cli train`` process under ``/usr/bin/time -v``, for
``--steps`` updates from scratch. A and B alternate (A, B, A, B, ...) so that load from other
jobs falls on both alike. Prints each run, then the medians of peak RSS ("Maximum resident set
size", whole process) and of target tokens/s (train_stats.json: non-pad target tokens incl. EOS
over the training-loop clock), and B/A. ``--a``/``--b``: space-separated ``--set`` overrides;
``--a-code``/``--b-code``: xinda checkouts to run (default this one), e.g. main for "before".
``--data``: a folder with {train,valid,test}.{en,de} and spm.model; by default Multi30k from
../shared/data (XINDA_SHARED_DATA) with a joint BPE 8000 sentencepiece model trained once into
the work folder, as ../shared/bench/prep_multi30k.sh does. Writes ``--out``.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("XINDA_SHARED_DATA", ROOT.parent / "shared" / "data"))

TRAIN = {"seed": 1, "max_tokens": 4096, "lr": 5.0e-4, "warmup_steps": 1000,
         "schedule": "inverse_sqrt", "betas": [0.9, 0.98], "label_smoothing": 0.1,
         "clip_norm": 0.0, "max_epochs": 100000, "run_validation": False, "keep_last": 1,
         "progress": False}  # benchmarks/peers/xinda.sh, with max_steps for max_seconds


def multi30k(work: Path) -> Path:
    """Raw Multi30k en/de (test = test2016) and a joint BPE 8000 sentencepiece model."""
    import sentencepiece as spm

    data, raw = work / "data", SHARED / "multi30k"
    data.mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "train"), ("valid", "valid"), ("test", "test2016")):
        for lang in ("en", "de"):
            shutil.copyfile(raw / f"{name}.{lang}", data / f"{split}.{lang}")
    if not (data / "spm.model").exists():
        spm.SentencePieceTrainer.train(
            input=f"{data}/train.en,{data}/train.de", model_prefix=str(data / "spm"),
            vocab_size=8000, model_type="bpe", character_coverage=1.0, num_threads=2,
            input_sentence_size=10_000_000, shuffle_input_sentence=True, minloglevel=2)
    return data


def write_config(work: Path, data: Path, threads: int, steps: int) -> Path:
    cfg = {"data": {"src_lang": "en", "tgt_lang": "de", "train": f"{data}/train",
                    "valid": f"{data}/valid", "test": {"test": f"{data}/test"},
                    "out_dir": str(work / "data-bin"), "spm_model": f"{data}/spm.model",
                    "normalize": "none", "max_len": 250, "max_len_ratio": 1.0e9, "dedup": False},
           "model": {"preset": "transformer-small"},
           "train": {**TRAIN, "threads": threads, "max_steps": steps,
                     "out_dir": str(work / "model")}}
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def xinda(code: Path, args: list[str], log: Path, threads: int,
          time_file: Path | None = None) -> None:
    """``python -m xinda.cli ARGS`` from the checkout ``code`` (optionally under time -v)."""
    timed = ["/usr/bin/time", "-v", "-o", str(time_file)] if time_file else []
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads)}  # as ../shared/bench does
    with log.open("w") as out:
        proc = subprocess.run([*timed, sys.executable, "-m", "xinda.cli", *args], cwd=code,
                              env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode:
        sys.exit(f"failed: xinda {' '.join(args)}\n{log.read_text()[-2000:]}")


def train_once(code: Path, cfg: Path, overrides: str, run_dir: Path, threads: int) -> dict:
    """One training run: peak RSS (MB), target tokens/s and updates."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    sets = [x for o in [f"train.out_dir={run_dir / 'model'}", *overrides.split()]
            for x in ("--set", o)]
    xinda(code, ["train", str(cfg), *sets], run_dir / "train.log", threads, run_dir / "time.txt")
    timing = (run_dir / "time.txt").read_text()
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", timing)
    cpu = sum(float(x) for x in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", timing))
    stats = json.loads((run_dir / "model" / "train_stats.json").read_text())
    return {"peak_rss_mb": round(int(rss.group(1)) / 1024, 1),
            "tgt_tok_per_s": round(stats["tgt_tok_per_s"], 1),
            "tgt_tok_per_cpu_s": round(stats["tgt_tokens"] / cpu, 1), "steps": stats["steps"]}


METRICS = ("peak_rss_mb", "tgt_tok_per_s", "tgt_tok_per_cpu_s")


def summary(runs: list[dict]) -> dict:
    """Medians per variant and the B/A ratios of the medians."""
    med = {v: {k: statistics.median(r[k] for r in runs if r["variant"] == v)
               for k in METRICS} for v in ("A", "B")}
    ratio = {k: round(med["B"][k] / med["A"][k], 3) for k in med["A"]}
    return {"median": med, "b_over_a": ratio}


def markdown(result: dict) -> str:
    rows = [f"| {r['repeat']} | {r['variant']} | {r['peak_rss_mb']:.0f} | "
            f"{r['tgt_tok_per_s']:.0f} | {r['tgt_tok_per_cpu_s']:.0f} |" for r in result["runs"]]
    med, ratio = result["median"], result["b_over_a"]
    a, b = result["variants"]["A"], result["variants"]["B"]
    return "\n".join([
        "# `xinda train` peak memory and throughput, A against B", "",
        (f"Peer-benchmark configuration (transformer-small, 4096-token batches), "
         f"{result['steps']} updates per run, {result['threads']} threads, runs interleaved "
         f"A, B, A, B, ... ({result['repeats']} each), {result['machine']}."), "",
        f"- A: code {a['code']}, overrides `{a['overrides'] or '-'}`",
        f"- B: code {b['code']}, overrides `{b['overrides'] or '-'}`", "",
        ("target tok/s: over the training-loop clock; per CPU second: over the process's "
         "user + system time (start-up included), less sensitive to other jobs."), "",
        "| repeat | variant | peak RSS (MB) | target tok/s | per CPU s |", "|---|---|---|---|---|",
        *rows, "", "| median | peak RSS (MB) | target tok/s | per CPU s |", "|---|---|---|---|",
        *(f"| {v} | " + " | ".join(f"{med[v][k]:.0f}" for k in METRICS) + " |"
          for v in ("A", "B")),
        "| B / A | " + " | ".join(f"{ratio[k]:.3f}" for k in METRICS) + " |", ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--a", default="train.loss_chunk=0 train.onednn_cache=0",
                    help="--set overrides of A (space-separated)")
    ap.add_argument("--b", default="", help="--set overrides of B")
    ap.add_argument("--a-code", type=Path, default=ROOT)
    ap.add_argument("--b-code", type=Path, default=ROOT)
    ap.add_argument("--data", type=Path, help="raw {train,valid,test}.{en,de} + spm.model")
    ap.add_argument("--workdir", type=Path, default=ROOT / "runs" / "bench-train-memory")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "train_memory")
    args = ap.parse_args()
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    data = args.data.resolve() if args.data else multi30k(work)
    cfg = write_config(work, data, args.threads, args.steps)
    codes = {"A": args.a_code.resolve(), "B": args.b_code.resolve()}
    xinda(codes["B"], ["prepare", str(cfg)], work / "prepare.log", args.threads)
    runs = []
    for repeat in range(1, args.repeats + 1):
        for variant, overrides in (("A", args.a), ("B", args.b)):
            run = train_once(codes[variant], cfg, overrides, work / f"{variant}{repeat}",
                             args.threads)
            runs.append({"repeat": repeat, "variant": variant, **run})
            print(json.dumps(runs[-1]), flush=True)
    result = {"steps": args.steps, "threads": args.threads, "repeats": args.repeats,
              "machine": f"{os.cpu_count()} CPU cores",
              "variants": {v: {"code": str(codes[v]), "overrides": o}
                           for v, o in (("A", args.a), ("B", args.b))},
              "runs": runs, **summary(runs)}
    print(json.dumps({k: result[k] for k in ("median", "b_over_a")}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))


if __name__ == "__main__":
    main()
