"""Would a compiled graph of the whole decoder step close the gap to CTranslate2? An experiment.

    python benchmarks/compiled_step.py --model runs/bench-en-de-1705-seed2/model
        [--batches 1,64] [--steps 20] [--rounds 3] [--threads 1] [--bf16]

For a pre-norm ``transformer`` model without fusion or DLCL, one beam-search decoder step
(beam 5) is written out as a single function over preallocated caches: the self-attention
keys/values of every layer in one (L, R, H, T_max, Dh) buffer written in place, the
cross-attention keys/values of each sentence computed once, attention as matmul + softmax
with additive masks, no Python-side dictionaries or closures. That function is timed eager,
and compiled by ``torch.compile`` (inductor, dynamic shapes, ``freezing`` so that weights are
constants and pre-packed), against ``Transformer.decode`` stepping with its usual caches, in
fp32 (``--bf16``: bfloat16) and int8 (what the written-out step would have to beat; the fbgemm
int8 kernels cannot be compiled).
Prints ms per decoder step for each variant, medians of ``--rounds`` alternated runs. Not a test.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from multi30k import SHARED
from torch import Tensor, nn

from xinda.decode.translator import Translator
from xinda.device import keep_freed_heap

BEAM = 5


class WrittenOutStep(nn.Module):
    """One decoder step of a plain pre-norm Transformer over preallocated caches."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, step: Tensor, self_k: Tensor, self_v: Tensor,
                cross_k: Tensor, cross_v: Tensor, cross_bias: Tensor) -> Tensor:
        """tokens (R,), step (1,) long; self_k/v (L, R, H, T_max, Dh), written at ``step``;
        cross_k/v (L, N, H, S, Dh); cross_bias (N, 1, 1, S) additive -> log-probs (R, V)."""
        m = self.model
        rows, heads, t_max, dh = self_k.size(1), self_k.size(2), self_k.size(3), self_k.size(4)
        sentences, width = cross_k.size(1), heads * dh
        embed = m.tgt_embed
        x = embed.embed(tokens) * embed.scale + embed.positions.index_select(0, step)
        future = torch.arange(t_max, device=tokens.device) > step
        self_bias = torch.zeros(t_max, dtype=x.dtype).masked_fill(future, -math.inf)
        for i, layer in enumerate(m.decoder_layers):
            qkv = layer.self_attn.qkv(layer.self_sub.norm(x)).view(rows, 3, heads, dh)
            self_k[i].index_copy_(2, step, qkv[:, 1].unsqueeze(2))
            self_v[i].index_copy_(2, step, qkv[:, 2].unsqueeze(2))
            attn = _attend(qkv[:, 0].unsqueeze(2), self_k[i], self_v[i], self_bias)
            x = x + layer.self_attn.out(attn.view(rows, width))
            q = layer.cross_attn.q(layer.cross_sub.norm(x)).view(sentences, BEAM, heads, dh)
            attn = _attend(q.transpose(1, 2), cross_k[i], cross_v[i], cross_bias)
            x = x + layer.cross_attn.out(attn.transpose(1, 2).reshape(rows, width))
            h = layer.ffn_sub.norm(x)
            x = x + layer.ffn.w2(F.relu(layer.ffn.w1(h)))
        return torch.log_softmax(m.output(m.decoder_norm(x)).float(), dim=-1)


def _attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(Dh) + bias) v (Vaswani eq. 1)."""
    return torch.softmax((q @ k.transpose(-1, -2)) * q.size(-1) ** -0.5 + bias, dim=-1) @ v


def written_out_inputs(model, src: Tensor, t_max: int) -> tuple[Tensor, ...]:
    """Caches and masks for ``WrittenOutStep`` after encoding ``src`` (N, S)."""
    enc = model.encode(src)
    n, s, d = enc.memory.shape
    heads, layers = model.cfg.heads, len(model.decoder_layers)
    bias = torch.zeros(n, 1, 1, s, dtype=enc.memory.dtype).masked_fill_(
        enc.src_pad[:, None, None, :], -math.inf)
    kv = [layer.cross_attn.kv(enc.memory).view(n, s, 2, heads, d // heads).permute(2, 0, 3, 1, 4)
          for layer in model.decoder_layers]
    cross_k = torch.stack([x[0] for x in kv]).contiguous()
    cross_v = torch.stack([x[1] for x in kv]).contiguous()
    self_k = torch.zeros(layers, n * BEAM, heads, t_max, d // heads, dtype=enc.memory.dtype)
    return self_k, torch.zeros_like(self_k), cross_k, cross_v, bias


def run_written_out(step_fn, model, src: Tensor, steps: int) -> Tensor:
    inputs = written_out_inputs(model, src, steps + 1)
    tokens = torch.full((src.size(0) * BEAM,), model.vocab.bos)
    for t in range(steps):
        logp = step_fn(tokens, torch.tensor([t]), *inputs)
    return logp


def run_decode(model, src: Tensor, steps: int) -> Tensor:
    enc, state = model.encode(src).expand(BEAM), {}
    tokens = torch.full((src.size(0) * BEAM, 1), model.vocab.bos)
    for _ in range(steps):
        logits, _ = model.decode(tokens, enc, state)
        logp = torch.log_softmax(logits[:, -1].float(), dim=-1)
    return logp


def source_batch(translator: Translator, lines: list[str]) -> Tensor:
    ids = [translator.encode_source(line, False) for line in lines]
    src = torch.full((len(ids), max(map(len, ids))), translator.src_vocab.pad)
    for row, seq in enumerate(ids):
        src[row, : len(seq)] = torch.tensor(seq)
    return src


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args()
    test = SHARED / "multi30k" / "test2016.en"
    if not test.exists():
        sys.exit(f"skipped: needs {test}")
    torch.set_num_threads(args.threads)
    keep_freed_heap()
    import torch._inductor.config as inductor_config
    inductor_config.freezing = True
    translator = Translator.load(args.model)
    model = translator.model.eval()
    if model.cfg.arch != "transformer" or model.decoder_connection is not None or \
            model.cfg.norm != "pre":
        sys.exit("this experiment writes out a plain pre-norm Transformer decoder only")
    int8 = translator.int8_model()
    if args.bf16:
        model = copy.deepcopy(model).to(torch.bfloat16)
    eager = WrittenOutStep(model).eval()
    compiled = torch.compile(eager, dynamic=True)
    lines = test.read_text(encoding="utf-8").splitlines()
    variants = {"Transformer.decode": lambda src: run_decode(model, src, args.steps),
                "Transformer.decode, int8": lambda src: run_decode(int8, src, args.steps),
                "written out, eager": lambda src: run_written_out(eager, model, src, args.steps),
                "written out, compiled": lambda src: run_written_out(compiled, model, src,
                                                                      args.steps)}
    with torch.inference_mode():
        for batch in map(int, args.batches.split(",")):
            src = source_batch(translator, lines[:batch])
            start = time.perf_counter()
            reference = variants["Transformer.decode"](src)
            for name, fn in variants.items():  # warm-up; the first compiled call compiles
                diff = (fn(src) - reference).abs().max().item()
                print(f"batch {batch}: {name} max |log-prob difference| {diff:.1e}")
            print(f"batch {batch}: warm-up incl. compile {time.perf_counter() - start:.1f} s")
            times: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(args.rounds):
                for name, fn in variants.items():
                    start = time.perf_counter()
                    fn(src)
                    times[name].append((time.perf_counter() - start) / args.steps * 1e3)
            for name, ms in times.items():
                print(f"batch {batch} ({batch * BEAM} rows): {name} "
                      f"{statistics.median(ms):.2f} ms per step")


if __name__ == "__main__":
    main()
