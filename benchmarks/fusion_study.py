"""The fusion paper's claims at convergence (issue 14): six systems x seeds, trained for the same
number of updates with the paper's settings, scored on averaged checkpoints with a paired
bootstrap test against the baseline.

    python benchmarks/fusion_study.py [--pairs de-en] [--seeds 1,2,3] [--updates 6000]
        [--size small|base] [--gate elementwise] [--systems baseline,...]
        [--workdir runs/fusion-study] [--threads 2] [--jobs 1] [--set section.key=value ...]
        [--report-only]
    python benchmarks/fusion_study.py --gate-throughput [--updates 60] [--size small]

Systems (every fusion on encoder and decoder unless named otherwise):

* baseline                -- the Transformer of ``--size``
* layer                   -- layer-wise fusion, f = mean (paper eqs. 7-9)
* sublayer                -- sub-layer-wise fusion, f = mean (eqs. 10-12)
* sublayer-linear         -- sub-layer-wise fusion, f = learned linear map
* sublayer-no-residual    -- sub-layer-wise fusion (mean) without residual connections
* decoder-sublayer        -- sub-layer-wise fusion (mean) in the decoder only

The paper's settings: Adam, lr 5e-4, inverse-sqrt schedule, betas (0.9, 0.99), eps 1e-9;
dropout 0.3, label smoothing 0.1, at most 5000 tokens per batch, beam 5. ``--size small`` is
3+3 x 256 (CPU; 1000 warm-up updates), ``base`` 6+6 x 512 (GPU; 4000). Every run trains exactly
``--updates`` updates, validates (loss) at each epoch end and is scored on the average of its
last 5 checkpoints (the last epoch ends and the final update). The baseline's validation loss over
the last fifth of the updates says whether it has plateaued: compare
``valid_loss_change_last_fifth`` across update counts.

Per pair: BLEU mean +- std over seeds, the paired tests of each seed's output against the
baseline with the same seed (sacrebleu's approximate randomization, two-sided, and its paired
bootstrap; p per seed) with a t-test of the differences over seeds and, for the paper's claims
between two fusion systems (``COMPARISONS``), against the other system, BLEU by source-length
bucket, parameters, tokens/s, the validation curves (drawn in WORKDIR/fusion_study-PAIR-valid.png)
and, for fusion systems, how much of the fusion the retention gates let through
(``fusion_gates.py`` on the averaged weights, recorded in each run's result).
``--gate-throughput`` instead trains sub-layer fusion with each gate form (elementwise, matrix,
scalar) and the baseline for ``--updates`` updates and reports parameters and tokens/s.
Results: WORKDIR/fusion_study.{json,md}. Finished runs (result.json) are reused and
interrupted ones resume from their newest checkpoint, so the study can run in parts. A run's
folder does not name its update count, gate or overrides: give a study with another
``--updates``, ``--gate`` or ``--set`` its own ``--workdir`` (in the same one it would train
over the other recipe's runs). Every finished run is also kept, without its checkpoints, in
``--keep``/PAIR-SIZE-UPDATES[-gate-G][-set-HASH]/SYSTEM-seedN.{json,hyp} (its result and test
translations, paths made portable); a fresh checkout or machine restores runs from there instead of
training them again. Commit that folder to carry a CPU study over several sessions.
``--report-only`` writes the tables from the finished and kept runs alone, while others are still
training: each system over the seeds it has (the "seeds" column). On a CPU, two runs at
once with a thread each (``--jobs 2 --threads 1`` on 2 cores) train 17 % more tokens/s in all
than one 2-thread run at a time (``benchmarks/cpu_sharing.py``).
"""

from __future__ import annotations

import argparse
import copy
import csv
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ablation import bleu_cell, mean_std, prepare_pair, raw_file
from multi30k import (
    PAIRS,
    ROOT,
    SHARED,
    cached_result,
    code_version,
    curves_figure,
    decode_device,
    experiment,
    markdown_table,
    same_recipe,
    set_threads,
    timed,
    write_run_config,
)
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from xinda.checkpoint import list_checkpoints
from xinda.config import apply_overrides
from xinda.evaluate.metrics import bleu_by_length, corpus_scores
from xinda.evaluate.significance import two_level_interval
from xinda.train.curves import read_log
from xinda.utils import read_lines

SIZES = {"small": ({"preset": "transformer-small"}, 1000),
         "base": ({"preset": "transformer-base"}, 4000)}  # model, warm-up updates
FUSION = {"fusion_side": "both", "fusion_function": "mean"}
SYSTEMS = {
    "baseline": {},
    "layer": {**FUSION, "fusion": "layer"},
    "sublayer": {**FUSION, "fusion": "sublayer"},
    "sublayer-linear": {**FUSION, "fusion": "sublayer", "fusion_function": "linear"},
    "sublayer-no-residual": {**FUSION, "fusion": "sublayer", "residual": False},
    "decoder-sublayer": {**FUSION, "fusion": "sublayer", "fusion_side": "decoder"},
}
# The paper's claims between two fusion systems (those against the baseline are the main table's
# "p vs baseline"): (system, reference, the claim that system > reference).
COMPARISONS = (("sublayer", "layer", "sub-layer fusion beats layer fusion"),
               ("sublayer", "sublayer-linear", "the arithmetic mean beats linear fusion"))
GATES = ("elementwise", "matrix", "scalar")
EDGES = (10, 20, 30, 50)  # source-length buckets; the paper's long-sentence claim is > 50 words
AVERAGE_LAST = 5


def paper_settings(cfg: dict, size: str, updates: int) -> dict:
    """The paper's optimiser, regularisation and batch size, for exactly ``updates`` updates."""
    cfg["model"] = {**SIZES[size][0], "dropout": 0.3}
    cfg["train"].update(lr=5e-4, schedule="inverse_sqrt", warmup_steps=SIZES[size][1],
                        betas=[0.9, 0.99], eps=1e-9, label_smoothing=0.1, max_tokens=5000,
                        max_steps=updates, max_seconds=0, run_validation=True, valid_bleu=False,
                        patience=0, keep_last=AVERAGE_LAST, save_every=0)
    cfg["decode"]["beam"] = 5
    return cfg


def run_config(pair: str, run_dir: Path, pair_dir: Path, model: dict, seed: int,
               args: argparse.Namespace) -> dict:
    cfg = paper_settings(experiment(PAIRS[pair], run_dir, 0, args.threads), args.size,
                         args.updates)
    cfg["data"]["out_dir"] = str(pair_dir / "data-bin")
    cfg["model"].update(copy.deepcopy(model))
    if model.get("fusion"):
        cfg["model"].setdefault("fusion_gate", args.gate)
    cfg["train"]["seed"] = seed
    apply_overrides(cfg, args.overrides)
    return cfg


def valid_curve(model_dir: Path) -> list[list[float]]:
    """[update, validation loss] at every epoch end."""
    rows = read_log(model_dir / "log.csv") if (model_dir / "log.csv").exists() else []
    return [[int(r["step"]), r["valid_loss"]] for r in rows if "valid_loss" in r]


def last_fifth_change(curve: list[list[float]]) -> float | None:
    """Relative change of the validation loss over the last fifth of the updates (< 0: still
    falling)."""
    if len(curve) < 2:
        return None
    end_step, end_loss = curve[-1]
    before = [loss for step, loss in curve if step <= 0.8 * end_step] or [curve[0][1]]
    return round((end_loss - before[-1]) / before[-1], 4)


def unfinished_run(run_dir: Path, cfg: dict) -> bool:
    """Whether ``run_dir`` holds checkpoints of an interrupted run with this very recipe (any
    thread count)."""
    cfg_path = run_dir / "config.yaml"
    return (cfg_path.exists() and same_recipe(yaml.safe_load(cfg_path.read_text()), cfg)
            and bool(list_checkpoints(run_dir / "model", verify=False)))


def code_versions(run_dir: Path, name: str = "code.txt", now: str | None = None) -> list[str]:
    """``now`` (default: ``git describe --always --dirty`` of this checkout, "unknown" outside
    one) appended to ``run_dir/name`` at every start or resume of the run; all of them,
    oldest first: the code a run trained with (or, ``speed.txt``, its threads × jobs), kept
    in its result (a cached result is reused whatever the code now is). A run resumed from
    before this record began lists only the later ones."""
    log = run_dir / name
    with log.open("a", encoding="utf-8") as f:
        f.write((now or code_version()) + "\n")
    return log.read_text(encoding="utf-8").splitlines()


def gpu_name() -> str | None:
    """The GPU the runs trained on (None without one): kept results say what they measured."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def train_and_score(pair: str, run_dir: Path, cfg: dict, threads: int, label: str,
                    runs_at_once: int = 1) -> dict:
    """Train, average the last checkpoints, translate the test set, score; cached.
    ``runs_at_once``: how many runs share the machine meanwhile (it qualifies the tok/s)."""
    result_path = run_dir / "result.json"
    if (result := cached_result(result_path, cfg, label)) is not None:
        print(f"{label}: cached, BLEU {result.get('bleu')}", flush=True)
        return result
    xinda, model_dir = [sys.executable, "-m", "xinda.cli"], run_dir / "model"
    resume = unfinished_run(run_dir, cfg)
    if not resume:
        shutil.rmtree(model_dir, ignore_errors=True)  # an earlier attempt with another config
        (run_dir / "code.txt").unlink(missing_ok=True)
        (run_dir / "speed.txt").unlink(missing_ok=True)
    cfg_path = write_run_config(run_dir, cfg)
    code = code_versions(run_dir)
    settings = code_versions(run_dir, "speed.txt", f"{threads} × {runs_at_once}")
    print(f"{label}: training {cfg['train']['max_steps']} updates"
          f"{' (resumed)' if resume else ''}", flush=True)
    train = timed([*xinda, "train", str(cfg_path), *(["--resume"] if resume else [])],
                  run_dir / "train.log", append=resume)
    stats = json.loads((model_dir / "train_stats.json").read_text())
    result = {"params": stats["parameters"], "updates": stats["steps"],
              "tok_per_s": round(stats["tgt_tok_per_s"], 1),
              "tok_per_s_median_window": window_tok_per_s(model_dir),
              "runs_at_once": runs_at_once, "speed_settings": sorted(set(settings)),
              "device": stats.get("device"),
              "precision": stats.get("precision"), "gpu": gpu_name(),
              "train_peak_rss_mb": round(train["peak_rss_mb"] or 0), "config": cfg,
              "code": code}
    if cfg["train"]["run_validation"]:
        # the checkpoints `xinda average --last N` takes: the newest N that verify
        result["averaged_checkpoints"] = [
            path.name for path in list_checkpoints(model_dir)[-AVERAGE_LAST:]]
        timed([*xinda, "average", str(model_dir), "--last", str(AVERAGE_LAST)],
              run_dir / "average.log")
        p = PAIRS[pair]
        test = SHARED / p["corpus"] / p["test"]
        hyp_path = run_dir / f"{p['test']}.hyp"
        timed([*xinda, "translate", str(model_dir), "-i", str(raw_file(test, p["src"])), "-o",
               str(hyp_path), "--threads", str(threads), *decode_device()],
              run_dir / "translate.log")
        hyps, refs = list(read_lines(hyp_path)), list(read_lines(raw_file(test, p["tgt"])))
        bleu, = corpus_scores(hyps, refs, metrics=("bleu",), tokenize=p["tokenize"])
        by_length = bleu_by_length(list(read_lines(raw_file(test, p["src"]))), hyps, refs,
                                   edges=EDGES, tokenize=p["tokenize"], unit=p["unit"])
        curve = valid_curve(model_dir)
        result.update(bleu=round(bleu.score, 2), bleu_signature=bleu.signature,
                      bleu_by_length=by_length, valid_curve=curve,
                      best_valid_loss=min((loss for _, loss in curve), default=None),
                      valid_loss_change_last_fifth=last_fifth_change(curve))
    result_path.write_text(json.dumps(result, indent=1))
    print(f"{label}: {result['updates']} updates, BLEU {result.get('bleu')}", flush=True)
    return result


def path_marks(work: Path) -> list[tuple[str, str]]:
    """(placeholder, absolute path) of the study's folder and the shared data, longest first."""
    return sorted([("$WORKDIR", str(work)), ("$SHARED", str(SHARED))], key=lambda m: -len(m[1]))


def portable(text: str, work: Path) -> str:
    """``text`` with the study's and the shared data's absolute paths as placeholders."""
    for mark, path in path_marks(work):
        text = text.replace(path, mark)
    return text


def localised(text: str, work: Path) -> str:
    """The inverse of :func:`portable` on this machine."""
    for mark, path in path_marks(work):
        text = text.replace(mark, path)
    return text


def kept_files(keep: Path, pair: str, system: str, seed: int,
               args: argparse.Namespace) -> tuple[Path, Path]:
    """Where a finished run's result and test translations are kept: (json, hyp). Another
    gate or ``--set`` overrides name their own folder (the paper's recipe has none)."""
    study = f"{pair}-{args.size}-{args.updates}"
    if args.gate != "elementwise":
        study += f"-gate-{args.gate}"
    if args.overrides:
        study += "-set-" + hashlib.sha1("\n".join(args.overrides).encode()).hexdigest()[:8]
    stem = keep / study / f"{system}-seed{seed}"
    return stem.parent / f"{stem.name}.json", stem.parent / f"{stem.name}.hyp"


def restore_kept(run_dir: Path, kept: tuple[Path, Path], hyp_name: str, work: Path,
                 cfg: dict) -> bool:
    """Put a kept run of recipe ``cfg`` into ``run_dir`` unless that holds a finished run of
    this recipe already (one of another, e.g. another ``--updates``, is replaced); whether it
    did."""
    kept_json, kept_hyp = kept
    if not kept_json.exists() or (
            (done := run_dir / "result.json").exists()
            and same_recipe(json.loads(done.read_text()).get("config"), cfg)):
        return False
    text = localised(kept_json.read_text(), work)
    try:
        kept_cfg = json.loads(text).get("config")
    except json.JSONDecodeError as e:
        raise SystemExit(f"{kept_json}: not a kept run's result ({e}); fix or delete it") from e
    if not same_recipe(kept_cfg, cfg):
        print(f"{kept_json}: kept with another recipe, not used", flush=True)
        return False
    run_dir.mkdir(parents=True, exist_ok=True)
    if kept_hyp.exists():
        shutil.copyfile(kept_hyp, run_dir / hyp_name)
    (run_dir / "result.json").write_text(text)
    return True


def keep_finished(run_dir: Path, kept: tuple[Path, Path], hyp_name: str, work: Path) -> None:
    """Copy a finished run's result.json and test translations (not its checkpoints) to ``kept``."""
    kept_json, kept_hyp = kept
    kept_json.parent.mkdir(parents=True, exist_ok=True)
    if (run_dir / hyp_name).exists():
        shutil.copyfile(run_dir / hyp_name, kept_hyp)
    kept_json.write_text(portable((run_dir / "result.json").read_text(), work))


def run_all(pair: str, pair_dir: Path, systems: list[str], seeds: list[int],
            args: argparse.Namespace) -> dict[str, dict[int, dict]]:
    """Every (system, seed) run of a pair, ``args.jobs`` at a time (several runs share one GPU
    well), started seed-major: a slow spell of the machine hits every system alike. Runs kept
    in ``args.keep`` are restored instead of trained; finished runs are kept there. With
    ``args.report_only`` nothing is trained: unfinished runs are left out (a system without a
    finished run too)."""
    work, hyp_name = args.workdir.resolve(), f"{PAIRS[pair]['test']}.hyp"

    def one(system: str, seed: int) -> dict | None:
        run_dir, label = pair_dir / system / f"seed{seed}", f"[{pair}] {system} seed {seed}"
        cfg = run_config(pair, run_dir, pair_dir, SYSTEMS[system], seed, args)
        kept = kept_files(args.keep, pair, system, seed, args)
        if restore_kept(run_dir, kept, hyp_name, work, cfg):
            print(f"{label}: restored from {kept[0]}", flush=True)
        if args.report_only:
            if (result := cached_result(run_dir / "result.json", cfg, label)) is None:
                print(f"{label}: no finished run of this recipe, left out of the report",
                      flush=True)
                return None
        else:
            result = train_and_score(pair, run_dir, cfg, args.threads, label, args.jobs)
        add_window_speed(run_dir, result)
        add_gates(pair, run_dir, result)
        keep_finished(run_dir, kept, hyp_name, work)
        return result

    with ThreadPoolExecutor(args.jobs) as pool:
        started = {(system, seed): pool.submit(one, system, seed)
                   for seed in seeds for system in systems}
        runs: dict[str, dict[int, dict]] = {s: {} for s in systems}
        for (system, seed), future in started.items():
            if (result := future.result()) is not None:
                runs[system][seed] = result
    return {system: by_seed for system, by_seed in runs.items() if by_seed}


def paired_p(pair: str, baseline_dir: Path, system_dir: Path,
             expected: tuple[float, float] | None = None) -> dict[str, float] | None:
    """The p values of system against baseline: "ar", sacreBLEU's paired approximate
    randomization (10,000 trials; two-sided) and "bs", its paired bootstrap (1000 resamples;
    its statistic |d*| - mean|d*| > |d| is close to a one-sided test once |d| is large, and
    cannot go much above 0.5). None when either run's test translations are missing, or (with
    ``expected``, the two results' BLEU) when they score otherwise: another run's."""
    p = PAIRS[pair]
    hyp_paths = [d / f"{p['test']}.hyp" for d in (baseline_dir, system_dir)]
    if missing := [h for h in hyp_paths if not h.exists()]:
        print(f"[{pair}] no paired test: {', '.join(map(str, missing))} missing", flush=True)
        return None
    refs = list(read_lines(raw_file(SHARED / p["corpus"] / p["test"], p["tgt"])))
    hyps = [list(read_lines(h)) for h in hyp_paths]
    metric = BLEU(tokenize=p["tokenize"]) if p["tokenize"] else BLEU()
    systems = list(zip(("baseline", "system"), hyps))
    p_values = {}
    for test, samples in (("ar", 10000), ("bs", 1000)):
        _, results = PairedTest(systems, {"BLEU": metric}, [refs], test_type=test,
                                n_samples=samples)()
        scores = tuple(round(r.score, 2) for r in results["BLEU"])
        if expected is not None and any(abs(a - b) > 0.011 for a, b in zip(scores, expected)):
            print(f"[{pair}] no paired test: {', '.join(map(str, hyp_paths))} score {scores}, "
                  f"not the results' {expected}", flush=True)
            return None
        p_values[test] = round(results["BLEU"][1].p_value, 4)
    return p_values


def two_level(pair: str, pair_dir: Path, systems: tuple[str, str], runs: dict
              ) -> list[float] | None:
    """The two-level bootstrap interval (seeds and test sentences resampled,
    ``two_level_interval``) of the mean BLEU difference ``systems[1]`` - ``systems[0]`` over
    the seeds both ran; None with fewer than 3 (resampling 2 runs draws only 3 distinct sets:
    a run level that says nothing), or when a run's translations are missing or score
    otherwise than its result (another run's)."""
    p = PAIRS[pair]
    seeds = [s for s in sorted(runs.get(systems[1], {})) if s in runs.get(systems[0], {})]
    hyps = {(name, s): pair_dir / name / f"seed{s}" / f"{p['test']}.hyp"
            for s in seeds for name in systems}
    if len(seeds) < 3 or not all(path.exists() for path in hyps.values()):
        return None
    refs = list(read_lines(raw_file(SHARED / p["corpus"] / p["test"], p["tgt"])))
    lines = {key: list(read_lines(path)) for key, path in hyps.items()}
    for (name, s), out in lines.items():
        score = corpus_scores(out, refs, ("bleu",), p["tokenize"])[0].score
        if abs(round(score, 2) - runs[name][s]["bleu"]) > 0.011:
            return None
    found = [(lines[systems[0], s], lines[systems[1], s]) for s in seeds]
    return [round(x, 3) for x in two_level_interval(found, [refs], p["tokenize"])]


def seed_level(deltas: list[float]) -> dict | None:
    """A paired t-test over seeds of the same-seed BLEU differences: their mean, its 95 %
    confidence interval and the two-sided p (seed-to-seed variance, which the per-seed tests
    of the test set's sampling leave out); None with fewer than 2 seeds."""
    from scipy import stats

    if len(deltas) < 2:
        return None
    mean, sem = statistics.fmean(deltas), statistics.stdev(deltas) / len(deltas) ** 0.5
    if sem == 0:
        return {"mean": round(mean, 3), "ci95": [round(mean, 3)] * 2, "p": None}
    half = stats.t.ppf(0.975, len(deltas) - 1) * sem
    return {"mean": round(mean, 3), "ci95": [round(mean - half, 3), round(mean + half, 3)],
            "p": round(float(stats.ttest_1samp(deltas, 0.0).pvalue), 4)}


def window_tok_per_s(model_dir: Path) -> float | None:
    """The median of the tokens/s of the training log's windows (``log.csv``, one row per
    ``train.log_every`` updates): a window in which the run was stopped (SIGSTOP) or the
    machine busy moves the run's total tokens/s, not this median. None without a log."""
    log = model_dir / "log.csv"
    if not log.exists():
        return None
    rows = list(csv.DictReader(log.open(encoding="utf-8")))
    speeds = [float(r["tok_per_s"]) for r in rows if r.get("tok_per_s")]
    return round(statistics.median(speeds), 1) if speeds else None


def last_logged_step(model_dir: Path) -> int | None:
    """The update of the training log's last row (None without a log)."""
    log = model_dir / "log.csv"
    if not log.exists():
        return None
    rows = list(csv.DictReader(log.open(encoding="utf-8")))
    return int(rows[-1]["step"]) if rows else None


def add_window_speed(run_dir: Path, result: dict) -> None:
    """Give a finished run's result (and its result.json) the median window tokens/s when it
    lacks one and its training log is still there (runs finished before it was recorded)."""
    if result.get("tok_per_s_median_window") is not None:
        return
    if last_logged_step(run_dir / "model") != result.get("updates"):  # not this run's log
        return
    if (speed := window_tok_per_s(run_dir / "model")) is not None:
        result["tok_per_s_median_window"] = speed
        (run_dir / "result.json").write_text(json.dumps(result, indent=1))


GATE_LINES = 500  # validation pairs the retention gates are measured on


def add_gates(pair: str, run_dir: Path, result: dict) -> None:
    """Give a finished fusion run's result (and its result.json) its retention gates'
    statistics (``fusion_gates.py``: mean g per fusion point on the first ``GATE_LINES``
    validation pairs, averaged weights) when it lacks them and this very run's weights are
    still there (its validation curve is the result's); kept runs restored without
    checkpoints go without. A failed measurement is said and leaves the result as it was."""
    model_dir, cfg, config = run_dir / "model", result.get("config") or {}, run_dir / "config.yaml"
    if ("gates" in result or cfg.get("model", {}).get("fusion", "none") == "none"
            or not (model_dir / "averaged.safetensors").exists() or not config.exists()
            or not same_recipe(yaml.safe_load(config.read_text()), cfg)
            or not result.get("valid_curve") or valid_curve(model_dir) != result["valid_curve"]):
        return
    p, out = PAIRS[pair], run_dir / "gates.json"
    valid = SHARED / p["corpus"] / "valid"
    cmd = [sys.executable, str(Path(__file__).with_name("fusion_gates.py")), str(model_dir),
           "--checkpoint", str(model_dir / "averaged.safetensors"),
           "--src", str(raw_file(valid, p["src"])), "--tgt", str(raw_file(valid, p["tgt"])),
           "--lines", str(GATE_LINES), "--json", str(out), *decode_device()]
    with open(run_dir / "gates.log", "w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode:
        print(f"{run_dir}: measuring the gates failed (see gates.log); left without",
              flush=True)
        return
    result["gates"] = json.loads(out.read_text())["gates"]
    (run_dir / "result.json").write_text(json.dumps(result, indent=1))


def gate_means(by_seed: dict) -> dict | None:
    """Mean g and mean cos(current, fusion) per side over fusion points and the seeds that
    measured them: {"sides": {"encoder": [g, cos], ...}, "seeds": [...]}; None when no seed
    did."""
    sides: dict[str, list[list[float]]] = {}
    seeds = sorted(seed for seed, result in by_seed.items() if result.get("gates"))
    for seed in seeds:
        for row in by_seed[seed]["gates"]:
            side = row["point"].split()[0]
            sides.setdefault(side, [[], []])
            sides[side][0].append(row["mean_g"])
            sides[side][1].append(row["mean_cos_current_fusion"])
    if not seeds:
        return None
    return {"sides": {side: [statistics.fmean(g), statistics.fmean(c)]
                      for side, (g, c) in sides.items()}, "seeds": seeds}


def gates_cell(means: dict | None) -> str:
    """'enc 0.48 (cos 0.62) / dec 0.46 (cos 0.35), seeds 2, 3'; '–' without measurements."""
    if not means:
        return "–"
    sides = [f"{side[:3]} {g:.2f} (cos {c:.2f})" for side, (g, c) in means["sides"].items()]
    return " / ".join(sides) + f", seed{'s' * (len(means['seeds']) > 1)} " + ", ".join(
        map(str, means["seeds"]))


def run_speed(result: dict) -> float:
    """A run's training tokens/s: the median log window where known, else the total."""
    return result.get("tok_per_s_median_window") or result["tok_per_s"]


def speed_setting(result: dict) -> str:
    """How a run's tok/s was measured: "threads × jobs" (the study's ``--threads`` and
    ``--jobs``: the runs this process trained at once, not other work on the machine; 1 for
    older results; "mixed" for a run resumed with other ones), and whether it is the median
    log window or the whole run's total."""
    kind = "median window" if result.get("tok_per_s_median_window") else "total"
    if len(settings := result.get("speed_settings", [])) > 1:  # resumed with other settings:
        return f"mixed {' / '.join(settings)}, {kind}"  # compared with nothing
    return f"{result['config']['train']['threads']} × {result.get('runs_at_once', 1)}, {kind}"


def speeds_by_setting(by_seed: dict) -> dict[str, int]:
    """Mean tok/s of a system's seeds per measurement setting (``speed_setting``): speeds
    taken with other threads or jobs are not averaged together."""
    found: dict[str, list[float]] = {}
    for result in by_seed.values():
        found.setdefault(speed_setting(result), []).append(run_speed(result))
    return {setting: round(statistics.fmean(v)) for setting, v in found.items()}


def paired_with_baseline(by_seed: dict, baseline: dict) -> dict:
    """A system against the baseline on the seeds both ran: the mean BLEU difference, and the
    mean tok/s ratio over those of them measured in the same setting (None where none)."""
    seeds = [s for s in sorted(by_seed) if s in baseline]
    if not seeds:
        return {"seeds": [], "bleu_difference": None, "speed_ratio": None}
    same = [s for s in seeds if speed_setting(by_seed[s]) == speed_setting(baseline[s])]
    ratio = statistics.fmean(run_speed(by_seed[s]) / run_speed(baseline[s])
                             for s in same) if same else None
    delta = statistics.fmean(by_seed[s]["bleu"] - baseline[s]["bleu"] for s in seeds)
    return {"seeds": seeds, "bleu_difference": round(delta, 2),
            "speed_ratio": None if ratio is None else round(ratio, 3), "speed_seeds": same}


def seed_delta(runs: dict, systems: tuple[str, str], seed: int) -> float | None:
    """BLEU of ``systems[1]`` minus ``systems[0]`` at ``seed`` (None unless both ran it)."""
    reference, system = (runs.get(name, {}).get(seed) for name in systems)
    return None if reference is None or system is None else round(
        system["bleu"] - reference["bleu"], 2)


def seed_deltas(runs: dict, systems: tuple[str, str]) -> list[float]:
    """The same-seed BLEU differences of ``systems[1]`` minus ``systems[0]``, by seed."""
    found = (seed_delta(runs, systems, s) for s in sorted(runs.get(systems[1], {})))
    return [d for d in found if d is not None]


def seed_test(pair: str, pair_dir: Path, systems: tuple[str, str], runs: dict,
              seed: int) -> dict[str, float] | None:
    """The paired p values (``paired_p``) of ``systems[1]`` against ``systems[0]`` at ``seed``,
    on the translations of the two results reported (None unless both ran it)."""
    reference, system = (runs.get(name, {}).get(seed) for name in systems)
    if reference is None or system is None:
        return None
    return paired_p(pair, pair_dir / systems[0] / f"seed{seed}",
                    pair_dir / systems[1] / f"seed{seed}", (reference["bleu"], system["bleu"]))


def summarise(pair: str, pair_dir: Path, runs: dict) -> list[dict]:
    """One row per system over the seeds it ran; its p values are per seed, against the
    baseline's run with the same seed."""
    rows = []
    for system, by_seed in runs.items():
        bleu_mean, bleu_std = mean_std([r["bleu"] for r in by_seed.values()])
        buckets: dict[str, list[float]] = {}
        for r in by_seed.values():
            for b in r["bleu_by_length"]:
                buckets.setdefault(f"{b['bucket']} ({b['sentences']})", []).append(b["bleu"])
        rows.append({
            "system": system, "params": next(iter(by_seed.values()))["params"],
            "seeds": sorted(by_seed), "bleu_mean": bleu_mean, "bleu_std": bleu_std,
            "p_vs_baseline": None if system == "baseline" else [
                seed_test(pair, pair_dir, ("baseline", system), runs, s) for s in sorted(by_seed)],
            "delta_vs_baseline": None if system == "baseline" else [
                seed_delta(runs, ("baseline", system), s) for s in sorted(by_seed)],
            "seed_level_vs_baseline": None if system == "baseline" else seed_level(
                seed_deltas(runs, ("baseline", system))),
            "two_level_vs_baseline": None if system == "baseline" else two_level(
                pair, pair_dir, ("baseline", system), runs),
            "tok_per_s_by_setting": speeds_by_setting(by_seed),
            "vs_baseline": None if system == "baseline" else paired_with_baseline(
                by_seed, runs.get("baseline", {})),
            "updates": sorted({r["updates"] for r in by_seed.values() if "updates" in r}),
            "best_valid_loss": round(statistics.fmean(r["best_valid_loss"]
                                                      for r in by_seed.values()), 3),
            "valid_loss_change_last_fifth": [r["valid_loss_change_last_fifth"]
                                             for r in by_seed.values()],
            "gates": gate_means(by_seed),
            "bleu_by_length": {k: round(statistics.fmean(v), 2) for k, v in buckets.items()}})
    return rows


def compare(pair: str, pair_dir: Path, runs: dict, seeds: list[int]) -> list[dict]:
    """Each of the paper's ``COMPARISONS`` whose two systems both ran: the mean BLEU difference
    (system - reference) and, per seed, the paired bootstrap p of system against reference."""
    found = []
    for system, reference, claim in COMPARISONS:
        if system not in runs or reference not in runs:
            continue
        both = [s for s in seeds if s in runs[system] and s in runs[reference]]
        if not both:
            continue
        delta = statistics.fmean(runs[system][s]["bleu"] - runs[reference][s]["bleu"]
                                 for s in both)
        found.append({"claim": claim, "system": system, "reference": reference,
                      "bleu_difference": round(delta, 2), "seeds": both,
                      "delta": [seed_delta(runs, (reference, system), s) for s in both],
                      "p": [seed_test(pair, pair_dir, (reference, system), runs, s)
                            for s in both],
                      "seed_level": seed_level(seed_deltas(runs, (reference, system))),
                      "two_level": two_level(pair, pair_dir, (reference, system), runs)})
    return found


def p_text(p: dict[str, float] | float | None) -> str:
    """"AR p, bs p" of ``paired_p`` ("n/a" where the test could not run); a p at its floor,
    1 / (samples + 1), as "<= floor"."""
    if p is None:
        return "n/a"
    if not isinstance(p, dict):  # a report of a study written before the AR test
        return f"bs {p}"
    floors = {"ar": 1 / 10001, "bs": 1 / 1001}
    return ", ".join(f"{test} ≤ {floors[test]:.2g}" if value <= floors[test] + 1e-6 else
                     f"{test} {value}" for test, value in p.items())


def p_cell(ps: list, deltas: list[float | None] | None = None) -> str:
    """Per-seed p values (``p_text``), after each seed's BLEU difference when given: the sign
    says which way the seed went."""
    deltas = deltas or [None] * len(ps)
    return " / ".join(p_text(p) if d is None else f"{d:+.2f} ({p_text(p)})"
                      for p, d in zip(ps, deltas))


def seed_level_cell(test: dict | None, two: list[float] | None = None) -> str:
    """The seed-level t-test: mean difference [95 % CI], p; then the two-level bootstrap
    interval (seeds and sentences) where there is one."""
    if test is None:
        return "–"
    low, high = test["ci95"]
    p = "n/a" if test["p"] is None else test["p"]
    both = "" if two is None else f"; seeds & sentences [{two[0]:+.2f}, {two[1]:+.2f}]"
    return f"{test['mean']:+.2f} [{low:+.2f}, {high:+.2f}], p {p}{both}"


def comparisons_markdown(found: list[dict]) -> list[str]:
    body = [[c["claim"], f"{c['system']} − {c['reference']}", ", ".join(map(str, c["seeds"])),
             f"{c['bleu_difference']:+.2f}", p_cell(c["p"], c.get("delta")),
             seed_level_cell(c.get("seed_level"), c.get("two_level"))] for c in found]
    header = ["the paper's claim", "BLEU difference", "seeds (both systems)",
              "mean difference over those seeds", "difference (p) per seed",
              "over seeds: mean [95 % CI], p"]
    return ["", "Between fusion systems:", "", *markdown_table(header, body)] if found else []


NOTES = ("BLEU: mean ± sample standard deviation over seeds. Per seed, the system's test "
         "translations against the other system's with the same seed: ar, sacreBLEU's paired "
         "approximate randomization (10,000 trials), two-sided; bs, sacreBLEU's paired "
         "bootstrap (1000 resamples), whose statistic is close to a one-sided test once |ΔBLEU| "
         "is large (about half the two-sided p) and cannot go much above 0.5. 'Over seeds': a "
         "paired t-test of the same-seed differences (seed-to-seed variance, which the "
         "per-seed tests leave out; on this one test set, so without its sampling variance, "
         "which the per-seed tests hold), then 'seeds & sentences', the 95 % interval of the "
         "mean difference when seeds and test sentences are both resampled (1000 two-level "
         "bootstrap samples, xinda.evaluate.significance.two_level_interval), which holds "
         "both. The columns 'best valid loss', 'train tok/s' and 'BLEU "
         "<bucket>' are means over the system's own seeds (the 'seeds' column). Δ vs baseline and "
         "the speed ratio pair each seed with the baseline's same seed (speed: only seeds "
         "measured with the same threads × jobs). tok/s: per setting, threads × --jobs (the "
         "runs this study process trained at once; other work on the machine, such as tests "
         "or another study, is not recorded). Every run is scored on the average of its "
         "last 5 checkpoints; 'best valid loss' is the minimum of its curve, not necessarily "
         "that checkpoint's. 'mean gate g (cos)': per stack, the retention gate's mean g (the "
         "weight of the fusion in LN((1 - g)·current + g·fusion)) over its fusion points, on "
         "the first 500 validation pairs, and the mean cosine of the two vectors it mixes "
         "(benchmarks/fusion_gates.py); over the seeds whose weights were there to measure, "
         "'–' for the others.")


def vs_baseline_cells(r: dict) -> list[str]:
    """The "Δ BLEU vs baseline" and "tok/s vs baseline" cells of a system's row."""
    paired = r.get("vs_baseline")
    if not paired or not paired["seeds"]:
        return ["–", "–"]
    seeds = ", ".join(map(str, paired["seeds"]))
    ratio, speed_seeds = paired["speed_ratio"], paired.get("speed_seeds", paired["seeds"])
    return [f"{paired['bleu_difference']:+.2f} (seeds {seeds})",
            "–" if ratio is None else f"{ratio:.2f}× (seeds {', '.join(map(str, speed_seeds))})"]


def markdown(pair: str, rows: list[dict], args: argparse.Namespace,
             found: list[dict] = ()) -> str:
    buckets = list(rows[0]["bleu_by_length"]) if rows else []
    header = ["system", "params", "seeds", "BLEU (mean ± std)", "Δ BLEU vs baseline",
              "Δ (p) vs baseline per seed", "Δ over seeds: mean [95 % CI], p",
              "train tok/s (threads × jobs, how)",
              "tok/s vs baseline", "best valid loss", "valid loss change, last fifth",
              "mean gate g (cos)", *(f"BLEU {b}" for b in buckets)]
    body = [[r["system"], f"{r['params']:,}", ", ".join(map(str, r.get("seeds", []))),
             bleu_cell(r["bleu_mean"], r["bleu_std"]), vs_baseline_cells(r)[0],
             "–" if r["p_vs_baseline"] is None else p_cell(r["p_vs_baseline"],
                                                            r.get("delta_vs_baseline")),
             seed_level_cell(r.get("seed_level_vs_baseline"), r.get("two_level_vs_baseline")),
             " / ".join(f"{v} ({k})" for k, v in r["tok_per_s_by_setting"].items()),
             vs_baseline_cells(r)[1], r["best_valid_loss"],
             " / ".join(f"{c:+.2%}" for c in r["valid_loss_change_last_fifth"] if c is not None),
             gates_cell(r.get("gates")), *(r["bleu_by_length"].get(b, "–") for b in buckets)]
            for r in rows]
    updates = sorted({u for r in rows for u in r.get("updates", [])})
    other = [u for u in updates if u != args.updates]
    title = (f"### {pair}: {args.size}, {args.updates} updates, gate {args.gate}, seeds "
             f"{args.seeds}"
             + "".join(f", --set {o}" for o in args.overrides)
             + f"; BLEU by source length in {PAIRS[pair]['unit']} (sentences)"
             + (f" -- WARNING: some runs trained {other} updates" if other else ""))
    return "\n".join([title, "", *markdown_table(header, body), "", NOTES,
                      *comparisons_markdown(found)])


def plot_valid_curves(runs: dict, png: Path, title: str) -> None:
    """Validation loss against updates, one line per system and seed (the plateau check)."""
    with curves_figure(png, title, "update", "validation loss per token (label-smoothed)",
                       size=(8, 4.5)) as ax:
        for i, (system, by_seed) in enumerate(runs.items()):
            for seed, result in by_seed.items():
                if result.get("valid_curve"):
                    steps, losses = zip(*result["valid_curve"])
                    ax.plot(steps, losses, color=f"C{i}", lw=2 if system == "baseline" else 1,
                            label=system if seed == min(by_seed) else None)


def gate_throughput(pair: str, pair_dir: Path, args: argparse.Namespace) -> list[dict]:
    """Parameters and tokens/s of the baseline and of sub-layer fusion with each gate form."""
    variants = {"baseline": {}, **{f"sublayer-{g}": {**SYSTEMS["sublayer"], "fusion_gate": g}
                                   for g in GATES}}
    rows = []
    for name, model in variants.items():
        run_dir = pair_dir / "gate-throughput" / name
        cfg = run_config(pair, run_dir, pair_dir, model, 1, args)
        cfg["train"]["run_validation"] = False
        r = train_and_score(pair, run_dir, cfg, args.threads, f"[{pair}] {name}")
        add_window_speed(run_dir, r)
        rows.append({"system": name, "params": r["params"], "tok_per_s": run_speed(r)})
    return rows


def gate_markdown(pair: str, rows: list[dict], args: argparse.Namespace) -> str:
    body = [[r["system"], f"{r['params']:,}", r["tok_per_s"]] for r in rows]
    return "\n".join([f"### {pair}: gate forms, {args.size}, {args.updates} updates", "",
                      *markdown_table(["system", "params", "train tok/s"], body)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", default="de-en", help=f"of {','.join(PAIRS)}")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {','.join(SYSTEMS)}")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--updates", type=int, help="updates of every run (6000; with "
                    "--gate-throughput 60)")
    ap.add_argument("--size", choices=SIZES, default="small")
    ap.add_argument("--gate", choices=GATES, default="elementwise")
    ap.add_argument("--gate-throughput", action="store_true")
    ap.add_argument("--workdir", type=Path, default=ROOT / "runs" / "fusion-study")
    ap.add_argument("--keep", type=Path, default=ROOT / "docs" / "results" / "fusion-study",
                    help="where finished runs' results and translations are kept and restored")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of each run")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (on a GPU: several)")
    ap.add_argument("--report-only", action="store_true",
                    help="train nothing: report the finished (or kept) runs, leave out the rest")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    metavar="SECTION.KEY=VALUE", help="override every run's recipe")
    args = ap.parse_args()
    pairs, systems = args.pairs.split(","), args.systems.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    unknown = [p for p in pairs if p not in PAIRS] + [s for s in systems if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown pair/system: {', '.join(unknown)}")
    if args.jobs < 1 or args.threads < 1:
        ap.error("--jobs and --threads must be at least 1")
    if args.gate_throughput and args.report_only:
        ap.error("--gate-throughput trains its runs: not with --report-only")
    args.updates = args.updates or (60 if args.gate_throughput else 6000)
    if "baseline" not in systems:
        systems.insert(0, "baseline")  # the paired tests need it
    set_threads(args.threads, args.jobs)
    work = args.workdir.resolve()
    report, tables = {"args": {k: str(v) for k, v in vars(args).items()}, "pairs": {}}, []
    for pair in pairs:
        if not (SHARED / PAIRS[pair]["corpus"]).is_dir():
            print(f"[{pair}] skipped: {SHARED / PAIRS[pair]['corpus']} not found", flush=True)
            continue
        pair_dir = work / pair / args.size
        if not args.report_only:
            prepare_pair(pair, pair_dir, 0, args.threads, args.overrides)
        if args.gate_throughput:
            report["pairs"][pair] = {"gates": gate_throughput(pair, pair_dir, args)}
            tables.append(gate_markdown(pair, report["pairs"][pair]["gates"], args))
            continue
        runs = run_all(pair, pair_dir, systems, seeds, args)
        rows = summarise(pair, pair_dir, runs)
        found = compare(pair, pair_dir, runs, seeds)
        missing = [f"{s} seed {seed}" for s in systems for seed in seeds
                   if seed not in runs.get(s, {})]
        report["pairs"][pair] = {"summary": rows, "comparisons": found, "missing": missing,
                                 "runs": {s: {seed: {k: v for k, v in r.items() if k != "config"}
                                              for seed, r in by.items()}
                                          for s, by in runs.items()}}
        tables.append(markdown(pair, rows, args, found)
                      + (f"\n\nNot finished, left out: {', '.join(missing)}." if missing else ""))
        print("\n" + tables[-1] + "\n", flush=True)
        plot_valid_curves(runs, work / f"fusion_study-{pair}-valid.png",
                          f"{pair}, {args.size}, {args.updates} updates, seeds {args.seeds}")
    if not report["pairs"]:
        sys.exit(f"fusion_study: no data for {args.pairs} under {SHARED}: nothing to report")
    name = "fusion_study_gates" if args.gate_throughput else "fusion_study"
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{name}.json").write_text(json.dumps(report, indent=1))
    (work / f"{name}.md").write_text("\n\n".join(tables) + "\n")
    print(f"wrote {work / name}.json and .md")


if __name__ == "__main__":
    main()
