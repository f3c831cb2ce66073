"""benchmarks/fusion_gates.py: the retention gates' statistics, against values by hand."""

from __future__ import annotations

import json
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


def test_a_scalar_gate_counts_one_g_per_position(make_model, vocab):
    model = make_model({**SPEC, "fusion_gate": "scalar", "fusion_side": "encoder"})
    with torch.no_grad():
        for gate in model.encoder_connection.gates:
            gate.weight.zero_()
            gate.bias.fill_(-1.0)
    recorder = fusion_gates.GateRecorder()
    fusion_gates.watch_model(model, recorder)
    model(torch.tensor([[5, 6, 7, 8, vocab.eos]]), torch.tensor([[vocab.bos, 7]]))
    rows = recorder.summary()
    assert [r["values"] for r in rows] == [5, 5, 5]  # (1, 5, 1): one g per source position
    assert rows[0]["mean_g"] == pytest.approx(1 / (1 + math.e), abs=1e-4)
    assert rows[0]["share_above_half"] == 0.0


def test_the_study_averages_gates_per_stack_over_points_and_seeds():
    def run(rows):
        return {"gates": [{"point": p, "mean_g": g, "mean_cos_current_fusion": c}
                          for p, g, c in rows]}

    by_seed = {1: run([("encoder layer 1 FFN", 0.4, 0.8), ("encoder layer 2 FFN", 0.6, 0.6),
                       ("decoder layer 2", 0.3, 0.1)]),
               2: run([("encoder layer 1 FFN", 0.5, 0.7)]),
               3: {}}  # a kept run restored without weights: not measured
    means = fusion_study.gate_means(by_seed)
    assert means["seeds"] == [1, 2]
    assert means["sides"]["encoder"] == pytest.approx([0.5, 0.7])
    assert means["sides"]["decoder"] == pytest.approx([0.3, 0.1])
    assert fusion_study.gates_cell(means) == "enc 0.50 (cos 0.70) / dec 0.30 (cos 0.10), seeds 1, 2"
    # rounded once, in the cell: 0.4449 is 0.44 (before: 0.445 first, then 0.45)
    one = fusion_study.gate_means({2: run([("decoder layer 2", 0.4449, 0.3)])})
    assert fusion_study.gates_cell(one) == "dec 0.44 (cos 0.30), seed 2"
    assert fusion_study.gate_means({1: {}}) is None and fusion_study.gates_cell(None) == "–"


@pytest.fixture
def finished_fusion_run(tmp_path, monkeypatch):
    """A finished sub-layer fusion run's folder (config.yaml, averaged weights, log.csv with
    its validation curve) and its result; ``calls`` records the measuring commands, which a
    stub answers by writing gates.json (or failing, ``fail[0] = True``)."""
    import yaml

    cfg = {"model": {"preset": "transformer-small", "fusion": "sublayer"},
           "train": {"threads": 1, "seed": 1}}
    run_dir, model_dir = tmp_path / "sublayer" / "seed1", tmp_path / "sublayer" / "seed1" / "model"
    model_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    (model_dir / "averaged.safetensors").write_bytes(b"")
    (model_dir / "log.csv").write_text("step,epoch,valid_loss\n100,1,3.5\n200,2,3.25\n")
    result = {"config": cfg, "updates": 200, "valid_curve": [[100, 3.5], [200, 3.25]]}
    (run_dir / "result.json").write_text(json.dumps(result))
    calls, fail = [], [False]
    rows = [{"point": "encoder layer 1 FFN", "mean_g": 0.5, "mean_cos_current_fusion": 0.9}]

    def stub(cmd, **_):
        calls.append(cmd)
        if not fail[0]:
            Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps({"gates": rows}))
        return SimpleNamespace(returncode=int(fail[0]))

    monkeypatch.setattr(fusion_study.subprocess, "run", stub)
    return SimpleNamespace(run_dir=run_dir, result=result, calls=calls, fail=fail, rows=rows)


def test_the_study_measures_a_finished_fusion_runs_gates_once(finished_fusion_run):
    run = finished_fusion_run
    fusion_study.add_gates("de-en", run.run_dir, run.result)
    assert run.result["gates"] == run.rows
    assert json.loads((run.run_dir / "result.json").read_text())["gates"] == run.rows
    [cmd] = run.calls
    assert cmd[cmd.index("--checkpoint") + 1].endswith("model/averaged.safetensors")
    fusion_study.add_gates("de-en", run.run_dir, run.result)  # measured already
    assert len(run.calls) == 1


@pytest.mark.parametrize("change", ["baseline", "other weights", "no config", "other recipe",
                                    "no weights"])
def test_the_study_leaves_runs_it_cannot_measure_alone(finished_fusion_run, change):
    """Before a review: a missing config.yaml crashed the study; weights of another run of
    the same recipe (its validation curve differs) would have been measured for this one."""
    run = finished_fusion_run
    if change == "baseline":
        run.result["config"] = {**run.result["config"], "model": {"preset": "transformer-small"}}
    elif change == "other weights":
        run.result["valid_curve"] = [[100, 3.5], [200, 3.0]]
    elif change == "no config":
        (run.run_dir / "config.yaml").unlink()
    elif change == "other recipe":
        (run.run_dir / "config.yaml").write_text("model: {preset: transformer-small}\n")
    else:
        (run.run_dir / "model" / "averaged.safetensors").unlink()
    fusion_study.add_gates("de-en", run.run_dir, run.result)
    assert not run.calls and "gates" not in run.result


def test_a_failed_measurement_leaves_the_result_as_it_was(finished_fusion_run, capsys):
    run = finished_fusion_run
    run.fail[0] = True
    fusion_study.add_gates("de-en", run.run_dir, run.result)
    assert len(run.calls) == 1 and "gates" not in run.result
    assert "measuring the gates failed" in capsys.readouterr().out
    assert "gates" not in json.loads((run.run_dir / "result.json").read_text())


def test_the_script_refuses_a_missing_model_folder_in_one_line(tmp_path):
    import subprocess

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "fusion_gates.py"
    text = tmp_path / "t.txt"
    text.write_text("a\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "none"), "--src",
                           str(text), "--tgt", str(text)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip() == f"fusion_gates: {tmp_path / 'none'}: model directory not found"
