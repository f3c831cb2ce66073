"""``xinda translate``: the command's options and its input/output (``xinda.cli`` registers
it). N lines in give N lines out; outputs are checked before decoding and written atomically."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from xinda.errors import XindaError
from xinda.utils import input_name, read_input

log = logging.getLogger("xinda")


# files a model folder reads or keeps (weights, config, manifest, vocabularies, log, curves)
MODEL_FILE_SUFFIXES = (".safetensors", ".yaml", ".json", ".model", ".vocab", ".csv", ".png")
PLOTS_MARK = ".xinda-attention-plots"  # in a folder of plots: xinda's, to replace and clean


def _check_outputs(output: Path | None, plots: Path | None, inputs: list[Path | None],
                   model_dirs: list[Path]) -> None:
    """Refuse outputs that cannot be written before decoding, not after, and outputs that
    would replace an input of the command: the -i or --prefix file, a model folder's files."""
    from xinda.utils import check_writable

    if output is not None and str(output) != "-":
        check_writable(output, make=False)  # (made when written: not by a later refusal)
        _check_not_an_input(output, inputs, model_dirs)
        if plots is not None and plots.resolve() in (output.resolve(), *output.resolve().parents):
            raise XindaError(f"-o {output}: is in the --attention-plot folder {plots}, whose "
                             "numbered PNGs xinda writes and removes; write the translations "
                             "elsewhere")
    if plots is not None:
        if not (plots / PLOTS_MARK).is_file() and (theirs := sorted(_plots_in(plots))):
            raise XindaError(f"--attention-plot {plots}: holds {theirs[0].name} (the name of a "
                             "plot), which xinda did not write: choose an empty or new folder")
        check_writable(plots, folder=True, make=False)


def _check_not_an_input(output: Path, inputs: list[Path | None], model_dirs: list[Path]) -> None:
    """Refuse ``output`` where it is (or links to) an input file, a file that a model folder
    holds: weights, config, vocabularies, log ... (``MODEL_FILE_SUFFIXES``), a new weights file
    there (a translator would load a new best or averaged one), anything in its checkpoints
    folder, or a file of the prepared data its config names. New files of other names in a
    model folder are fine."""
    from xinda.checkpoint import checkpoint_dir

    target = output.resolve()
    for given in inputs:
        if given is not None and target.is_file() and given.is_file() \
                and target.samefile(given):
            raise XindaError(f"-o {output}: is also an input of the command ({given}); "
                             "write the translations elsewhere")
    for model_dir in model_dirs:
        if checkpoint_dir(model_dir).resolve() in target.parents or (
                (target.is_file() or target.suffix == ".safetensors")
                and model_dir.resolve() in target.parents and target.suffix in MODEL_FILE_SUFFIXES):
            raise XindaError(f"-o {output}: would replace a file of the model folder "
                             f"{model_dir}; write the translations elsewhere")
        data = _prepared_data(model_dir)
        if data is not None and target.is_file() and data.resolve() in target.parents:
            raise XindaError(f"-o {output}: would replace a file of {data}, the prepared data "
                             f"of {model_dir}; write the translations elsewhere")


def _prepared_data(model_dir: Path) -> Path | None:
    """The prepared-data folder that ``model_dir``'s config names (data.out_dir), if it is
    there (a relative one from here)."""
    import yaml

    try:
        config = yaml.safe_load((model_dir / "config.yaml").read_text(encoding="utf-8"))
        folder = Path(config["data"]["out_dir"])
    except (OSError, UnicodeDecodeError, yaml.YAMLError, TypeError, KeyError):
        return None
    return folder if folder.is_dir() else None


def _write_output(path: Path | None, lines: list[str]) -> None:
    """The lines to ``path`` (stdout for None or "-"), gzip-compressed when it is named .gz,
    as the inputs are read."""
    import gzip

    from xinda.utils import atomic_save, write_stdout

    text = "".join(line + "\n" for line in lines)
    if path is None or str(path) == "-":
        return write_stdout(text)
    data = text.encode("utf-8")
    if path.suffix.lower() == ".gz":
        data = gzip.compress(data, mtime=0)
    atomic_save(path, lambda tmp: tmp.write_bytes(data))


def translate(
    model_dir: Path,
    input: Annotated[Path | None, typer.Option("-i", "--input", help="default: stdin")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="default: stdout")] = None,
    beam: Annotated[int | None, typer.Option(help="beam size; 1 = greedy")] = None,
    alpha: Annotated[float | None, typer.Option(help="GNMT length penalty")] = None,
    coverage: Annotated[float | None, typer.Option(help="GNMT coverage penalty beta")] = None,
    precision: Annotated[str | None, typer.Option(help="fp32 | bf16 | int8 | auto")] = None,
    int8_scale: Annotated[str | None, typer.Option(
        help="int8 activation scales: batch (fastest; an output can change with the lines "
             "batched with it) | row (not by their ranges; ~1.15x slower)")] = None,
    stop: Annotated[str | None, typer.Option(
        help="end a beam after `beam` finished (beam) or once the best ended (best)")] = None,
    nbest: Annotated[int | None, typer.Option(
        help="write the n best: 'i ||| text ||| score' (a beam below n is widened to n)")
        ] = None,
    batch_size: Annotated[int | None, typer.Option(help="sentences per batch")] = None,
    max_len_a: Annotated[float | None, typer.Option(
        help="output length limit a * source tokens + b (both counting the end token): a"
    )] = None,
    max_len_b: Annotated[int | None, typer.Option(help="... and b")] = None,
    checkpoint: Annotated[Path | None, typer.Option(help="weights file to load")] = None,
    ensemble: Annotated[list[Path] | None, typer.Option(
        help="another model directory to decode with (repeat the option): the models' mean "
             "log-probabilities, step by step")] = None,
    input_format: Annotated[str, typer.Option(help="text | pieces")] = "text",
    output_format: Annotated[str, typer.Option(help="text | pieces")] = "text",
    scores: Annotated[bool, typer.Option(
        help="prefix each line with its score (--nbest lines carry theirs)")] = False,
    threads: Annotated[int, typer.Option(help="torch threads (0 = default)")] = 0,
    workers: Annotated[int | None, typer.Option(
        help="CPU processes that decode batches side by side, one thread each "
             "(decode.workers; replaces --threads)")] = None,
    device: Annotated[str, typer.Option(help="cpu | cuda | cuda:N")] = "cpu",
    attention_plot: Annotated[Path | None, typer.Option(
        help="write a source-target attention heat-map PNG per sentence into this folder")] = None,
    prefix: Annotated[Path | None, typer.Option(
        help="file of target prefixes, one per input line ('' = none): outputs start with it")
        ] = None,
    no_repeat_ngram: Annotated[int, typer.Option(help="ban repeated n-grams (0 = off)")] = 0,
    ban: Annotated[str | None, typer.Option(help="comma-separated target pieces/words")] = None,
    ban_source_copy: Annotated[bool, typer.Option(
        help="ban copying source pieces (with char or jieba targets: their characters, in any "
        "target piece)")] = False,
    exact_length: Annotated[int | None, typer.Option(help="output pieces per line")] = None,
    sampling: Annotated[bool | None, typer.Option(
        "--sampling/--no-sampling", help="sample instead of beam search (default: the "
        "model's decode.sampling)")] = None,
    temperature: Annotated[float | None, typer.Option(help="sampling temperature > 0")] = None,
    top_k: Annotated[int | None, typer.Option(help="sample from the k best (0 = all)")] = None,
    top_p: Annotated[float | None, typer.Option(help="nucleus sampling, in (0, 1]")] = None,
    seed: Annotated[int | None, typer.Option(
        help="sampling seed (same lines and --batch-size: same samples)")] = None,
    samples: Annotated[int | None, typer.Option(help="samples per line, written like --nbest")
                       ] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="any decode setting: decode.KEY=VALUE (the options above win)")] = None,
) -> None:
    """Translate lines of text (N lines in -> N lines out) with a trained MODEL_DIR."""
    from xinda.checkpoint import default_weights
    from xinda.config import DecodeConfig
    from xinda.decode.options import check_model_dir
    from xinda.decode.translator import Translator
    from xinda.device import check_device, set_threads

    set_threads(threads)
    sampler = _sampling_options(sampling, temperature, top_k, top_p, seed, samples)
    _check_outputs(output, attention_plot, [input, prefix, checkpoint],
                   [model_dir, *(ensemble or ())])
    if ban is not None and not ban.replace(",", "").strip():  # (before: silently no ban)
        raise XindaError(f"--ban {ban!r}: no piece or word to ban (commas separate them)")
    if prefix is not None and input_name(prefix) == input_name(input) == "<stdin>":
        raise XindaError("--prefix and the input (-i) cannot both be read from stdin")
    lines = read_input(input)
    prefixes = _read_prefixes(prefix, len(lines))
    check_device(device)
    check_model_dir(model_dir)
    weights = checkpoint or default_weights(model_dir)  # (named in the last line)
    translator = Translator.load(model_dir, weights, device=device, ensemble=ensemble or ())
    if attention_plot is not None and not translator.model.has_attention:
        raise XindaError("--attention-plot needs an attention model; this one has none")
    if input_format == "pieces":  # errors name the file (the Translator knows line numbers)
        for i, line in enumerate(lines, start=1):
            translator.source_ids(line, True, f"{input_name(input)}:{i}")
    constraints = translator.constraints_for(lines, prefixes, (ban or "").split(","),
                                             no_repeat_ngram, ban_source_copy, exact_length,
                                             input_format, prefix and str(prefix))
    search = {"beam": beam, "nbest": nbest, "coverage": coverage, "stop": stop}
    given = {"alpha": alpha, "batch_size": batch_size, "max_len_a": max_len_a,
             "max_len_b": max_len_b, "precision": precision, "int8_scale": int8_scale,
             "workers": workers, **search, **sampler}
    overrides = _decode_overrides(set_ or [])
    options = {**overrides, **{k: v for k, v in given.items() if v is not None}}
    dec = translator.decode_settings(options)
    if threads and dec.workers > 1:
        log.warning("--threads %d: not used: each of the %d workers (decode.workers) decodes "
                    "with one thread", threads, dec.workers)
    used = [f"--{k}" for k, v in search.items() if v is not None] + [
        f"decode.{k}" for k in search if k in overrides]
    if dec.sampling and used:  # sampling from --sampling, --set or the model's config
        raise XindaError(f"{', '.join(used)}: beam-search options, not used when sampling "
                         "(--sampling or decode.sampling; --samples sets the outputs per line)")
    if any(k != "sampling" for k in sampler) and not dec.sampling:
        raise XindaError("--temperature, --top-k, --top-p, --seed and --samples need --sampling")
    if (drawn := [f"decode.{k}" for k in DecodeConfig.SAMPLING_ONLY if k in overrides]
            ) and not dec.sampling:  # (before: the Python API's 'need sampling=True')
        raise XindaError(f"--set {', '.join(drawn)}: sampling settings, not used by beam "
                         "search: add --sampling (or decode.sampling=true)")
    if int8_scale and dec.precision != "int8":
        raise XindaError(f"--int8-scale: used only with --precision int8 (decode.precision is "
                         f"{dec.precision})")
    start = time.perf_counter()
    results = translator.translate(lines, input_format=input_format, output_format=output_format,
                                   need_attention=attention_plot is not None,
                                   constraints=constraints, **options)
    seconds = time.perf_counter() - start
    n_best = dec.samples if dec.sampling else dec.nbest
    _write_output(output, _output_lines(results, n_best, scores))
    if attention_plot is not None:
        _plot_attention(results, attention_plot)
    cut = sum(nbest[0].truncated_from is not None for nbest in results)
    limit = translator.source_limit(dec)
    what = (f"decode.max_input_len={limit}" if limit == dec.max_input_len
            else f"{limit} (the model's position table)")
    note = f"; {cut} inputs cut to {what} tokens" if cut else ""
    more = f" and {len(ensemble)} more models" if ensemble else ""
    print(f"translated {len(lines)} sentences in {seconds:.2f} s "
          f"({len(lines) / max(seconds, 1e-9):.1f} sentences/s) with {weights}{more}{note}",
          file=sys.stderr)


def _decode_overrides(overrides: list[str]) -> dict:
    """The ``decode.KEY=VALUE`` settings of --set (values parsed as YAML), as options."""
    from xinda.config import apply_overrides

    tree = apply_overrides({}, overrides)
    if set(tree) - {"decode"}:
        other = next(o for o in overrides if not o.strip().startswith("decode."))
        raise XindaError(f"--set {other}: translate takes decode.KEY=VALUE settings only")
    decode = tree.get("decode", {})
    if not isinstance(decode, dict):
        raise XindaError("--set decode=...: name a setting, e.g. decode.max_input_len=400")
    return decode


def _sampling_options(on: bool | None, temperature: float | None, top_k: int | None,
                      top_p: float | None, seed: int | None, samples: int | None) -> dict:
    """The decode settings of the --sampling options that were given (--no-sampling too)."""
    given = {"sampling": on, "temperature": temperature, "top_k": top_k,
             "top_p": top_p, "seed": seed, "samples": samples}
    return {k: v for k, v in given.items() if v is not None}


def _read_prefixes(path: Path | None, n_lines: int) -> list[str] | None:
    """The lines of the --prefix file, one per input line."""
    prefixes = None if path is None else read_input(path)
    if prefixes is not None and len(prefixes) != n_lines:
        raise XindaError(f"{input_name(path)}: {len(prefixes)} prefix lines for {n_lines} "
                         "input lines")
    return prefixes


def _output_lines(results, n_best: int, scores: bool) -> list[str]:
    """One line per input line (its best translation, after 'score<TAB>' with ``scores``; a
    line with no output is '', or '-inf<TAB>', with a warning), or with ``n_best`` > 1
    'i ||| text ||| score' per hypothesis."""
    out = []
    for i, nbest_list in enumerate(results):
        if nbest_list[0].error:
            log.warning("line %d: %s", i + 1, nbest_list[0].error)
            if n_best == 1:  # (a score column on every line: before, '' without it)
                out.append("-inf\t" if scores else "")
        elif n_best > 1:
            out += [f"{i} ||| {t.text} ||| {t.score:.4f}" for t in nbest_list]
        else:
            t = nbest_list[0]
            out.append(f"{t.score:.4f}\t{t.text}" if scores else t.text)
    return out


def _plot_attention(results, folder: Path) -> None:
    from xinda.evaluate.attention_plot import plot_attention

    folder.mkdir(parents=True, exist_ok=True)
    for i, nbest_list in enumerate(results):
        best, path = nbest_list[0], folder / f"{i:05d}.png"
        if best.attention is not None:
            plot_attention(best.attention, best.source_pieces, best.target_pieces, path,
                           title=best.text[:80])
        else:  # an empty or failed line: no picture, and none from an earlier run
            path.unlink(missing_ok=True)
    (folder / PLOTS_MARK).touch()
    for stale in _plots_in(folder):  # an earlier run's longer input
        if int(stale.stem) >= len(results):
            stale.unlink()


def _plots_in(folder: Path) -> list[Path]:
    """The files of ``folder`` named as attention plots are (00000.png, 00001.png, ...)."""
    return list(folder.glob("[0-9][0-9][0-9][0-9][0-9].png")) if folder.is_dir() else []


