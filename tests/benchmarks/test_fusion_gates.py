"""benchmarks/fusion_gates.py: the retention gates' statistics, against values by hand."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fusion_gates
import fusion_study

from xinda.models.transformer.connections import RetentionGate

SPEC = {"arch": "transformer", "d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 2,
        "decoder_layers": 2, "fusion": "sublayer", "fusion_function": "mean",
        "fusion_side": "both"}


def test_one_gate_records_g_and_the_cosine_of_what_it_mixes():
    """W = 0, b = 0: g = 0.5 everywhere; current (1, 0) and fusion (1, 1): cos = 1/sqrt 2, and
    (3, 4) against (4, 3): 24/25."""
    gate = RetentionGate(2)
    with torch.no_grad():
        gate.weight.zero_()
    recorder = fusion_gates.GateRecorder()
    recorder.watch("g", gate)
    gate(torch.tensor([[[1.0, 0.0], [3.0, 4.0]]]), torch.tensor([[[1.0, 1.0], [4.0, 3.0]]]))
    [row] = recorder.summary()
    assert row["mean_g"] == 0.5 and row["std_g"] == 0.0 and row["share_above_half"] == 0.0
    assert row["mean_cos_current_fusion"] == pytest.approx((2**-0.5 + 24 / 25) / 2, abs=1e-4)
    assert row["positions"] == 2


def test_every_fusion_point_of_a_model_is_hooked_by_name(make_model, vocab):
    """Sub-layer fusion on 2 + 2 layers: gates after every unit but the first of each stack,
    3 in the encoder and 5 in the decoder; with W = 0 and b = 2 each records g = sigmoid(2)
    exactly; the pairs whose source or target is empty are skipped."""
    model = make_model(SPEC)
    gates = [*model.encoder_connection.gates, *model.decoder_connection.gates]
    with torch.no_grad():
        for gate in gates:
            gate.weight.zero_()
            gate.bias.fill_(2.0)
    translator = SimpleNamespace(
        model=model, tgt_vocab=vocab, device="cpu",
        encode_source=lambda line, pieces_in: [int(w) for w in line.split()] + [vocab.eos]
        if line else None,
        encode_target=lambda line: [int(w) for w in line.split()])
    rows = fusion_gates.gate_statistics(translator, ["5 6 7", "", "8 9"], ["10 11", "12", ""])
    assert [r["point"] for r in rows] == [
        "encoder layer 1 FFN", "encoder layer 2 self-attention", "encoder layer 2 FFN",
        "decoder layer 1 cross-attention", "decoder layer 1 FFN",
        "decoder layer 2 self-attention", "decoder layer 2 cross-attention", "decoder layer 2 FFN"]
    sigmoid2 = 1 / (1 + math.exp(-2))
    assert all(r["mean_g"] == pytest.approx(sigmoid2, abs=1e-4) for r in rows)
    assert all(r["share_above_half"] == 1.0 for r in rows)
    # one pair only: 4 source positions (3 + EOS), 3 target positions (BOS + 2)
    assert [r["positions"] for r in rows] == [4, 4, 4, 3, 3, 3, 3, 3]


def test_layer_fusion_names_layers_and_a_model_without_fusion_is_refused(make_model, vocab):
    model = make_model({**SPEC, "fusion": "layer"})
    recorder = fusion_gates.GateRecorder()
    assert fusion_gates.watch_model(model, recorder) == 2
    model(torch.tensor([[5, 6, vocab.eos]]), torch.tensor([[vocab.bos, 7]]))
    assert [r["point"] for r in recorder.summary()] == ["encoder layer 2", "decoder layer 2"]
    plain = SimpleNamespace(model=make_model({**SPEC, "fusion": "none"}), tgt_vocab=vocab)
    with pytest.raises(SystemExit, match="no fusion"):
        fusion_gates.gate_statistics(plain, [], [])


def test_the_study_averages_gates_per_stack_over_points_and_seeds():
    def run(rows):
        return {"gates": [{"point": p, "mean_g": g, "mean_cos_current_fusion": c}
                          for p, g, c in rows]}

    by_seed = {1: run([("encoder layer 1 FFN", 0.4, 0.8), ("encoder layer 2 FFN", 0.6, 0.6),
                       ("decoder layer 2", 0.3, 0.1)]),
               2: run([("encoder layer 1 FFN", 0.5, 0.7)]),
               3: {}}  # a kept run restored without weights: not measured
    means = fusion_study.gate_means(by_seed)
    assert means == {"encoder": [0.5, 0.7], "decoder": [0.3, 0.1]}
    assert fusion_study.gates_cell(means) == "enc 0.50 (cos 0.70) / dec 0.30 (cos 0.10)"
    assert fusion_study.gate_means({1: {}}) is None and fusion_study.gates_cell(None) == "–"
