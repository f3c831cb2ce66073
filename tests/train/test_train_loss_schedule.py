"""Label-smoothed loss and learning-rate schedules."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from xinda.config import TrainConfig
from xinda.errors import XindaError
from xinda.train.loss import label_smoothed_nll
from xinda.train.schedule import (
    MIN_LOSS_SCALE,
    learning_rate,
    make_optimizer,
    optimizer_step,
    set_lr,
)

PAD = 0
LOGITS = [[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]]  # (1, 2, 4) once wrapped


def _hand_loss(rows, targets, eps):
    """Label-smoothed loss and NLL, summed, from plain math (no torch)."""
    loss = nll = 0.0
    for row, y in zip(rows, targets):
        lse = math.log(sum(math.exp(x) for x in row))
        logp = [x - lse for x in row]
        nll += -logp[y]
        loss += (1 - eps) * -logp[y] + eps * sum(-lp for lp in logp) / len(row)
    return loss, nll


# --- label smoothing ------------------------------------------------------------------------

@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_nll_matches_hand_computation(eps):
    logits = torch.tensor([LOGITS])
    target = torch.tensor([[2, 1]])
    loss, nll = label_smoothed_nll(logits, target, eps, pad=PAD)
    want_loss, want_nll = _hand_loss(LOGITS, [2, 1], eps)
    assert loss.item() == pytest.approx(want_loss, rel=1e-6)
    assert nll.item() == pytest.approx(want_nll, rel=1e-6)


def test_label_smoothed_nll_hand_value_for_one_token():
    # log-softmax of [1, 2, 3, 4] at class 2: 3 - log(e + e^2 + e^3 + e^4)
    lse = math.log(math.e + math.e**2 + math.e**3 + math.e**4)
    nll_y = lse - 3.0
    mean_nll = sum(lse - x for x in (1.0, 2.0, 3.0, 4.0)) / 4
    loss, nll = label_smoothed_nll(torch.tensor([[LOGITS[0]]]), torch.tensor([[2]]), 0.1, PAD)
    assert nll.item() == pytest.approx(nll_y, rel=1e-6)
    assert loss.item() == pytest.approx(0.9 * nll_y + 0.1 * mean_nll, rel=1e-6)


def test_pad_positions_contribute_zero():
    logits = torch.tensor([LOGITS])
    loss, nll = label_smoothed_nll(logits, torch.tensor([[2, PAD]]), 0.1, pad=PAD)
    want_loss, want_nll = _hand_loss(LOGITS[:1], [2], 0.1)
    assert loss.item() == pytest.approx(want_loss, rel=1e-6)
    assert nll.item() == pytest.approx(want_nll, rel=1e-6)
    # whatever the logits at a pad position, the loss and its gradient there are zero
    moved = logits.clone()
    moved[0, 1] = torch.tensor([100.0, -50.0, 3.0, 7.0])
    moved.requires_grad_(True)
    loss2, _ = label_smoothed_nll(moved, torch.tensor([[2, PAD]]), 0.1, pad=PAD)
    assert loss2.item() == pytest.approx(want_loss, rel=1e-6)
    loss2.backward()
    assert torch.all(moved.grad[0, 1] == 0)
    assert torch.any(moved.grad[0, 0] != 0)


def test_all_pad_gives_zero_loss():
    loss, nll = label_smoothed_nll(torch.randn(2, 3, 5), torch.full((2, 3), PAD), 0.1, PAD)
    assert loss.item() == 0.0 and nll.item() == 0.0


def test_eps_zero_reduces_to_nll():
    torch.manual_seed(0)
    logits, target = torch.randn(3, 4, 9), torch.randint(1, 9, (3, 4))
    loss, nll = label_smoothed_nll(logits, target, 0.0, pad=PAD)
    assert loss.item() == pytest.approx(nll.item(), rel=1e-6)
    expected = F.cross_entropy(logits.view(-1, 9), target.view(-1), reduction="sum")
    assert nll.item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.2])
def test_matches_torch_cross_entropy_with_label_smoothing(eps):
    torch.manual_seed(1)
    vocab = 11
    logits = torch.randn(2, 5, vocab) * 3
    target = torch.randint(1, vocab, (2, 5))
    target[0, 3:] = PAD
    target[1, 4] = PAD
    loss, nll = label_smoothed_nll(logits, target, eps, pad=PAD)
    flat_logits, flat_target = logits.view(-1, vocab), target.view(-1)
    want = F.cross_entropy(flat_logits, flat_target, label_smoothing=eps, reduction="sum",
                           ignore_index=PAD)
    want_nll = F.cross_entropy(flat_logits, flat_target, reduction="sum", ignore_index=PAD)
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    assert nll.item() == pytest.approx(want_nll.item(), rel=1e-5)


def test_smoothing_raises_loss_of_a_confident_correct_prediction():
    logits = torch.tensor([[[10.0, -10.0, -10.0]]])
    plain, _ = label_smoothed_nll(logits, torch.tensor([[0]]), 0.0, pad=2)
    smoothed, _ = label_smoothed_nll(logits, torch.tensor([[0]]), 0.1, pad=2)
    assert smoothed.item() > plain.item()


def test_bf16_logits_give_float32_loss():
    torch.manual_seed(2)
    logits = torch.randn(2, 3, 7)
    target = torch.randint(1, 7, (2, 3))
    loss16, _ = label_smoothed_nll(logits.bfloat16(), target, 0.1, PAD)
    loss32, _ = label_smoothed_nll(logits.bfloat16().float(), target, 0.1, PAD)
    assert loss16.dtype == torch.float32
    assert loss16.item() == pytest.approx(loss32.item(), rel=1e-6)


# --- learning-rate schedules ----------------------------------------------------------------

def cfg(**kw) -> TrainConfig:
    return TrainConfig(**kw)


@pytest.mark.parametrize(("step", "lr"), [(1, 5e-7), (500, 2.5e-4), (1000, 5e-4), (4000, 2.5e-4),
                                          (16000, 1.25e-4)])
def test_inverse_sqrt_values(step, lr):
    c = cfg(schedule="inverse_sqrt", lr=5e-4, warmup_steps=1000)
    assert learning_rate(c, step, 512) == pytest.approx(lr, rel=1e-9)


def test_inverse_sqrt_peaks_at_warmup_and_is_continuous():
    c = cfg(schedule="inverse_sqrt", lr=1e-3, warmup_steps=100)
    rates = [learning_rate(c, s, 512) for s in range(1, 400)]
    assert max(rates) == pytest.approx(1e-3) and rates.index(max(rates)) == 99
    assert all(a < b for a, b in itertools.pairwise(rates[:100]))  # warm-up increases
    assert all(a > b for a, b in itertools.pairwise(rates[99:]))  # then decays
    assert learning_rate(c, 99, 512) == pytest.approx(0.99e-3)
    assert learning_rate(c, 101, 512) == pytest.approx(1e-3 * math.sqrt(100 / 101))


def test_step_zero_is_treated_as_step_one():
    c = cfg(schedule="inverse_sqrt", lr=5e-4, warmup_steps=1000)
    assert learning_rate(c, 0, 512) == learning_rate(c, 1, 512)


@pytest.mark.parametrize("step", [1, 100, 4000, 10000])
def test_noam_formula(step):
    c = cfg(schedule="noam", lr=2.0, warmup_steps=4000)
    want = 2.0 * 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    assert learning_rate(c, step, d_model=512) == pytest.approx(want, rel=1e-9)
    want256 = 2.0 * 256**-0.5 * min(step**-0.5, step * 4000**-1.5)
    assert learning_rate(c, step, d_model=256) == pytest.approx(want256, rel=1e-9)


def test_noam_peaks_at_warmup():
    c = cfg(schedule="noam", lr=1.0, warmup_steps=4000)
    peak = learning_rate(c, 4000, d_model=512)
    assert peak == pytest.approx(512**-0.5 * 4000**-0.5)
    assert learning_rate(c, 3999, 512) < peak and learning_rate(c, 4001, 512) < peak


@pytest.mark.parametrize(("step", "lr"), [(1, 1e-3), (1000, 1e-3), (1001, 5e-4), (2000, 5e-4),
                                          (2001, 2.5e-4), (3500, 1.25e-4)])
def test_step_decay_values(step, lr):
    c = cfg(schedule="step", lr=1e-3, warmup_steps=0, decay_every=1000, decay_factor=0.5)
    assert learning_rate(c, step, 512) == pytest.approx(lr, rel=1e-9)


def test_step_decay_without_warmup_holds_the_peak_for_decay_every_updates():
    """Before: warmup_steps 0 decayed at update 1000 of decay_every 1000 (999 updates at the
    peak) and warmup_steps 1, also no warm-up, at update 1001."""
    rates = [[learning_rate(cfg(schedule="step", lr=1e-3, warmup_steps=w, decay_every=10,
                                decay_factor=0.5), s, 512) for s in range(1, 40)] for w in (0, 1)]
    assert rates[0] == rates[1]
    assert rates[0][:10] == [1e-3] * 10 and rates[0][10] == pytest.approx(5e-4)


def test_step_decay_with_warmup_counts_its_decays_from_the_peak():
    c = cfg(schedule="step", lr=1e-3, warmup_steps=100, decay_every=1000, decay_factor=0.1)
    assert learning_rate(c, 50, 512) == pytest.approx(0.5e-3)
    assert [learning_rate(c, s, 512) for s in (100, 1099)] == pytest.approx([1e-3, 1e-3])
    assert learning_rate(c, 1100, 512) == pytest.approx(1e-4)


def test_step_decay_reaches_lr_with_a_warmup_longer_than_its_period():
    """Before: the decays counted from update 0, so with the defaults (warm-up 4000, a decay
    every 1000) the peak was lr * 0.5^4."""
    c = cfg(schedule="step", lr=1e-3, warmup_steps=4000, decay_every=1000, decay_factor=0.5)
    assert max(learning_rate(c, s, 512) for s in range(1, 20_000)) == pytest.approx(1e-3)
    assert learning_rate(c, 4000, 512) == pytest.approx(1e-3)
    assert learning_rate(c, 6000, 512) == pytest.approx(2.5e-4)


def test_constant_schedule():
    c = cfg(schedule="constant", lr=3e-4, warmup_steps=10)
    assert learning_rate(c, 5, 512) == pytest.approx(1.5e-4)
    assert [learning_rate(c, s, 512) for s in (10, 11, 1000, 10**6)] == pytest.approx([3e-4] * 4)
    c0 = cfg(schedule="constant", lr=3e-4, warmup_steps=0)
    assert learning_rate(c0, 1, 512) == pytest.approx(3e-4)


@pytest.mark.parametrize("schedule", ["inverse_sqrt", "noam", "step", "constant"])
def test_min_lr_floor(schedule):
    decay = {"decay_every": 10} if schedule == "step" else {}
    lr = 2.0 if schedule == "noam" else 5e-4  # noam's lr scales d^-0.5: its peak is 2.8e-3
    c = cfg(schedule=schedule, lr=lr, warmup_steps=1000, min_lr=1e-4, **decay)
    for step in (1000, 1001, 10**5, 10**7):
        assert learning_rate(c, step, 512) >= 1e-4
    # the warm-up still rises from near 0 (before: the floor lifted its first 200 updates
    # to min_lr, found by review)
    unfloored = cfg(schedule=schedule, lr=lr, warmup_steps=1000, **decay)
    for step in (1, 2, 10, 999):
        assert learning_rate(c, step, 512) == learning_rate(unfloored, step, 512)
    assert learning_rate(c, 1, 512) < 1e-5
    if schedule != "constant":
        assert learning_rate(c, 10**7, 512) == pytest.approx(1e-4)


# --- optimiser helpers ----------------------------------------------------------------------

def test_fp16_overflowing_at_every_update_stops_at_the_minimum_loss_scale():
    """Each overflow skips the update and halves the scale. Before: an fp16 loss that is never
    finite skipped every update, silently, to the end of training (found by review)."""
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=4 * MIN_LOSS_SCALE)
    scaler.scale(torch.ones(()))  # as a backward pass scales its loss
    weight.grad = torch.tensor([1.0, 1.0])
    assert optimizer_step(optimizer, scaler, 1)  # finite: the step is taken
    assert weight.tolist() == pytest.approx([1 - 0.1 / (4 * MIN_LOSS_SCALE)] * 2)
    before = weight.detach().clone()
    for update in (2, 3):  # scale 2x, then 1x the minimum: skipped, no error yet
        weight.grad = torch.tensor([math.inf, 1.0])
        assert not optimizer_step(optimizer, scaler, update)
    weight.grad = torch.tensor([math.inf, 1.0])
    with pytest.raises(XindaError, match="^update 4: fp16 overflowed at every update down to"):
        optimizer_step(optimizer, scaler, 4)
    assert torch.equal(weight.detach(), before)


def test_sgd_momentum_is_unchanged_by_an_fp16_update_skipped_first():
    """Fused SGD made its momentum buffers with torch.empty at its first step, before seeing
    the overflow that skipped it: the next updates used uninitialised memory (1e14 here, found
    by review). Now a skipped first update leaves the updates after it as without it."""
    def train(skip_first: bool) -> torch.Tensor:
        torch.manual_seed(0)
        layer = torch.nn.Linear(64, 64)
        optimizer = make_optimizer(cfg(optimizer="sgd", lr=0.1, momentum=0.9),
                                   layer.parameters())
        scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
        for update in range(3 if skip_first else 2):
            x = torch.full((2, 64), math.inf if skip_first and update == 0 else 1.0)
            scaler.scale(layer(x).sum()).backward()
            assert optimizer_step(optimizer, scaler, update + 1) != (skip_first and update == 0)
            optimizer.zero_grad(set_to_none=True)
        return layer.weight.detach()

    torch.testing.assert_close(train(skip_first=True), train(skip_first=False), rtol=0, atol=0)


def test_sgd_with_momentum_takes_torch_sgds_steps():
    """make_optimizer's SGD (fused, its momentum buffers made before the first step) moves the
    weights as torch's reference SGD with the same lr, momentum and weight decay does, step
    after step: the buffers start at zero, as torch's first step has them."""
    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    theirs.load_state_dict(ours.state_dict())
    optimizers = [
        (ours, make_optimizer(cfg(optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=0.01),
                              ours.parameters())),
        (theirs, torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01,
                                 foreach=False))]
    for _ in range(3):
        x = torch.randn(5, 4)
        for layer, optimizer in optimizers:
            layer(x).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        for mine, reference in zip(ours.parameters(), theirs.parameters()):
            torch.testing.assert_close(mine, reference, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("clip_norm", [0.0, 1.0, 2.5, 10.0])
def test_optimizer_step_clips_the_gradients_global_norm(clip_norm):
    """Gradients (3, 0) and (4,) have global L2 norm 5: clip_norm below it scales both by
    clip_norm / 5, above it (or 0: off) leaves them. Plain SGD at lr 1 moves each weight by
    its (clipped) gradient."""
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])
    optimizer = torch.optim.SGD([a, b], lr=1.0)
    assert optimizer_step(optimizer, torch.amp.GradScaler("cpu", enabled=False), 1, clip_norm)
    factor = clip_norm / 5.0 if 0 < clip_norm < 5 else 1.0
    assert a.tolist() == pytest.approx([-3.0 * factor, 0.0], rel=1e-5)
    assert b.tolist() == pytest.approx([-4.0 * factor], rel=1e-5)
    moved = math.hypot(*a.tolist(), *b.tolist())
    assert moved == pytest.approx(min(clip_norm or math.inf, 5.0), rel=1e-5)

def test_noam_refuses_a_min_lr_above_its_peak():
    """Before: lr 2, d 512, warm-up 8000 peaks at 9.9e-4, and min_lr 1e-3 made the rate jump
    up at update 8000 and never decay, silently (found by review; noam's peak needs d_model,
    which the train section does not know)."""
    cfg = TrainConfig(schedule="noam", lr=2.0, warmup_steps=8000, min_lr=1e-3)
    with pytest.raises(XindaError, match=r"min_lr 0.001 is above noam's peak rate 0.000988"):
        learning_rate(cfg, 1, 512)
    ok = TrainConfig(schedule="noam", lr=2.0, warmup_steps=8000, min_lr=9e-4)
    assert learning_rate(ok, 20000, 512) == pytest.approx(9e-4)


def test_set_lr_updates_every_group_and_frozen_params_are_skipped():
    torch.manual_seed(3)
    a, b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
    b.weight.requires_grad_(False)
    opt = make_optimizer(cfg(optimizer="adam", lr=1e-3), [*a.parameters(), *b.parameters()])
    assert sum(len(g["params"]) for g in opt.param_groups) == 3
    opt.add_param_group({"params": [b.weight]})
    set_lr(opt, 0.123)
    assert all(g["lr"] == 0.123 for g in opt.param_groups)
    sgd = make_optimizer(cfg(optimizer="sgd", lr=0.5, momentum=0.9), a.parameters())
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["momentum"] == 0.9


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_loss_gradient_equals_reference_autograd(dtype):
    from xinda.train.loss import label_smoothed_nll_reference

    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=dtype, requires_grad=True)
    target = torch.randint(1, 11, (3, 5))
    target[0, 3:] = 0  # padding
    fused, fused_nll = label_smoothed_nll(logits, target, 0.1, 0)
    (0.7 * fused).backward()
    grad_fused, logits.grad = logits.grad.clone(), None
    ref, ref_nll = label_smoothed_nll_reference(logits, target, 0.1, 0)
    (0.7 * ref).backward()
    assert torch.allclose(fused, ref) and torch.allclose(fused_nll, ref_nll)
    assert torch.allclose(grad_fused.float(), logits.grad.float(), atol=1e-6)
    assert grad_fused[0, 3:].abs().sum() == 0  # pad rows get no gradient


def test_min_lr_with_the_constant_schedule_warns(caplog):
    """It can never apply (found by review); a warning, since a saved run's config with it
    must still load."""
    from xinda.train.run_dir import warn_validation_settings

    warn_validation_settings(cfg(schedule="constant", min_lr=1e-5), True, True)
    assert "train.min_lr 1e-05 has no effect: the constant schedule never decays" in caplog.text
    caplog.clear()
    warn_validation_settings(cfg(schedule="inverse_sqrt", min_lr=1e-5), True, True)
    assert "min_lr" not in caplog.text


@pytest.mark.parametrize(("settings", "has_valid", "why"), [
    ({"run_validation": False}, True, "train.run_validation false"),
    ({"valid_bleu": False}, True, "train.valid_bleu false"),
    ({}, False, "the prepared data has no valid split"),
    ({}, True, None),  # used
])
def test_valid_beam_without_validation_bleu_warns(caplog, settings, has_valid, why):
    """A beam for a validation BLEU that never runs (before: silently unused)."""
    from xinda.train.run_dir import warn_validation_settings

    warn_validation_settings(cfg(valid_beam=4, **settings), has_valid, True)
    expected = f"train.valid_beam 4 has no effect: validation BLEU is off ({why})"
    assert (expected in caplog.text) if why else ("valid_beam" not in caplog.text)
