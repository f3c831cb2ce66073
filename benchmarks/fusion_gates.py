"""How much of the fusion each retention gate lets through, in a trained fusion model.

    python benchmarks/fusion_gates.py MODEL_DIR --src valid.de --tgt valid.en
        [--checkpoint MODEL_DIR/averaged.safetensors] [--lines 500] [--json OUT.json]
        [--device cpu] [--untrained]

The fused input of each fusion point is LN((1 - g)·current + g·fusion) (``RetentionGate``,
fusion paper eqs. 8-9 and 11-12): g is the weight of the fusion of earlier outputs against the
current (sub-)layer's own output. This runs the model teacher-forced over the first ``--lines``
sentence pairs, one pair at a time (no padding to leave out), and prints, per fusion point, the
mean of g over every position and dimension, its standard deviation, the share of g above
0.5, and the mean cosine similarity of the two vectors it mixes. A mean g near 0 says the model
learned to ignore the fusion there; near 1, to replace the (sub-)layer's output by it; a cosine
near 1, that the fusion carries little the current output does not (in a pre-norm stack both
hold the residual stream). ``--untrained`` measures the same model as training starts it
(``train.seed``) instead: where the gates started. Not a test; seconds on a CPU for a small
model.
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import islice
from pathlib import Path

import torch

from xinda.decode.translator import Translator
from xinda.errors import XindaError
from xinda.models.registry import build_model
from xinda.models.transformer.connections import InformationFusion, RetentionGate
from xinda.utils import read_lines

SUBLAYERS = {"encoder": ("self-attention", "FFN"),
             "decoder": ("self-attention", "cross-attention", "FFN")}


def unit_name(side: str, unit: int, fusion: str) -> str:
    """'encoder layer 2 FFN' for 0-based ``unit`` of a sub-layer-wise stack, 'decoder layer 3'
    for a layer-wise one."""
    if fusion == "layer":
        return f"{side} layer {unit + 1}"
    names = SUBLAYERS[side]
    return f"{side} layer {unit // len(names) + 1} {names[unit % len(names)]}"


class GateRecorder:
    """Sums of g, g², g > 0.5 and of cos(current, fusion) per gate, from forward hooks on each
    ``RetentionGate``."""

    def __init__(self):
        # name -> [sum g, sum g², count g > 0.5, values, sum cos, positions]
        self.sums: dict[str, list[float]] = {}
        self.handles = []

    def watch(self, name: str, gate: RetentionGate) -> None:
        def hook(module: RetentionGate, inputs: tuple, _output) -> None:
            current, fusion = inputs
            g = module.gate(current, fusion).float()
            cos = torch.cosine_similarity(current.float(), fusion.float(), dim=-1)
            s = self.sums.setdefault(name, [0.0, 0.0, 0.0, 0, 0.0, 0])
            s[0] += g.sum().item()
            s[1] += g.square().sum().item()
            s[2] += g.gt(0.5).sum().item()
            s[3] += g.numel()
            s[4] += cos.sum().item()
            s[5] += cos.numel()

        self.handles.append(gate.register_forward_hook(hook))

    def summary(self) -> list[dict]:
        rows = []
        for name, (total, squares, above, n, cosines, positions) in self.sums.items():
            mean = total / n
            rows.append({"point": name, "mean_g": round(mean, 4),
                         "std_g": round(max(squares / n - mean * mean, 0.0) ** 0.5, 4),
                         "share_above_half": round(above / n, 4),
                         "mean_cos_current_fusion": round(cosines / positions, 4),
                         "positions": positions, "values": n})
        return rows


def watch_model(model: torch.nn.Module, recorder: GateRecorder) -> int:
    """Hook every fusion point of a Transformer; the number of points hooked."""
    fusion = model.cfg.fusion
    hooked = 0
    for side in ("encoder", "decoder"):
        connection = getattr(model, f"{side}_connection", None)
        if isinstance(connection, InformationFusion):
            for gate, unit in zip(connection.gates, connection.points):
                recorder.watch(unit_name(side, unit, fusion), gate)
                hooked += 1
    return hooked


def gate_statistics(translator: Translator, src_lines: list[str], tgt_lines: list[str]
                    ) -> list[dict]:
    model, vocab = translator.model, translator.tgt_vocab
    recorder = GateRecorder()
    if not watch_model(model, recorder):
        raise SystemExit("fusion_gates: the model has no fusion (model.fusion: none)")
    longest = model.cfg.max_positions  # positions a side may take (BOS/EOS included)
    with torch.inference_mode():
        for src_line, tgt_line in zip(src_lines, tgt_lines):
            src = translator.encode_source(src_line, pieces_in=False)
            tgt = translator.encode_target(tgt_line)
            if src is None or not tgt:
                continue
            # as in training: the source truncated to the positions, the target prefix as well
            prev = torch.tensor([[vocab.bos, *tgt][:longest]], device=translator.device)
            model(torch.tensor([src], device=translator.device), prev)
    return recorder.summary()


def markdown(rows: list[dict]) -> str:
    lines = ["| fusion point | mean g | std g | share g > 0.5 | cos(current, fusion) |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['point']} | {r['mean_g']:.3f} | {r['std_g']:.3f} | "
              f"{r['share_above_half']:.1%} | {r['mean_cos_current_fusion']:.3f} |"
              for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--src", type=Path, required=True, help="source sentences, one a line")
    ap.add_argument("--tgt", type=Path, required=True, help="their references")
    ap.add_argument("--checkpoint", help="a weights file (default: MODEL_DIR's own choice, as "
                    "xinda translate makes it)")
    ap.add_argument("--lines", type=int, default=500, help="the first N pairs")
    ap.add_argument("--json", type=Path, help="write the rows here as well")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    ap.add_argument("--untrained", action="store_true", help="measure the model freshly "
                    "initialised instead (the reference the trained gates moved from)")
    args = ap.parse_args()
    translator = Translator.load(args.model_dir, args.checkpoint, device=args.device)
    if args.untrained:  # the same architecture as it starts training (train.seed's init)
        torch.manual_seed(translator.cfg.train.seed)
        translator.model = build_model(translator.model.cfg, translator.model.vocab).to(
            translator.device).eval()
    src, tgt = (list(islice(read_lines(path), args.lines)) for path in (args.src, args.tgt))
    if len(src) != len(tgt):
        sys.exit(f"fusion_gates: {args.src} and {args.tgt} have {len(src)} and {len(tgt)} of "
                 f"the first {args.lines} lines")
    rows = gate_statistics(translator, src, tgt)
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps({"model_dir": str(args.model_dir),
                                         "checkpoint": args.checkpoint, "lines": len(src),
                                         "untrained": args.untrained,
                                         "gates": rows}, indent=1))


if __name__ == "__main__":
    try:
        main()
    except XindaError as e:  # a missing model folder or file, unreadable text: one line
        sys.exit(f"fusion_gates: {e}")
