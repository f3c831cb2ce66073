"""The pure helpers of the benchmark scripts: stability verdicts and ablation summaries."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from xinda.checkpoint import save_checkpoint
from xinda.errors import XindaError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import ablation
import deep_stability
import fusion_study
import gpu_throughput
import multi30k
import progressive
import train_memory


def write_targets(data_bin: Path, sentences: list[list[int]]) -> None:
    ids = np.array([t for s in sentences for t in s], dtype=np.int32)
    offsets = np.cumsum([0] + [len(s) for s in sentences])
    np.save(data_bin / "train.tgt.ids.npy", ids)
    np.save(data_bin / "train.tgt.offsets.npy", offsets)


def test_unigram_floor_is_the_entropy_of_token_frequencies(tmp_path):
    # tokens 0,0,1 and one end-of-sentence: frequencies 1/2, 1/4, 1/4
    write_targets(tmp_path, [[0, 0, 1]])
    expected = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert deep_stability.unigram_floor(tmp_path, 0.0) == pytest.approx(expected)


def test_unigram_floor_with_label_smoothing_mixes_in_the_uniform(tmp_path):
    write_targets(tmp_path, [[0, 0], [1]])  # 0,0,1 + two ends: 2/5, 1/5, 2/5
    eps, p = 0.1, np.array([0.4, 0.2, 0.4])
    t = (1 - eps) * p + eps / 3
    assert deep_stability.unigram_floor(tmp_path, eps) == pytest.approx(-(t * np.log(t)).sum())
    assert deep_stability.unigram_floor(tmp_path, eps) > deep_stability.unigram_floor(tmp_path, 0)


@pytest.mark.parametrize("final, verdict", [(4.0, "trains"), (6.0, "stalls"), (5.0, "stalls"),
                                            (math.nan, "diverges"), (math.inf, "diverges")])
def test_stability_verdict(final, verdict):
    assert deep_stability.verdict(final, floor=5.0) == verdict


def run(system: str, seed: int, bleu: float, curve: list[list[float]]) -> dict:
    return {"system": system, "seed": seed, "params": 10, "bleu": bleu, "updates": curve[-1][0],
            "tok_per_s": 100.0, "train_curve": curve,
            "bleu_by_length": [{"bucket": "1-10", "sentences": 3, "bleu": bleu}]}


def test_ablation_compares_losses_at_the_latest_update_every_run_reached():
    runs = [run("a", 1, 20.0, [[100, 6.0], [200, 5.0], [300, 4.0]]),
            run("a", 2, 22.0, [[100, 6.2], [200, 5.2]]),
            run("b", 1, 30.0, [[100, 5.0], [200, 4.0], [300, 3.0], [400, 2.0]])]
    assert ablation.common_update(runs) == 200
    rows = {r["system"]: r for r in ablation.summarise(runs, ["a", "b"])}
    assert rows["a"]["loss_at_update"] == rows["b"]["loss_at_update"] == 200
    assert rows["a"]["loss_at"] == pytest.approx(5.1)
    assert rows["b"]["loss_at"] == pytest.approx(4.0)
    assert (rows["a"]["bleu_mean"], rows["a"]["bleu_std"]) == (21.0, 1.41)  # rounded to 0.01
    assert rows["b"]["bleu_std"] is None  # one seed: no deviation, not a zero one


def test_bleu_cell_shows_a_deviation_only_where_there_are_seeds_to_deviate():
    assert ablation.bleu_cell(*ablation.mean_std([40.0, 41.0, 42.5])) == "41.17 ± 1.26"
    assert ablation.bleu_cell(*ablation.mean_std([40.39])) == "40.39 (one seed)"


def test_ablation_without_logged_losses_has_no_common_update():
    assert ablation.common_update([run("a", 1, 1.0, [[0, 1.0]]) | {"train_curve": []}]) is None


def test_train_memory_summary_takes_medians_per_variant_and_ratios():
    runs = [{"variant": v, "peak_rss_mb": rss, "tgt_tok_per_s": tok, "tgt_tok_per_cpu_s": tok / 2}
            for v, rss, tok in [("A", 3000, 1000), ("B", 1000, 2000), ("A", 2000, 3000),
                                ("B", 1500, 2500), ("A", 2500, 2000), ("B", 1200, 4000)]]
    result = train_memory.summary(runs)
    assert result["median"]["A"] == {"peak_rss_mb": 2500, "tgt_tok_per_s": 2000,
                                     "tgt_tok_per_cpu_s": 1000}
    assert result["median"]["B"]["peak_rss_mb"] == 1200
    assert result["b_over_a"] == {"peak_rss_mb": 0.48, "tgt_tok_per_s": 1.25,
                                  "tgt_tok_per_cpu_s": 1.25}


def test_fusion_study_last_fifth_change_compares_the_end_with_the_loss_at_80_percent():
    curve = [[100, 5.0], [400, 4.0], [800, 3.0], [900, 2.9], [1000, 2.85]]
    assert fusion_study.last_fifth_change(curve) == pytest.approx(-0.05)  # 3.0 -> 2.85
    assert fusion_study.last_fifth_change([[10, 2.0]]) is None


def test_fusion_study_records_the_code_of_every_start_and_resume(tmp_path):
    """Before: only the last session's checkout, which said nothing of the updates before a
    resume (found by review)."""
    first = fusion_study.code_versions(tmp_path)
    again = fusion_study.code_versions(tmp_path)
    assert len(first) == 1 and again == first * 2 and first[0]


def test_fusion_study_runs_with_the_papers_settings_and_the_chosen_gate():
    args = argparse.Namespace(threads=1, size="small", updates=300, gate="scalar", overrides=[])
    cfg = fusion_study.run_config("de-en", Path("run"), Path("pair"),
                                  fusion_study.SYSTEMS["decoder-sublayer"], 7, args)
    train = cfg["train"]
    assert (train["lr"], train["betas"], train["eps"], train["max_tokens"]) == (
        5e-4, [0.9, 0.99], 1e-9, 5000)
    assert (train["max_steps"], train["max_seconds"], train["seed"]) == (300, 0, 7)
    assert cfg["model"] == {"preset": "transformer-small", "dropout": 0.3, "fusion": "sublayer",
                            "fusion_function": "mean", "fusion_side": "decoder",
                            "fusion_gate": "scalar"}
    assert "fusion_gate" not in fusion_study.run_config(
        "de-en", Path("run"), Path("pair"), fusion_study.SYSTEMS["baseline"], 1, args)["model"]
    assert cfg["data"]["src_lang"] == "de" and cfg["decode"]["beam"] == 5


def test_fusion_study_resumes_only_an_interrupted_run_of_the_same_config(tmp_path):
    """A run folder with checkpoints and the very config resumes; another config, or no
    checkpoint yet, starts over."""
    cfg = {"train": {"max_steps": 6000, "seed": 1}, "model": {"preset": "transformer-small"}}
    run = tmp_path / "seed1"
    multi30k.write_run_config(run, cfg)
    assert not fusion_study.unfinished_run(run, cfg)  # nothing trained yet
    save_checkpoint(run / "model", 98, torch.nn.Linear(2, 2), {"progress": {"step": 98}}, 5)
    assert fusion_study.unfinished_run(run, cfg)
    assert fusion_study.unfinished_run(run, {**cfg, "train": {**cfg["train"], "threads": 1}})
    assert not fusion_study.unfinished_run(run, {**cfg, "train": {"max_steps": 3000,
                                                                  "seed": 1}})


def test_a_finished_run_is_reused_at_another_thread_count_and_run_again_otherwise(
        tmp_path, capsys):
    cfg = {"train": {"max_steps": 6000, "threads": 2}, "model": {"preset": "transformer-small"}}
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"config": cfg, "bleu": 40.0}))
    assert multi30k.cached_result(result, {**cfg, "train": {"max_steps": 6000, "threads": 1}},
                                  "run")["bleu"] == 40.0
    assert capsys.readouterr().out == ""
    # before: reused (with a warning) and reported under the other recipe
    assert multi30k.cached_result(result, {**cfg, "train": {"max_steps": 3000, "threads": 2}},
                                  "run") is None
    assert "different config: run again" in capsys.readouterr().out


def test_fusion_study_runs_every_system_and_seed_at_most_jobs_at_once(monkeypatch, tmp_path):
    """--jobs 2: all six (system, seed) runs come back under their own keys, never more than
    two training at the same time."""
    lock, active, peak = threading.Lock(), [0], [0]

    def fake_train(pair, run_dir, cfg, threads, label, runs_at_once):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return {"seed": cfg["train"]["seed"], "system": run_dir.parent.name}

    monkeypatch.setattr(fusion_study, "train_and_score", fake_train)
    args = argparse.Namespace(threads=1, size="small", updates=10, gate="elementwise",
                              overrides=[], jobs=2, workdir=tmp_path, keep=tmp_path / "kept",
                              report_only=False)
    monkeypatch.setattr(fusion_study, "keep_finished", lambda *a: None)
    runs = fusion_study.run_all("de-en", tmp_path / "pair", ["baseline", "layer", "sublayer"],
                                [1, 2], args)
    assert peak[0] == 2
    assert {(s, seed): r for s, by in runs.items() for seed, r in by.items()} == {
        (s, seed): {"seed": seed, "system": s}
        for s in ("baseline", "layer", "sublayer") for seed in (1, 2)}


def test_fusion_study_report_only_trains_nothing_and_leaves_unfinished_runs_out(
        monkeypatch, tmp_path):
    """--report-only: finished runs (here baseline seeds 1-2 and a kept layer seed 1) make the
    tables, each system over its own seeds with per-seed p values; unfinished runs and the
    system without any finished run are left out; nothing trains."""
    args = argparse.Namespace(threads=1, size="small", updates=10, gate="elementwise",
                              overrides=[], jobs=2, workdir=tmp_path, keep=tmp_path / "kept",
                              report_only=True)
    pair = tmp_path / "pair"

    def result(bleu, system, seed):
        cfg = fusion_study.run_config("de-en", pair / system / f"seed{seed}", pair,
                                      fusion_study.SYSTEMS[system], seed, args)
        return {"params": 10, "bleu": bleu, "tok_per_s": 100.0, "best_valid_loss": 2.5,
                "valid_loss_change_last_fifth": -0.01, "config": cfg,
                "bleu_by_length": [{"bucket": "1-10", "sentences": 5, "bleu": bleu}]}

    for seed, bleu in ((1, 30.0), (2, 31.0)):
        (pair / "baseline" / f"seed{seed}").mkdir(parents=True)
        (pair / "baseline" / f"seed{seed}" / "result.json").write_text(
            json.dumps(result(bleu, "baseline", seed)))
    (pair / "layer" / "seed2" / "model").mkdir(parents=True)  # interrupted: not in the report
    kept_json, _ = fusion_study.kept_files(args.keep, "de-en", "layer", 1, args)
    kept_json.parent.mkdir(parents=True)
    kept_json.write_text(json.dumps(result(32.0, "layer", 1)))
    other = fusion_study.kept_files(args.keep, "de-en", "sublayer", 1, args)[0]
    other.write_text(json.dumps({**result(33.0, "sublayer", 1), "config": {"train": {}}}))
    monkeypatch.setattr(fusion_study, "timed", lambda *a, **k: pytest.fail("trained"))
    monkeypatch.setattr(fusion_study, "paired_p", lambda *a: {"ar": 0.5, "bs": 0.25})
    runs = fusion_study.run_all("de-en", pair, ["baseline", "layer", "sublayer"], [1, 2], args)
    # the kept sublayer run of another recipe is left out (before: reported as this one)
    assert {s: sorted(by) for s, by in runs.items()} == {"baseline": [1, 2], "layer": [1]}
    base, layer = fusion_study.summarise("de-en", pair, runs)
    assert (base["seeds"], base["bleu_mean"], layer["seeds"], layer["p_vs_baseline"]) == (
        [1, 2], 30.5, [1], [{"ar": 0.5, "bs": 0.25}])
    table = fusion_study.markdown("de-en", [base, layer], SimpleNamespace(
        size="small", updates=10, gate="elementwise", seeds="1,2", overrides=[]))
    assert ("| layer | 10 | 1 | 32.00 (one seed) | +2.00 (seeds 1) | +2.00 (ar 0.5, bs 0.25) | "
            "– |") in table  # one seed: no test over seeds
    assert "two-sided" in table and "WARNING" not in table


def test_fusion_study_keeps_a_finished_run_and_restores_it_on_another_machine(tmp_path):
    """A finished run's result and translations are kept with portable paths; a fresh workdir
    elsewhere gets them back with its own paths, and a finished run of the recipe is never
    overwritten."""
    args = argparse.Namespace(size="small", updates=6000, gate="elementwise", overrides=[])
    kept = fusion_study.kept_files(tmp_path / "kept", "de-en", "sublayer", 2, args)
    assert kept == (tmp_path / "kept/de-en-small-6000/sublayer-seed2.json",
                    tmp_path / "kept/de-en-small-6000/sublayer-seed2.hyp")
    for other in ({"gate": "matrix"}, {"overrides": ["train.lr=1e-3"]}):  # their own folders
        moved_args = argparse.Namespace(**{**vars(args), **other})
        assert fusion_study.kept_files(tmp_path / "kept", "de-en", "sublayer", 2,
                                       moved_args)[0].parent != kept[0].parent
    here, there = tmp_path / "here", tmp_path / "elsewhere"
    run = here / "de-en/small/sublayer/seed2"
    run.mkdir(parents=True)
    cfg = {"data": {"out_dir": str(here / "de-en/small/data-bin"),
                    "train_src": str(multi30k.SHARED / "multi30k/train.de")}}
    (run / "result.json").write_text(json.dumps({"bleu": 40.1, "config": cfg}))
    (run / "test.hyp").write_text("a man .\n")
    fusion_study.keep_finished(run, kept, "test.hyp", here)
    assert str(here) not in kept[0].read_text() and str(multi30k.SHARED) not in kept[0].read_text()

    moved = there / "de-en/small/sublayer/seed2"
    there_cfg = json.loads(fusion_study.localised(json.dumps(cfg).replace(str(here), "$WORKDIR"),
                                                  there))
    assert not fusion_study.restore_kept(moved, kept, "test.hyp", there, {"data": {}})
    assert fusion_study.restore_kept(moved, kept, "test.hyp", there, there_cfg)
    restored = json.loads((moved / "result.json").read_text())
    assert restored == {"bleu": 40.1, "config": {
        "data": {"out_dir": str(there / "de-en/small/data-bin"),
                 "train_src": str(multi30k.SHARED / "multi30k/train.de")}}}
    assert (moved / "test.hyp").read_text() == "a man .\n"
    finished = json.dumps({"bleu": 41.0, "config": there_cfg})
    (moved / "result.json").write_text(finished)
    assert not fusion_study.restore_kept(moved, kept, "test.hyp", there,
                                         there_cfg)  # finished: kept as is
    assert (moved / "result.json").read_text() == finished
    # one of another recipe (another --updates in this workdir) gives way to the kept run.
    # Before: it was kept, and --report-only left the kept run out
    (moved / "result.json").write_text(json.dumps({"bleu": 39.0, "config": {"data": {}}}))
    assert fusion_study.restore_kept(moved, kept, "test.hyp", there, there_cfg)
    assert json.loads((moved / "result.json").read_text())["bleu"] == 40.1
    assert not fusion_study.restore_kept(tmp_path / "other", (tmp_path / "none.json",
                                                              tmp_path / "none.hyp"),
                                         "test.hyp", there, there_cfg)


def test_prepared_data_of_other_settings_is_refused_not_reused(monkeypatch, tmp_path):
    """Before: a study with ``--set data.vocab_size=16000`` found the 8k data-bin of the
    workdir and trained on it, its results saying 16000."""
    data_bin = tmp_path / "data-bin"
    data_bin.mkdir()
    cfg = {"data": {"out_dir": str(data_bin), "vocab_size": 8000, "test": {"t": "/x/t"}}}
    (data_bin / "manifest.json").write_text(json.dumps({"config": {**cfg["data"], "seed": 1}}))
    monkeypatch.setattr(multi30k, "timed", lambda *a, **k: pytest.fail("prepared again"))
    multi30k.prepare_once(cfg, tmp_path)  # the same settings: reused
    cfg["data"]["vocab_size"] = 16000
    with pytest.raises(SystemExit, match=r"data-bin was prepared with other data settings "
                                         r"\(vocab_size\): delete it, or use another --workdir"):
        multi30k.prepare_once(cfg, tmp_path)


def test_fusion_study_stops_on_a_broken_kept_run_with_its_path(tmp_path):
    kept = (tmp_path / "baseline-seed1.json", tmp_path / "baseline-seed1.hyp")
    kept[0].write_text('{"bleu": 40.1,\n<<<<<<< HEAD')
    with pytest.raises(SystemExit, match=r"baseline-seed1.json: not a kept run's result"):
        fusion_study.restore_kept(tmp_path / "run", kept, "test.hyp", tmp_path, {})
    assert not (tmp_path / "run").exists()


def test_fusion_study_has_no_paired_test_without_both_translations(tmp_path):
    (tmp_path / "base").mkdir()
    assert fusion_study.paired_p("de-en", tmp_path / "base", tmp_path / "system") is None


def test_fusion_study_pairs_only_the_translations_of_the_results_reported(tmp_path):
    """Translations left by another run (a retrain keeps the old test.hyp until it is
    overwritten) give no p, where before they gave one for the wrong runs."""
    p = fusion_study.PAIRS["de-en"]
    test = fusion_study.SHARED / p["corpus"] / p["test"]
    try:
        refs = list(fusion_study.read_lines(fusion_study.raw_file(test, p["tgt"])))
    except (OSError, XindaError):
        pytest.skip(f"the Multi30k test set is not in {fusion_study.SHARED}")
    for name in ("base", "system"):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{p['test']}.hyp").write_text("".join(f"{r}\n" for r in refs))
    dirs = (tmp_path / "base", tmp_path / "system")
    assert fusion_study.paired_p("de-en", *dirs, (100.0, 100.0)).keys() == {"ar", "bs"}
    assert fusion_study.paired_p("de-en", *dirs, (100.0, 40.5)) is None


def test_timed_reports_the_commands_own_peak_memory_and_stops_on_failure(tmp_path):
    log = tmp_path / "run.log"
    big = multi30k.timed([sys.executable, "-c", "b = bytearray(200 << 20); print('ok')"], log)
    small = multi30k.timed([sys.executable, "-c", "print('again')"], log, append=True)
    assert big["peak_rss_mb"] >= 200 > small["peak_rss_mb"]
    assert log.read_text() == "ok\nagain\n"
    with pytest.raises(SystemExit, match="failed: .*boom"):
        multi30k.timed([sys.executable, "-c", "raise SystemExit('boom')"], log)


def test_gpu_throughput_lengths_from_a_prepared_corpus_are_its_pairs(tmp_path):
    """``--lengths-from``: every synthetic (source, target) length pair is a training pair's,
    and the ids avoid the special tokens."""
    pairs = {(3, 4), (7, 5), (12, 11)}
    for side, lengths in (("src", [a for a, _ in sorted(pairs)]),
                          ("tgt", [b for _, b in sorted(pairs)])):
        np.save(tmp_path / f"train.{side}.offsets.npy", np.cumsum([0, *lengths]))
    src, tgt = gpu_throughput.synthetic_corpus(200, 50, lengths_from=tmp_path)
    assert {(len(s), len(t)) for s, t in zip(src, tgt)} == pairs
    assert min(int(x.min()) for x in src + tgt) >= 4
    default_src, _ = gpu_throughput.synthetic_corpus(200, 50)
    assert {len(s) for s in default_src} <= set(range(5, 61))


def test_gpu_throughput_counts_useful_training_flops_by_hand():
    """pad 0; source lengths 3, 2 and target lengths 2, 1 (EOS included); matmul parameters
    10 (encoder), 20 (decoder), 4 (cross-attention keys/values: they read the source), 5
    (output); 1 + 2 layers of width 4: linear 6 * (14 * 5 + 25 * 3) = 870; query-key pairs
    1 * (9 + 4) + 2 * ((3 + 1) + (6 + 2)) = 37, attention 3 * 4 * 4 * 37 = 1776."""
    batch = SimpleNamespace(src=torch.tensor([[5, 6, 2], [5, 2, 0]]),
                            target=torch.tensor([[7, 2], [2, 0]]))
    cfg = SimpleNamespace(encoder_layers=1, decoder_layers=2, d_model=4)
    assert gpu_throughput.model_flops(batch, 0, cfg, (10, 20, 4, 5)) == 870 + 1776


def test_gpu_throughput_matmul_parameters_of_a_transformer(make_model):
    """d 8, FFN 16, 1 + 1 layers: encoder q/k/v 8x24 + out 8x8 + FFN 2 x 8x16 = 512; decoder
    adds cross-attention q 8x8 and out 8x8 = 640; its k/v 8x16 = 128 read the source; output
    V x 8."""
    model = make_model({"arch": "transformer", "d_model": 8, "heads": 2, "ffn_dim": 16,
                        "encoder_layers": 1, "decoder_layers": 1, "tie_output": False})
    enc, dec, kv, out = gpu_throughput.matmul_parameters(model)
    assert (enc, dec, kv, out) == (512, 640, 128, model.vocab.tgt_size * 8)


def test_fusion_study_speeds_are_averaged_and_compared_only_within_a_setting(tmp_path):
    """tok/s from runs at 2 threads alone and at 1 thread beside another run are not alike.
    Before: one mean over both settings, so layer fusion (seed 1 only, 2 threads) looked 26 %
    faster than the baseline (seeds 1 at 2 threads and 2 at 1 thread) while 4 % slower."""
    def run(threads, tok, bleu=30.0, **extra):
        return {"params": 10, "bleu": bleu, "tok_per_s": tok, "best_valid_loss": 2.5,
                "valid_loss_change_last_fifth": -0.01, "config": {"train": {"threads": threads}},
                "bleu_by_length": [{"bucket": "1-10", "sentences": 5, "bleu": bleu}],
                "updates": 10, **extra}

    runs = {"baseline": {1: run(2, 4616.0),
                         2: run(1, 9.0, runs_at_once=2, tok_per_s_median_window=2430.0)},
            "layer": {1: run(2, 4451.0, bleu=29.5), 2: run(2, 4000.0, bleu=29.5)}}
    base, layer = fusion_study.summarise("de-en", tmp_path, runs)
    assert base["tok_per_s_by_setting"] == {"2 × 1, total": 4616, "1 × 2, median window": 2430}
    # the BLEU difference pairs both seeds, the speed ratio seed 1 only (seed 2's settings
    # differ), and says so (before: "seeds 1, 2" stood beside a ratio of seed 1 alone)
    assert layer["vs_baseline"] == {"seeds": [1, 2], "bleu_difference": -0.5,
                                    "speed_ratio": round(4451 / 4616, 3), "speed_seeds": [1]}
    args = SimpleNamespace(size="small", updates=10, gate="elementwise", seeds="1,2",
                           overrides=[])
    table = fusion_study.markdown("de-en", [base, layer], args)
    assert "--set" not in table
    assert "| valid loss change, last fifth | mean gate g (cos) |" in table
    assert "| -1.00% / -1.00% | – |" in table  # no fusion run measured its gates
    assert "| 4616 (2 × 1, total) / 2430 (1 × 2, median window) |" in table
    assert "| -0.50 (seeds 1, 2) |" in table and "| 0.96× (seeds 1) |" in table
    # a run resumed with other threads × jobs is labelled so and paired with no baseline
    mixed = {**runs["layer"][1], "speed_settings": ["1 × 2", "2 × 1"]}
    assert fusion_study.speed_setting(mixed) == "mixed 1 × 2 / 2 × 1, total"
    assert fusion_study.paired_with_baseline({1: mixed}, runs["baseline"])["speed_ratio"] is None
    other = fusion_study.markdown("de-en", [base, layer], SimpleNamespace(**{**vars(args),
                                                                         "updates": 20}))
    assert "WARNING: some runs trained [10] updates" in other
    post = fusion_study.markdown("de-en", [base, layer], SimpleNamespace(**{
        **vars(args), "overrides": ["model.norm=post", "model.attention_dropout=0"]}))
    assert "seeds 1,2, --set model.norm=post, --set model.attention_dropout=0;" in post


def test_progressive_times_both_arms_to_the_scratch_arms_best_loss_and_flags_an_early_growth():
    """"to scratch's best" is the first validation at or below the scratch arm's best loss;
    an arm that never gets there says so; a growth inside the warm-up is flagged."""
    def arm(name, curve, grown_at=None):
        return {"arm": name, "params": 10, "updates": curve[-1][1], "grown_at_update": grown_at,
                "final_valid_loss": curve[-1][2], "best_valid_loss": min(c[2] for c in curve),
                "bleu": 30.0, "valid_curve": curve,
                "config": {"train": {"model": {"d_model": 128}, "train": {"max_tokens": 4096}}}}

    scratch = arm("scratch", [[100.0, 50, 5.0], [200.0, 100, 4.0], [300.0, 150, 4.1]])
    grown = arm("progressive", [[90.0, 60, 4.5], [180.0, 120, 3.9], [270.0, 180, 3.8]], 80)
    assert progressive.seconds_to(scratch["valid_curve"], 4.0) == 200.0
    assert progressive.seconds_to(grown["valid_curve"], 4.0) == 180.0
    assert progressive.seconds_to(grown["valid_curve"], 3.0) is None
    args = SimpleNamespace(layers=12, budget=300.0, parallel=True, run_threads=1, pair="de-en",
                           lr=1e-3, warmup=100, seed=1, shallow_share=0.5, beam=5)
    text = progressive.table([scratch, grown], args)
    assert "| scratch | 10 | 150 | - | 4.100 | 4.000 | 200 | 30.00 |" in text
    assert "| progressive | 10 | 180 | 80 | 3.800 | 3.800 | 180 | 30.00 |" in text
    assert "inside the warm-up (100)" in text
    assert "inside the warm-up" not in progressive.table([scratch, {**grown,
                                                          "grown_at_update": 120}], args)
    slow = arm("progressive", [[90.0, 60, 4.5], [180.0, 120, 4.2]], 120)
    assert "| not reached |" in progressive.table([scratch, slow], args)


def test_runs_that_crowd_the_cores_wait_passively_unless_the_environment_says_otherwise(
        monkeypatch):
    monkeypatch.setattr(multi30k, "cpu_cores", lambda: 2)
    for name in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, "")  # recorded, so that teardown restores what was there
        monkeypatch.delenv(name)
    multi30k.set_threads(1, 2)  # 2 runs x 1 thread on 2 cores: OpenMP's default
    assert (multi30k.os.environ["OMP_NUM_THREADS"], multi30k.os.environ["MKL_NUM_THREADS"]) \
        == ("1", "1")
    assert "OMP_WAIT_POLICY" not in multi30k.os.environ
    multi30k.set_threads(2, 2)
    assert multi30k.os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    multi30k.set_threads(2, 2)
    assert multi30k.os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_fusion_study_compares_the_papers_system_pairs_on_the_seeds_both_ran(monkeypatch, tmp_path):
    tested = []
    monkeypatch.setattr(fusion_study, "paired_p", lambda pair, ref, system, expected: tested.append(
        (ref.parts[-2:], system.parts[-2:], expected)) or {"ar": 0.9, "bs": 0.5})
    runs = {"baseline": {1: {"bleu": 30.0}},
            "sublayer": {1: {"bleu": 31.0}, 2: {"bleu": 32.0}},
            "sublayer-linear": {1: {"bleu": 30.5}, 2: {"bleu": 30.0}, 3: {"bleu": 29.0}}}
    [found] = fusion_study.compare("de-en", tmp_path, runs, [1, 2, 3])  # no "layer": one claim
    assert (found["system"], found["reference"]) == ("sublayer", "sublayer-linear")
    assert found["seeds"] == [1, 2] and found["bleu_difference"] == pytest.approx(1.25)
    assert tested == [(("sublayer-linear", "seed1"), ("sublayer", "seed1"), (30.5, 31.0)),
                      (("sublayer-linear", "seed2"), ("sublayer", "seed2"), (30.0, 32.0))]
    # each seed's difference beside its p values (before: the p alone), then the t-test over
    # seeds: differences 0.5 and 2.0, mean 1.25, SE 0.75, t 1.667 on 1 degree of freedom
    assert ("| +1.25 | +0.50 (ar 0.9, bs 0.5) / +2.00 (ar 0.9, bs 0.5) | +1.25 [-8.28, +10.78], "
            "p 0.344 |") in "\n".join(fusion_study.comparisons_markdown([found]))


def test_fusion_study_speed_is_the_median_log_window_and_filled_in_for_older_runs(tmp_path):
    """A run stopped for a while inside one window (here 10 tok/s there) keeps its median
    window speed; a result without one gets it from its log, and the report says which."""
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "model" / "log.csv").write_text(
        "step,epoch,lr,train_loss,train_nll,tok_per_s,elapsed_s,valid_loss,valid_ppl,valid_bleu\n"
        "98,1,,,,,,7.2,1022,\n100,2,5e-05,7.2,6.9,4000,10,,,\n200,3,1e-4,6,5.9,10,20,,,\n"
        "300,4,1e-4,5,4.9,3000,30,,,\n")
    assert fusion_study.window_tok_per_s(run / "model") == 3000.0
    other = {"tok_per_s": 500.0, "config": {"train": {"threads": 2}}, "updates": 6000}
    fusion_study.add_window_speed(run, other)  # a log of another run (it ends at 300)
    assert "tok_per_s_median_window" not in other and not (run / "result.json").exists()
    old = {"tok_per_s": 500.0, "config": {"train": {"threads": 2}}, "updates": 300}
    assert fusion_study.speed_setting(old) == "2 × 1, total"
    fusion_study.add_window_speed(run, old)
    assert fusion_study.run_speed(old) == 3000.0
    assert json.loads((run / "result.json").read_text())["tok_per_s_median_window"] == 3000.0
    assert fusion_study.speed_setting(old) == "2 × 1, median window"
    assert fusion_study.window_tok_per_s(tmp_path) is None


def test_fusion_study_seed_level_t_test_by_hand():
    """Differences 1, 2, 3: mean 2, standard error 1/sqrt(3), t = 2 sqrt(3) on 2 degrees of
    freedom, whose two-sided p is 1 - t / sqrt(t^2 + 2); the 95 % interval is 2 +- 4.303 SE."""
    test = fusion_study.seed_level([1.0, 2.0, 3.0])
    t = 2 * 3 ** 0.5
    assert test["mean"] == 2.0 and test["p"] == pytest.approx(1 - t / (t * t + 2) ** 0.5, abs=1e-4)
    assert test["ci95"] == pytest.approx([2 - 4.3027 / 3 ** 0.5, 2 + 4.3027 / 3 ** 0.5], abs=2e-3)
    assert fusion_study.seed_level([0.4]) is None


def test_fusion_study_p_values_say_their_test_and_their_floor():
    assert fusion_study.p_text({"ar": 0.136, "bs": 0.048}) == "ar 0.136, bs 0.048"
    assert fusion_study.p_text({"ar": 0.0001, "bs": 0.001}) == "ar ≤ 0.0001, bs ≤ 0.001"
    assert fusion_study.p_text(0.048) == "bs 0.048"  # a report written before the AR test
    assert fusion_study.p_cell([{"ar": 0.5, "bs": 0.2}, None], [0.21, -0.3]) == \
        "+0.21 (ar 0.5, bs 0.2) / -0.30 (n/a)"


def test_applications_skips_each_app_without_its_data_and_refuses_unknown_ones(tmp_path):
    """Before: only poetry-couplets was checked, whatever --apps asked for; a missing folder
    failed the run after earlier apps had trained (found by review)."""
    import subprocess

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "applications.py"
    env = {**os.environ, "XINDA_SHARED_DATA": str(tmp_path)}
    (tmp_path / "poetry-couplets").mkdir()
    run = subprocess.run([sys.executable, str(script), "--apps", "couplet,classical-modern",
                          "--workdir", str(tmp_path / "w")], capture_output=True, text=True,
                         env=env, timeout=120, check=False)
    assert run.returncode == 0 and not (tmp_path / "w").exists()
    assert f"skipped couplet: {tmp_path} has no couplet" in run.stdout
    assert f"skipped classical-modern: {tmp_path} has no classical-modern" in run.stdout
    bad = subprocess.run([sys.executable, str(script), "--apps", "bogus"], capture_output=True,
                         text=True, env=env, timeout=120, check=False)
    assert bad.returncode != 0 and "--apps: unknown bogus" in bad.stderr


def test_applications_reuses_a_model_only_of_the_same_recipe(tmp_path):
    """Before: a finished model was reused and scored whatever recipes/{app}.yaml had become,
    and the result recorded no config (found by review)."""
    import applications
    import yaml

    work = tmp_path / "couplet"
    (work / "raw").mkdir(parents=True)
    (work / "raw" / "train.up").write_text("春\n", encoding="utf-8")
    args = SimpleNamespace(threads=1, budget=60, overrides=[])
    cfg = applications.run_config("couplet", work, args)
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    (work / "data-bin").mkdir()
    (work / "data-bin" / "manifest.json").write_text(json.dumps({"config": cfg["data"]}))
    (work / "model").mkdir()
    (work / "model" / "train_stats.json").write_text('{"steps": 7}')
    assert applications.train("couplet", work, args) == ({"steps": 7}, cfg)
    with pytest.raises(SystemExit, match="was trained with another config than "
                                         "recipes/couplet.yaml now gives"):
        applications.train("couplet", work, SimpleNamespace(**{**vars(args), "budget": 90}))


def test_gpu_kit_waits_for_kept_runs_and_collects_no_checkpoints(tmp_path):
    """``kit.sh waitfor`` counts the files its quoted globs match now; ``collect`` leaves out
    the checkpoints' json, which training deletes as it goes (tar failed on one; found by
    review)."""
    import shutil
    import subprocess
    import tarfile

    kit = tmp_path / "benchmarks" / "gpu" / "kit.sh"
    kit.parent.mkdir(parents=True)
    shutil.copy(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "kit.sh", kit)
    kept = tmp_path / "runs" / "gpu" / "kept" / "de-en-base-6000"
    kept.mkdir(parents=True)
    (kept / "baseline-seed1.json").write_text("{}")
    checkpoints = tmp_path / "runs" / "gpu" / "run" / "model" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "step_0000001.state.json").write_text("{}")

    def kit_sh(*args: str) -> str:
        return subprocess.run(["bash", str(kit), *args], capture_output=True, text=True,
                              check=True, timeout=60, env={**os.environ, "OUT": str(tmp_path)}
                              ).stdout
    assert "1 of 2 found" in kit_sh("waitfor", "0", "2", "runs/gpu/kept/*/*.json")
    (kept / "layer-seed1.json").write_text("{}")
    assert "2 of 2 found" in kit_sh("waitfor", "30", "2", "runs/gpu/kept/*/*.json")
    kit_sh("collect", "runs/gpu")
    with tarfile.open(tmp_path / "results.tar.gz") as tar:
        names = tar.getnames()
    assert "runs/gpu/kept/de-en-base-6000/layer-seed1.json" in names
    assert not [n for n in names if "checkpoints" in n]


def test_gpu_throughput_decode_speed_takes_turns_and_keeps_medians(tmp_path, monkeypatch):
    """Two beams x two batch sizes, 3 rounds: each round decodes every setting once, in turn,
    and each row's sentences/s is the 4 lines over the median of its 3 passes' seconds."""
    from xinda.decode import translator

    (tmp_path / "in.txt").write_text("a\nb\nc\nd\n", encoding="utf-8")
    clock, calls, warmed = [0.0], [], []
    seconds = {(5, 2): [1.0, 4.0, 2.0], (5, 8): [1.0, 1.0, 1.0],
               (1, 2): [0.5, 0.25, 8.0], (1, 8): [2.0, 2.0, 0.1]}

    class Fake:
        def translate_text(self, lines, beam, batch_size, precision):
            assert precision == "bf16"
            if not warmed:  # the untimed first call
                warmed.append((beam, batch_size))
            else:
                key = (beam, batch_size)
                calls.append(key)
                clock[0] += seconds[key][sum(c == key for c in calls) - 1]

    monkeypatch.setattr(translator.Translator, "load", classmethod(lambda cls, *a, **k: Fake()))
    monkeypatch.setattr(gpu_throughput.time, "perf_counter", lambda: clock[0])
    rows = gpu_throughput.decode_speed(tmp_path, tmp_path / "in.txt", torch.device("cpu"),
                                       "bf16", [5, 1], [2, 8], 3)
    assert warmed == [(5, 2)] and calls == [(5, 2), (5, 8), (1, 2), (1, 8)] * 3
    assert [(r["beam"], r["batch_size"], r["sents_per_s"]) for r in rows] == [
        (5, 2, 2.0), (5, 8, 4.0), (1, 2, 8.0), (1, 8, 2.0)]


def test_dlcl_vs_big_times_the_first_validation_at_the_common_bleu():
    """[seconds, update, BLEU] rows: the first at or above the target counts; None if none."""
    import dlcl_vs_big

    curve = [[10.0, 5, 1.0], [20.0, 10, 3.0], [30.0, 15, 2.5], [40.0, 20, 4.0]]
    assert dlcl_vs_big.seconds_to(curve, 3.0) == 20.0
    assert dlcl_vs_big.seconds_to(curve, 2.0) == 20.0
    assert dlcl_vs_big.seconds_to(curve, 4.5) is None
