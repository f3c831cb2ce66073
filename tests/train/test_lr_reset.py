"""The learning-rate restart of progressive training: after a growth every schedule restarts at
its peak."""

from dataclasses import asdict

import pytest

from xinda.config import TrainConfig
from xinda.train.progress import Progress
from xinda.train.schedule import learning_rate, warn_warmup

D, WARM, SCALE = 64, 100, 2.0
# By hand: scale * d^-0.5 = 2 / 8 = 0.25; noam's maximum, at step == warmup, 0.25 / 10.
PEAK = 0.025


def cfg(schedule: str = "noam", **kw) -> TrainConfig:
    return TrainConfig(schedule=schedule, lr=SCALE, warmup_steps=WARM, **kw)


def lr(step: int, resets=(), **kw) -> float:
    return learning_rate(cfg(**kw), step, D, resets)


def test_warmup_and_peak_before_any_reset():
    assert lr(1) == pytest.approx(2.5e-4)  # 2 * 64**-0.5 * 1 * 100**-1.5
    assert lr(50) == pytest.approx(0.0125)  # half-way up the warm-up: 50 * 2.5e-4
    assert lr(WARM) == pytest.approx(0.025)  # 2 * 64**-0.5 * 100**-0.5, the peak
    assert lr(WARM - 1) < lr(WARM) and lr(WARM + 1) < lr(WARM)
    assert lr(400) == pytest.approx(0.0125)  # inverse sqrt: 4x the warm-up, half the peak


def test_noam_reset_of_older_grown_models_reads_as_noam():
    assert cfg("noam_reset").schedule == "noam"
    for step in (1, 99, 100, 301, 12345):
        assert learning_rate(cfg("noam_reset"), step, D, [300]) == lr(step, [300])


def test_right_after_a_reset_the_lr_is_the_peak():
    # grown after 300 updates: update 301 is the first of the deeper model
    # update 300 is still noam's: 0.25 / sqrt(300)
    assert lr(300, resets=[300]) == pytest.approx(0.0144338, rel=1e-5)
    assert lr(301, resets=[300]) == pytest.approx(PEAK)
    # even during the first warm-up (grown after 10 updates)
    assert lr(11, resets=[10]) == pytest.approx(PEAK)
    assert lr(11, resets=[10]) > lr(10, resets=[10])


def test_inverse_sqrt_decay_counted_from_the_reset():
    # k updates after the reset: scale * d^-0.5 * (k + warmup)^-0.5 = 0.25 / sqrt(k + 100)
    for k, rate in ((1, 0.0248759), (10, 0.0238366), (300, 0.0125), (2000, 0.0054554)):
        assert lr(300 + 1 + k, resets=[300]) == pytest.approx(rate, rel=1e-5)
    assert lr(301 + 3 * WARM, resets=[300]) == pytest.approx(0.0125)


def test_the_latest_reset_counts():
    resets = [200, 1000]
    assert lr(501, resets) == pytest.approx(0.0125)  # 300 updates after the first: 0.25 / 20
    assert lr(1001, resets) == pytest.approx(PEAK)
    assert lr(1001 + 3 * WARM, resets) == pytest.approx(0.0125)


def test_min_lr_floor_still_applies():
    assert lr(10**7, resets=[300], min_lr=1e-3) == 1e-3
    assert lr(301, resets=[300], min_lr=1e-3) == pytest.approx(PEAK)


def test_every_schedule_restarts_at_the_end_of_its_warm_up():
    # update 301 + k after a growth at 300 runs at the rate of update WARM + k
    for schedule in ("inverse_sqrt", "noam", "step", "constant"):
        step = {"decay_every": 50} if schedule == "step" else {}
        c = TrainConfig(schedule=schedule, lr=1e-3, warmup_steps=WARM, **step)
        for k in (0, 1, 49, 50, 1000):
            assert learning_rate(c, 301 + k, D, [300]) == learning_rate(c, WARM + k, D)
        assert learning_rate(c, 300, D, [300]) == learning_rate(c, 300, D)  # before it


def test_restarted_rates_by_hand():
    inv = TrainConfig(schedule="inverse_sqrt", lr=1e-3, warmup_steps=WARM)
    assert learning_rate(inv, 301, D, [300]) == pytest.approx(1e-3)  # the peak again
    assert learning_rate(inv, 301 + 3 * WARM, D, [300]) == pytest.approx(5e-4)  # sqrt(1/4)
    step = TrainConfig(schedule="step", lr=1e-3, warmup_steps=0, decay_every=50,
                       decay_factor=0.5)
    assert learning_rate(step, 1000, D) == pytest.approx(1e-3 * 0.5**19)  # (999 // 50)
    # as in a fresh run (update s runs at the rate of s - 950): 1000 = 50, the last at the peak
    assert learning_rate(step, 1000, D, [950]) == pytest.approx(1e-3)
    assert learning_rate(step, 1001, D, [950]) == pytest.approx(5e-4)  # the first decay again


def test_a_constant_rate_stays_constant_across_a_growth():
    for warm in (0, WARM):
        c = TrainConfig(schedule="constant", lr=1e-3, warmup_steps=warm)
        assert {learning_rate(c, s, D, [300]) for s in (301, 302, 1000, 10**6)} == {1e-3}


def test_progress_records_resets_and_old_states_still_load():
    grown = Progress(step=300)
    grown.lr_resets.append(300)
    assert Progress().lr_resets == []  # each Progress has its own list
    saved = asdict(grown)  # as stored in a checkpoint
    assert saved["lr_resets"] == [300]
    resumed = Progress(**saved)
    assert resumed.lr_resets == [300]
    assert lr(301, resumed.lr_resets) == pytest.approx(PEAK)  # the restart survives resuming
    old_state = {"step": 60, "epoch": 6, "batch": 0, "tgt_tokens": 1000, "train_seconds": 3.0,
                 "best": 12.5, "bad_epochs": 0}  # saved before lr_resets existed
    assert Progress(**old_state).lr_resets == []


def test_a_grown_run_is_not_warned_of_a_warm_up_it_skipped(caplog):
    """Before: `xinda train --resume` of a grown run with max_steps below warmup_steps said the
    rate stops at max_steps / warmup_steps of its peak; it had restarted at the peak."""
    short = TrainConfig(lr=1e-3, warmup_steps=4000, max_steps=1000)
    warn_warmup(short, [300])
    assert "warmup_steps" not in caplog.text
    warn_warmup(short, [])
    assert "the learning rate stops at 0.25 of its peak" in caplog.text
