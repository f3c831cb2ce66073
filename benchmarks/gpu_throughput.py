"""Training throughput and model FLOP utilisation (MFU) of xinda's training step, and beam-5
decoding speed, on whatever device there is (issue 15: measured on a lent H200).

    python benchmarks/gpu_throughput.py [--presets transformer-base,transformer-big]
        [--max-tokens 8192,16384,32768] [--updates 30] [--warmup 5] [--vocab 32000]
        [--lengths-from DATA_BIN] [--precision bf16] [--device auto] [--peak-tflops X]
        [--decode-model DIR --decode-input FILE [--decode-beams 5,1] [--decode-batch 64,128,256]
         [--decode-repeats 3]] [--out docs/results/gpu_throughput]

Each (preset, batch size) runs the training step of ``xinda.train`` (``batch_loss`` with the
chunked label-smoothed loss, fused Adam, autocast) on synthetic batches: random token ids with
sentence lengths drawn uniformly from 5-60 (about WMT's mean) or those of a prepared corpus's
training pairs (``--lengths-from``), grouped by ``make_batches`` into
batches of at most ``--max-tokens`` padded tokens, as training groups real data. Timed over
``--updates`` updates after ``--warmup`` untimed ones, with the device synchronised.

Model FLOPs count useful work only (no padding): 6 x (matmul parameters x the tokens they read:
source tokens for the encoder and the cross-attention keys/values, target tokens for the rest)
for the linear layers, embeddings excluded, output projection included, plus 3 x 4·d per query-key
pair for every attention layer (scores and weighted sum; forward x 3 for training). MFU divides
the achieved model FLOP/s by the device's dense bf16 peak (``--peak-tflops``; by default a
known figure for the GPU, e.g. 989 for an H100/H200, and always also the measured peak of a
large bf16 matmul, which is printed). ``--decode-model`` (a trained model directory) adds
decoding of ``--decode-input`` (raw lines) in sentences/s, at every beam size and batch size
given, each the median of ``--decode-repeats`` passes (the settings take turns in each round);
``--presets ''`` skips the training rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from multi30k import code_version, markdown_table

from xinda.config import TrainConfig
from xinda.data.batching import collate, make_batches
from xinda.data.vocab import VocabInfo
from xinda.device import pick_device, tune_training_memory
from xinda.errors import XindaError
from xinda.models.registry import build_model, resolve
from xinda.train.loss import LossSetup, batch_loss
from xinda.train.schedule import make_optimizer

ROOT = Path(__file__).resolve().parents[1]
# dense bf16 TFLOP/s by a part of the device name, the first match counting (PCIe and NVL parts
# before the SXM ones they share a name with)
KNOWN_PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H200 NVL": 835.0, "H200": 989.0,
                     "H100": 989.0, "A100": 312.0, "L40S": 362.0}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak_tflops(device: torch.device, n: int, repeats: int = 20) -> float:
    """Measured bf16 matmul throughput of an n x n x n product."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync(device)
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def synthetic_corpus(sentences: int, vocab: int, lengths_from: Path | None = None,
                     seed: int = 1) -> tuple[list, list]:
    """Random source/target id arrays. Lengths: source 5-60, target within +-20 % of it; or,
    with ``lengths_from`` (a ``xinda prepare`` output folder), the (source, target) lengths of
    pairs drawn from its training split."""
    rng = np.random.default_rng(seed)
    if lengths_from is None:
        src_lens = rng.integers(5, 61, sentences)
        tgt_lens = np.clip((src_lens * rng.uniform(0.8, 1.2, sentences)).astype(int), 1, None)
    else:
        src_all, tgt_all = (np.diff(np.load(lengths_from / f"train.{side}.offsets.npy"))
                            for side in ("src", "tgt"))
        pick = rng.integers(0, len(src_all), sentences)
        src_lens, tgt_lens = src_all[pick], tgt_all[pick]
    return ([rng.integers(4, vocab, n) for n in src_lens],  # ids above the specials
            [rng.integers(4, vocab, n) for n in tgt_lens])


def matmul_parameters(model: torch.nn.Module) -> tuple[int, int, int, int]:
    """Parameters of the linear layers that read source tokens (the encoder's and the
    decoder's cross-attention key/value projections) and of those that read target tokens (the
    rest of the decoder), and the output projection's (embeddings excluded; a tied output
    matrix counts here): (encoder, decoder, cross-attention keys/values, output)."""
    linears = [(n, m.weight.numel()) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear)]
    enc = sum(k for n, k in linears if n.startswith("encoder"))
    kv = sum(k for n, k in linears if n.startswith("decoder") and n.endswith("cross_attn.kv"))
    dec = sum(k for n, k in linears if n.startswith("decoder")) - kv
    return enc, dec, kv, model.output.weight.numel()


def model_flops(batch, pad: int, cfg, params: tuple[int, int, int, int]) -> float:
    """Training FLOPs of one batch without padding (module docstring)."""
    src_len = batch.src.ne(pad).sum(1).double()
    tgt_len = batch.target.ne(pad).sum(1).double()
    enc, dec, kv, out = params
    linear = 6 * ((enc + kv) * src_len.sum() + (dec + out) * tgt_len.sum())
    pairs = (cfg.encoder_layers * (src_len**2).sum()
             + cfg.decoder_layers * ((tgt_len * (tgt_len + 1) / 2) + tgt_len * src_len).sum())
    return float(linear + 3 * 4 * cfg.d_model * pairs)


def train_throughput(preset: str, max_tokens: int, args: argparse.Namespace,
                     device: torch.device) -> dict:
    vocab = VocabInfo(args.vocab, args.vocab, 0, 1, 2, True)
    cfg = resolve({"preset": preset})
    torch.manual_seed(1)
    model = build_model(cfg, vocab).to(device).train()
    params = matmul_parameters(model)
    tc = TrainConfig(lr=1e-4, **({} if args.loss_chunk is None else
                                 {"loss_chunk": args.loss_chunk}))
    optimizer = make_optimizer(tc, model.parameters())
    setup = LossSetup(tc.label_smoothing, vocab.pad, tc.loss_chunk, args.precision, device)
    need = (args.updates + args.warmup) * max_tokens // 8 + 1000  # sentences of 8+ tokens
    src, tgt = synthetic_corpus(need, args.vocab, args.lengths_from)
    lens = np.array([len(s) for s in src]), np.array([len(t) for t in tgt])
    groups = make_batches(*lens, max_tokens, seed=1, epoch=0)[: args.updates + args.warmup]
    on_cpu = [collate(g, src, tgt, vocab.pad, vocab.bos, vocab.eos) for g in groups]
    # each batch's FLOPs and tokens counted here, on the CPU: counting them on the GPU inside
    # the timed loop would add kernels and a host sync to every update
    work = [(model_flops(b, vocab.pad, cfg, params), float(b.ntokens)) for b in on_cpu]
    batches = [b.to(device) for b in on_cpu]
    flops = tokens = 0.0
    for i, batch in enumerate(batches):
        if i == args.warmup:
            sync(device)
            start = time.perf_counter()
        loss, _ = batch_loss(model, model, batch, setup)
        (loss / batch.ntokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i >= args.warmup:
            flops, tokens = flops + work[i][0], tokens + work[i][1]
    sync(device)
    seconds = time.perf_counter() - start
    peak_mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {"preset": preset, "max_tokens": max_tokens, "parameters": model.num_parameters(),
            "updates": len(batches) - args.warmup, "seconds": round(seconds, 2),
            "tgt_tok_per_s": round(tokens / seconds),
            "model_tflops": round(flops / seconds / 1e12, 4),
            "peak_memory_gib": None if peak_mem is None else round(peak_mem, 1)}


def decode_speed(model_dir: Path, input_file: Path, device: torch.device, precision: str,
                 beams: list[int], batch_sizes: list[int], repeats: int) -> list[dict]:
    """Sentences/s of decoding ``input_file`` for every (beam, batch size): the median of
    ``repeats`` passes, the settings taking turns within each round."""
    from xinda.decode.translator import Translator

    lines = input_file.read_text(encoding="utf-8").splitlines()
    translator = Translator.load(model_dir, device=str(device))
    settings = [{"beam": beam, "batch_size": size, "precision": precision}
                for beam in beams for size in batch_sizes]
    translator.translate_text(lines[:64], **settings[0])  # warm-up
    seconds: list[list[float]] = [[] for _ in settings]
    for _ in range(repeats):
        for options, times in zip(settings, seconds):
            sync(device)
            start = time.perf_counter()
            translator.translate_text(lines, **options)
            sync(device)
            times.append(time.perf_counter() - start)
    return [{"model": str(model_dir), "sentences": len(lines), **options, "repeats": repeats,
             "sents_per_s": round(len(lines) / statistics.median(times), 1)}
            for options, times in zip(settings, seconds)]


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="transformer-base,transformer-big")
    ap.add_argument("--max-tokens", type=int_list, default=[8192, 16384, 32768])
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--lengths-from", type=Path, default=None,
                    help="a prepared data folder: use its training pairs' lengths")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--loss-chunk", type=int, default=None,
                    help="train.loss_chunk (default: the config's, tuned for CPU memory; "
                         "0 = the whole batch at once)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--cudnn-attention", action="store_true",
                    help="keep cuDNN's attention kernel, which xinda turns off on CUDA "
                         "(xinda.device.skip_cudnn_attention): the other arm of that A/B")
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument("--matmul-size", type=int, default=None, help="default 8192 GPU, 2048 CPU")
    ap.add_argument("--decode-model", type=Path)
    ap.add_argument("--decode-input", type=Path)
    ap.add_argument("--decode-beams", type=int_list, default=[5, 1], help="beam sizes (1: greedy)")
    ap.add_argument("--decode-batch", type=int_list, default=[64, 128, 256],
                    help="sentences per batch")
    ap.add_argument("--decode-repeats", type=int, default=3, help="passes; the median counts")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "gpu_throughput")
    args = ap.parse_args()
    if (args.decode_model is None) != (args.decode_input is None):
        ap.error("--decode-model and --decode-input go together")
    if not args.presets.strip(",") and args.decode_model is None:
        ap.error("--presets '' measures nothing without --decode-model and --decode-input")
    device = pick_device(args.device)
    if args.cudnn_attention:
        torch.backends.cuda.enable_cudnn_sdp(True)
    tune_training_memory(TrainConfig().onednn_cache, TrainConfig().keep_heap)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    measured = matmul_peak_tflops(device, args.matmul_size or (8192 if device.type == "cuda"
                                                                 else 2048))
    known = args.peak_tflops or next((v for k, v in KNOWN_PEAK_TFLOPS.items() if k in name), None)
    print(f"device {name}: measured bf16 matmul {measured:.3f} TFLOP/s; "
          f"spec peak {known or 'unknown'}", flush=True)
    report = {"device": name, "torch": torch.__version__, "precision": args.precision,
              "loss_chunk": TrainConfig().loss_chunk if args.loss_chunk is None
              else args.loss_chunk, "vocab": args.vocab,
              "lengths_from": str(args.lengths_from or "synthetic"),
              "cudnn_attention": (torch.backends.cuda.cudnn_sdp_enabled()
                                  if device.type == "cuda" else None),
              "matmul_tflops_measured": round(measured, 3), "spec_peak_tflops": known,
              "train": [], "command": " ".join(["python", *sys.argv]),
              "code": code_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for preset in filter(None, args.presets.split(",")):
        for max_tokens in args.max_tokens:
            row = train_throughput(preset, max_tokens, args, device)
            row["mfu_vs_measured_matmul"] = round(row["model_tflops"] / measured, 3)
            row["mfu_vs_spec_peak"] = round(row["model_tflops"] / known, 3) if known else None
            report["train"].append(row)
            print(json.dumps(row), flush=True)
            write_report(report, args.out)  # after every row: a later crash keeps these
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
    if args.decode_model and args.decode_input:
        report["decode"] = decode_speed(args.decode_model, args.decode_input, device,
                                        args.precision, args.decode_beams, args.decode_batch,
                                        args.decode_repeats)
        for row in report["decode"]:
            print(json.dumps(row), flush=True)
    write_report(report, args.out)
    print(f"wrote {args.out.with_suffix('.json')} and .md")


def write_report(report: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    out.with_suffix(".md").write_text(markdown(report))


def markdown(report: dict) -> str:
    """The report as the tables of ``docs/results``."""
    header = ["preset", "max tokens", "parameters", "tgt tok/s", "model TFLOP/s",
              "MFU vs measured matmul", "MFU vs spec peak", "peak GiB"]
    rows = [[r["preset"], r["max_tokens"], f"{r['parameters']:,}", r["tgt_tok_per_s"],
             r["model_tflops"], r["mfu_vs_measured_matmul"], r["mfu_vs_spec_peak"] or "-",
             r["peak_memory_gib"] or "-"] for r in report["train"]]
    head = (f"`{report['command']}` on {report['device']}, {report['date']}, torch "
            f"{report['torch']}, {report['precision']}, loss chunk "
            f"{report.get('loss_chunk', '?')}; measured bf16 matmul "
            f"{report['matmul_tflops_measured']} TFLOP/s, spec peak "
            f"{report['spec_peak_tflops'] or 'unknown'}"
            + ("" if report.get("cudnn_attention") is None else
               f"; cuDNN attention {'on' if report['cudnn_attention'] else 'off'}")
            + f"; lengths {report.get('lengths_from', 'synthetic')}.")
    lines = [head, "", *markdown_table(header, rows)]
    if report.get("decode"):
        first = report["decode"][0]
        lines += ["", (f"Decoding {first['model']}: {first['sentences']} sentences, "
                       f"{first['precision']}, the median of {first['repeats']} passes."), "",
                  *markdown_table(["beam", "batch", "sentences/s"],
                                  [[d["beam"], d["batch_size"], d["sents_per_s"]]
                                   for d in report["decode"]])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    try:
        main()
    except XindaError as err:  # a bad preset or model directory: one line, exit 1
        sys.exit(f"gpu_throughput: {err}")
