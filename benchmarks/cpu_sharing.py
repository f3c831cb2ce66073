"""Two training jobs on one CPU: what OpenMP's waiting threads cost, and the two ways out.

    python benchmarks/cpu_sharing.py [--threads 2] [--repeats 3] [--updates 15]
        [--out docs/results/cpu-sharing]

PyTorch's CPU kernels run on OpenMP threads that, by default, spin while they wait for the
next parallel region. When two processes each start as many threads as there are cores, the
spinning threads take the cores from the working ones. Each setting below starts its
processes at once; every process runs the training step of ``benchmarks/gpu_throughput.py``
(``transformer-small``, 4096-token bf16 batches, ``--updates`` timed updates) and reports
target tokens/s. Settings:

- one job, ``--threads`` threads (the baseline), and the same with ``OMP_WAIT_POLICY=PASSIVE``;
- two jobs, ``--threads`` threads each, default waiting, then ``OMP_WAIT_POLICY=PASSIVE``;
- two jobs, ``--threads // 2`` threads each (the cores split between them).

Settings alternate within each repeat; the table gives medians of the machine's total
tokens/s (all jobs together) and their ratio to the baseline. Not a test: about 4 minutes a
repeat. Stop other CPU work first; the figures are ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multi30k import markdown_table

ROOT = Path(__file__).resolve().parents[1]
STEP = Path(__file__).resolve().parent / "gpu_throughput.py"


def settings(threads: int) -> dict[str, tuple[int, int, str | None]]:
    """Name -> (jobs, threads per job, OMP_WAIT_POLICY or None for OpenMP's default)."""
    return {f"1 job x {threads} threads": (1, threads, None),
            f"1 job x {threads} threads, PASSIVE": (1, threads, "PASSIVE"),
            f"2 jobs x {threads} threads": (2, threads, None),
            f"2 jobs x {threads} threads, PASSIVE": (2, threads, "PASSIVE"),
            f"2 jobs x {max(threads // 2, 1)} threads": (2, max(threads // 2, 1), None)}


def run_jobs(jobs: int, threads: int, policy: str | None, updates: int, tmp: Path) -> list[int]:
    """Start ``jobs`` training-step processes at once; their target tokens/s."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    outs = [tmp / f"job{i}" for i in range(jobs)]
    procs = [subprocess.Popen([sys.executable, str(STEP), "--device", "cpu",
                               "--presets", "transformer-small", "--max-tokens", "4096",
                               "--vocab", "8000", "--updates", str(updates), "--warmup", "3",
                               "--precision", "bf16", "--out", str(out)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for out in outs]
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode:
            sys.exit(f"cpu_sharing: a job failed:\n{err[-2000:]}")
    return [json.loads(out.with_suffix(".json").read_text())["train"][0]["tgt_tok_per_s"]
            for out in outs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2,
                    help="threads of one job (default: the machine's cores)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--updates", type=int, default=15)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "cpu-sharing")
    args = ap.parse_args()
    if min(args.threads, args.repeats, args.updates) < 1:
        ap.error("--threads, --repeats and --updates must be at least 1")
    runs: dict[str, list[list[int]]] = {name: [] for name in settings(args.threads)}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, (jobs, threads, policy) in settings(args.threads).items():
                runs[name].append(run_jobs(jobs, threads, policy, args.updates, Path(tmp)))
                print(f"repeat {repeat + 1}: {name}: {runs[name][-1]} tok/s", flush=True)
    totals = {name: statistics.median(map(sum, per)) for name, per in runs.items()}
    base = next(iter(totals.values()))
    rows = [[name, round(total), f"{total / base:.2f}x",
             " / ".join(str(round(statistics.median(job))) for job in zip(*runs[name]))]
            for name, total in totals.items()]
    title = (f"Training step of transformer-small, {os.cpu_count()} cores, medians of "
             f"{args.repeats} repeats")
    lines = [title, "",
             *markdown_table(["setting", "total tgt tok/s", "vs 1 job", "per job"], rows)]
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(
        {"cores": os.cpu_count(), "updates": args.updates, "runs": runs,
         "total_tok_per_s_median": totals}, indent=1))


if __name__ == "__main__":
    main()
