"""Decoding speed of one trained model on xinda (fp32, bf16, int8) and on CTranslate2 (the same
model exported with ``xinda export ctranslate2``, float32 and int8; each CTranslate2 engine in a
process of its own), interleaved (issue 15).

    python benchmarks/decode_speed.py [--model runs/serve/multi30k-en-de-1315] [--threads 2]
        [--repeats 3] [--latency 100] [--sentences 0] [--out-dir docs/results]

Every system decodes the same sentencepiece pieces of Multi30k test2016 (1000 sentences):
beam 5 and greedy, batches of up to 64 sentences sorted by length, max length 1.5 * src + 10;
and, for the latency rows, ``--latency`` sentences one at a time (batch 1; the median over
sentences). Runs are interleaved (system A, B, ..., then again) and the median of ``--repeats``
is kept, since the machine is shared. BLEU (sacrebleu, detokenised by the model's own pipeline) is
reported for each system; CTranslate2 divides scores by the length (length_penalty 1) where xinda
uses GNMT's ((5 + |y|) / 6)^alpha, so their beam outputs can differ slightly. xinda ends a
sentence's beam search after ``beam`` finished hypotheses (``decode.stop: beam``); the row
"stop=best" ends it once a step's best candidate is finished, the rule CTranslate2 uses; the row
"int8_scale=row" quantises each row's activations by its own range (batch-independent). With
``--threads N`` > 1 the rows "workers=N" decode in N one-thread xinda processes, and
"ctranslate2 int8 inter=N" in N one-thread CTranslate2 replicas (its ``inter_threads``). Writes
``decode_speed.{json,md}`` to ``--out-dir``. Not a test: it takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import sacrebleu
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multi30k import ROOT, SERVE_MODEL, SERVE_MODEL_HINT, SHARED, markdown_table

from xinda.decode.translator import Translator

BATCH, BEAM = 64, 5
Decode = Callable[[list[list[str]], int, int], list[list[str]]]  # pieces, beam, batch -> pieces


def xinda_decoder(translator: Translator, precision: str, stop: str = "beam",
                  workers: int = 1, int8_scale: str = "batch") -> Decode:
    """xinda's own decoding of pieces at ``precision``, ending beams by the ``stop`` rule, in
    this process (``workers`` 1) or in that many one-thread processes; int8 with activation
    scales per batch or per row (``int8_scale``)."""
    def decode(sources: list[list[str]], beam: int, batch: int) -> list[list[str]]:
        lines = [" ".join(s) for s in sources]
        out = translator.translate(lines, input_format="pieces", output_format="pieces",
                                   beam=beam, batch_size=batch, precision=precision,
                                   max_len_a=1.5, max_len_b=10, stop=stop, workers=workers,
                                   int8_scale=int8_scale)
        return [nbest[0].text.split() for nbest in out]
    return decode


def ct2_decoder(ct2_dir: Path, compute_type: str, threads: int, inter: int = 1) -> Decode:
    """CTranslate2 on the exported model, batched as ../shared/bench/peers/ct2_translate.py
    (``inter`` 1: ``threads`` intra-op threads); with ``inter`` > 1, that many model replicas
    of one thread each decode the batches side by side (CTranslate2's ``inter_threads``).
    Each runs in a process of its own: CTranslate2 bundles its own GNU OpenMP, and beside
    torch's in one process their spinning threads slowed xinda's 2-thread rows up to 5x."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    engine = context.Process(target=_ct2_serve, daemon=True,
                             args=(theirs, str(ct2_dir), compute_type, threads, inter))
    engine.start()
    theirs.close()  # (the child's end: kept open here, a dead child would never be noticed)

    def decode(sources: list[list[str]], beam: int, batch: int) -> list[list[str]]:
        ours.send((sources, beam, batch))
        while not ours.poll(1.0):
            if not engine.is_alive():
                sys.exit(f"the CTranslate2 {compute_type} process died (exit code "
                         f"{engine.exitcode})")
        return ours.recv()
    return decode


def _ct2_serve(conn, ct2_dir: str, compute_type: str, threads: int, inter: int) -> None:
    """The CTranslate2 process of ``ct2_decoder``: decodes what ``conn`` sends until it closes."""
    import ctranslate2

    engine = ctranslate2.Translator(ct2_dir, device="cpu",
                                    intra_threads=threads if inter == 1 else 1,
                                    inter_threads=inter, compute_type=compute_type)
    while True:
        try:
            sources, beam, batch = conn.recv()
        except EOFError:
            return
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
        out: list[list[str]] = [[] for _ in sources]
        pending = []
        for start in range(0, len(order), batch):
            rows = order[start:start + batch]
            chunk = [sources[i] for i in rows]  # the export adds the source EOS
            limit = int(1.5 * max(len(s) for s in chunk) + 10)
            results = engine.translate_batch(chunk, beam_size=beam, max_batch_size=batch,
                                             max_decoding_length=limit, length_penalty=1.0,
                                             asynchronous=inter > 1)
            pending.append((rows, results))
        for rows, results in pending:
            for i, result in zip(rows, results):
                out[i] = (result.result() if inter > 1 else result).hypotheses[0]
        conn.send(out)


def systems(translator: Translator, model_dir: Path, work: Path, threads: int
            ) -> dict[str, Decode]:
    """The decoders to compare; CTranslate2's only when it is installed."""
    found = {f"xinda {p}": xinda_decoder(translator, p) for p in ("fp32", "bf16", "int8")}
    found["xinda int8 stop=best"] = xinda_decoder(translator, "int8", "best")
    # (a Translator of its own: each keeps one int8 copy, made again for another scale)
    found["xinda int8 int8_scale=row"] = xinda_decoder(Translator.load(model_dir), "int8",
                                                       int8_scale="row")
    if threads > 1:  # the same cores as processes of one thread each
        found[f"xinda int8 workers={threads}"] = xinda_decoder(translator, "int8",
                                                               workers=threads)
        found[f"xinda int8 stop=best workers={threads}"] = xinda_decoder(
            translator, "int8", "best", workers=threads)
    try:
        from xinda.export.ctranslate2 import export_ctranslate2

        export_ctranslate2(model_dir, work / "ct2")
        for compute_type, name in (("float32", "ctranslate2 fp32"), ("int8", "ctranslate2 int8")):
            found[name] = ct2_decoder(work / "ct2", compute_type, threads)
        if threads > 1:
            found[f"ctranslate2 int8 inter={threads}"] = ct2_decoder(work / "ct2", "int8",
                                                                     threads, inter=threads)
    except ImportError as err:
        print(f"CTranslate2 rows skipped: {err}", file=sys.stderr)
    return found


def timed(decode: Decode, sources: list[list[str]], beam: int, batch: int
          ) -> tuple[float, list[list[str]]]:
    start = time.perf_counter()
    out = decode(sources, beam, batch)
    return time.perf_counter() - start, out


def latency_ms(decode: Decode, sources: list[list[str]], beam: int) -> float:
    """Median milliseconds per sentence, one sentence per call."""
    times = []
    for source in sources:
        start = time.perf_counter()
        decode([source], beam, 1)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def measure(found: dict[str, Decode], sources: list[list[str]], refs: list[str],
            detok: Callable[[list[str]], str], repeats: int, latency: int) -> list[dict]:
    """Interleaved repeats of every system; medians. Each system first decodes a few
    sentences untimed: one-off set-up (int8 quantisation, CTranslate2's first call) is not
    part of the first timed repeat."""
    runs: dict[tuple[str, int], list[float]] = {}
    outputs: dict[tuple[str, int], list[list[str]]] = {}
    latencies: dict[str, list[float]] = {}
    for decode in found.values():
        decode(sources[:BATCH], BEAM, BATCH)
    for _ in range(repeats):
        for name, decode in found.items():
            for beam in (BEAM, 1):
                seconds, outputs[name, beam] = timed(decode, sources, beam, BATCH)
                runs.setdefault((name, beam), []).append(seconds)
                print(f"{name} beam {beam}: {len(sources) / seconds:.1f} sentences/s",
                      flush=True)
            if latency:  # within the repeat too: a busy spell hits every system alike
                latencies.setdefault(name, []).append(latency_ms(decode, sources[:latency],
                                                                 BEAM))
    rows = []
    for name, decode in found.items():
        row = {"system": name}
        for beam in (BEAM, 1):
            hyps = [detok(p) for p in outputs[name, beam]]
            row[f"beam{beam}_sents_per_s"] = len(sources) / statistics.median(runs[name, beam])
            row[f"beam{beam}_bleu"] = sacrebleu.corpus_bleu(hyps, [refs]).score
        # the median over repeats of each repeat's median over sentences
        row["latency_ms_beam5"] = statistics.median(latencies[name]) if latency else None
        rows.append(row)
    return rows


def report(rows: list[dict], meta: dict, out_dir: Path) -> None:
    base = next((r for r in rows if r["system"] == "ctranslate2 int8"), None)
    header = ["system", "beam 5 sents/s", "vs ct2 int8", "BLEU", "greedy sents/s", "BLEU",
              "batch-1 latency ms (beam 5)"]
    table = [[r["system"], f"{r['beam5_sents_per_s']:.1f}",
              f"{r['beam5_sents_per_s'] / base['beam5_sents_per_s']:.2f}x" if base else "-",
              f"{r['beam5_bleu']:.2f}", f"{r['beam1_sents_per_s']:.1f}", f"{r['beam1_bleu']:.2f}",
              "-" if r["latency_ms_beam5"] is None else f"{r['latency_ms_beam5']:.1f}"]
             for r in rows]
    md = "\n".join(markdown_table(header, table))
    print(md)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "decode_speed.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                          indent=1))
    (out_dir / "decode_speed.md").write_text(
        f"# Decoding speed, one model, one process\n\n{json.dumps(meta)}\n\n{md}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=SERVE_MODEL)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency", type=int, default=100, help="sentences timed at batch 1")
    parser.add_argument("--sentences", type=int, default=0, help="the first N only (0: all)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args()
    test = SHARED / "multi30k" / "test2016"
    if not (args.model / "config.yaml").exists():
        sys.exit(f"skipped: needs a trained model in {args.model}; train the default one "
                 f"(from {ROOT}) with:\n  {SERVE_MODEL_HINT}")
    torch.set_num_threads(args.threads)
    translator = Translator.load(args.model)
    data = translator.cfg.data  # (the model's direction: before, always en -> de)
    source, reference = (test.with_suffix(f".{lang}") for lang in (data.src_lang, data.tgt_lang))
    if not (source.exists() and reference.exists()):
        sys.exit(f"skipped: needs {source} and {reference} (Multi30k's test set in the model's "
                 "languages)")
    keep = slice(0, args.sentences or None)
    lines = source.read_text(encoding="utf-8").splitlines()[keep]
    refs = reference.read_text(encoding="utf-8").splitlines()[keep]
    sources = [translator.src_vocab.ids_to_pieces(translator.source_ids(line, False))
               for line in lines]

    def detok(pieces: list[str]) -> str:
        ids = translator.tgt_vocab.pieces_to_ids(pieces)
        return translator.tgt_text.postprocess(translator.tgt_vocab.decode(ids))

    with tempfile.TemporaryDirectory() as work:
        found = systems(translator, args.model, Path(work), args.threads)
        rows = measure(found, sources, refs, detok, args.repeats, args.latency)
    meta = {"model": str(args.model), "direction": f"{data.src_lang}-{data.tgt_lang}",
            "sentences": len(sources), "threads": args.threads,
            "repeats": args.repeats, "batch": BATCH, "beam": BEAM,
            "torch": torch.__version__}
    report(rows, meta, args.out_dir)


if __name__ == "__main__":
    main()
