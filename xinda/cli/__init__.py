"""Command line: ``xinda prepare | train | translate | evaluate | average | grow | models | demo
| couplet | poem | serve | export ctranslate2``.

Every user-facing failure is a ``XindaError``: printed as one line ``xinda: error: ...`` on
stderr with exit code 1; nothing already written is lost (all outputs are written atomically).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from xinda.cli.translate import translate as translate_command
from xinda.config import ExperimentConfig, load_config
from xinda.config_yaml import config_source
from xinda.errors import XindaError
from xinda.export.command import ctranslate2 as export_ctranslate2_command
from xinda.export.command import export_app
from xinda.serve.command import serve as serve_command
from xinda.utils import log_to_stderr, write_stdout

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="xinda (信达): neural machine translation, faithful and fluent.")
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="override: a.b=value")]
log = logging.getLogger("xinda")


def command(func: Callable, on: typer.Typer | None = None) -> Callable:
    """``app.command()`` (or ``on.command()``), keeping typer's own handling of two exceptions
    away from the user: it prints a bare "Aborted!" for an EOFError (which becomes a XindaError
    here; readers of user files raise XindaError themselves, naming the file, so this is the
    last resort) and exits silently on KeyboardInterrupt (here: "xinda: interrupted", exit
    code 130)."""
    @functools.wraps(func)
    def run(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except EOFError as err:
            raise XindaError(f"unexpected end of input data ({err or 'EOFError'})") from None
        except KeyboardInterrupt:
            _stderr_line("xinda: interrupted")
            raise typer.Exit(130) from None
    # the docstring's first paragraph on one line: typer's rich help keeps its line breaks
    first, _, rest = inspect.cleandoc(func.__doc__ or "").partition("\n\n")
    return (on or app).command(help="\n\n".join(filter(None, [" ".join(first.split()), rest])))(run)


def say(*lines: str) -> None:
    """A command's result ``lines`` on stdout; a failed write is a one-line error."""
    write_stdout("".join(f"{line}\n" for line in lines))


def validated(cfg: ExperimentConfig, source: Path | str, overrides: list[str] = ()
              ) -> ExperimentConfig:
    """``cfg`` (read from ``source`` with ``overrides``) once all of it is valid and its
    sections agree (``checked_model``): every command that reads an experiment config checks
    it before doing any work."""
    from xinda.train.run_dir import checked_model

    checked_model(cfg, source, overrides)
    for problem in cfg.decode.unused_settings():  # (not Trainer's: it may train such a model)
        raise XindaError(f"{config_source(source, list(overrides), 'decode', problem)}: "
                         f"{problem}")
    return cfg


@command
def prepare(config: Path, set_: SetOpt = None,
            workers: Annotated[int | None, typer.Option(
                min=1, help="processes that preprocess and encode (data.workers)")] = None,
            ) -> None:
    """Clean, pre-tokenise, learn sentencepiece and binarise the corpus of CONFIG's data."""
    from xinda.data.prepare import prepare as run_prepare
    from xinda.models.registry import resolve
    from xinda.utils import terminate_as_interrupt

    overrides = [*(set_ or []), *([f"data.workers={workers}"] if workers else [])]
    cfg = validated(load_config(config, overrides), config, overrides)
    if cfg.data.max_len >= (positions := resolve(cfg.model).max_positions):  # (+ BOS or EOS)
        named = [o for o in overrides
                 if o.split("=", 1)[0].strip() in ("data.max_len", "model.max_positions")]
        where = f"{config} with --set {' '.join(named)}" if named else str(config)
        raise XindaError(f"{where}: data.max_len {cfg.data.max_len} keeps training sentences "
                         f"longer than model.max_positions {positions} holds (at most "
                         f"{positions - 1} pieces and the EOS): lower data.max_len or raise "
                         "model.max_positions")
    report: list[str] = []  # printed once the dataset is in place: a failed write loses nothing
    with terminate_as_interrupt():  # kill / timeout: the staging folder goes, as on Ctrl-C
        manifest = run_prepare(cfg.data, log=report.append)
    for warning in (line for line in report if line.startswith("warning: ")):
        log.warning(warning.removeprefix("warning: "))  # on stderr, as every command warns
    sizes = ", ".join(f"{k} {v['pairs']}" for k, v in manifest["splits"].items())
    say(*(line for line in report if not line.startswith("warning: ")),
        f"prepared {cfg.data.out_dir}: {sizes}")


@command
def train(config: Path, set_: SetOpt = None,
          resume: Annotated[bool, typer.Option(help="continue from the newest checkpoint")] = False,
          ) -> None:
    """Train the model of CONFIG on its prepared data (run `xinda prepare` first)."""
    from xinda.evaluate.validation import validation_bleu
    from xinda.train.trainer import Trainer

    cfg = validated(load_config(config, set_ or []), config, set_ or [])
    trainer = Trainer(cfg, valid_bleu=validation_bleu(cfg), config=config)
    progress = trainer.train(resume=resume)
    if trainer.ranks.is_main:  # under torchrun: once
        say(f"trained {progress.step} updates ({progress.tgt_tokens} target tokens, "
            f"{progress.train_seconds:.0f} s of updates, {progress.wall_seconds:.0f} s with "
            f"validation and checkpoints) -> {cfg.train.out_dir}")


@command
def evaluate(
    hypotheses: Annotated[Path, typer.Argument(help="hypotheses file, - for stdin")],
    references: Annotated[list[Path], typer.Argument(
        help="one or more reference files (- for stdin, when the hypotheses are a file)")],
    source: Annotated[Path | None, typer.Option(help="source file, for --by-length")] = None,
    by_length: Annotated[bool, typer.Option(help="BLEU per source-length bucket")] = False,
    tokenize: Annotated[str | None, typer.Option(
        help="sacrebleu tokenizer, e.g. zh; default zh for mostly CJK references (char for "
             "Japanese), else 13a (ROUGE: zh/char = characters, else words, English ones "
             "stemmed)")
    ] = None,
    metrics: Annotated[str, typer.Option(
        help="comma-separated: bleu,chrf,chrf++,ter,rouge (TER and ROUGE take time growing "
             "with the square of a line's length: a line over 500 words for TER, 2,000 for "
             "ROUGE, gets a warning first; bleu,chrf is fast on any line)")] = "bleu,chrf,ter",
    lowercase: Annotated[bool, typer.Option(
        help="ignore case (a model trained with data.lowercase writes lowercase)")] = False,
    baseline: Annotated[Path | None, typer.Option(
        help="another system's translations of the same sources: each metric but ROUGE also "
             "compares HYPOTHESES with them (difference, 95 % paired-bootstrap interval, "
             "two-sided approximate-randomization p)")] = None,
) -> None:
    """Score HYPOTHESES against REFERENCES (sacrebleu BLEU, chrF, TER; ROUGE-1/2/L with
    rouge-score), each score with its signature; with --baseline, paired significance tests
    against another system. TER and ROUGE can take minutes on lines of thousands of words: a
    warning names the longest line before they start."""
    from xinda.evaluate.metrics import (
        bleu_by_length,
        corpus_scores,
        format_length_table,
        read_hyps_refs,
    )
    from xinda.utils import input_name

    if source is not None and not by_length:  # (before: silently unused)
        raise XindaError("--source is read for --by-length only: add --by-length")
    hyps, refs = read_hyps_refs(hypotheses, references)
    if by_length and source is None:
        raise XindaError("--by-length needs --source (lengths are source lengths)")
    read = {"HYPOTHESES": hypotheses, "REFERENCES": next(
        (ref for ref in references if input_name(ref) == "<stdin>"), None)}
    sources = _lines_beside(source, "--source", len(hyps), read) if by_length else None
    read["--source"] = source
    base = _lines_beside(baseline, "--baseline", len(hyps), read) if baseline else None
    names = [input_name(hypotheses), *map(input_name, references)]  # for warnings about long lines
    say(*map(str, corpus_scores(hyps, refs, tuple(metrics.split(",")), tokenize, lowercase,
                                names)))
    if sources is not None:
        say(format_length_table(bleu_by_length(sources, hyps, refs, tokenize=tokenize,
                                               lowercase=lowercase)))
    if base is not None:
        _say_paired(base, hyps, refs, baseline, metrics, tokenize, lowercase)


def _lines_beside(path: Path, option: str, n_hyps: int, read: dict[str, Path | None]
                  ) -> list[str]:
    """The lines of ``option`` (--source, --baseline; - for stdin), as many as the
    hypotheses', checked before anything is printed; ``read``: the inputs read before it
    (stdin gives one of them at most)."""
    from xinda.utils import input_name, read_input

    if input_name(path) == "<stdin>":
        for name, other in read.items():
            if other is not None and input_name(other) == "<stdin>":
                raise XindaError(f"{option} and {name} cannot both be read from stdin")
    lines = read_input(path)
    if len(lines) != n_hyps:
        raise XindaError(f"{input_name(path)} has {len(lines)} lines but "
                         f"{input_name(read['HYPOTHESES'])} has {n_hyps}")
    return lines


def _say_paired(base: list[str], hyps: list[str], refs: list[list[str]], baseline: Path,
                metrics: str, tokenize: str | None, lowercase: bool) -> None:
    from xinda.evaluate.significance import PAIRED_METRICS, paired_tests
    from xinda.utils import input_name

    asked = [m.strip() for m in metrics.split(",")]
    paired = [m for m in asked if m.lower() in PAIRED_METRICS]
    say(f"against the baseline {input_name(baseline)}:")
    if paired:
        say(*map(str, paired_tests(base, hyps, refs, paired, tokenize, lowercase)))
    if len(paired) < len(asked):
        say("(ROUGE: no paired test)")


@command
def average(model_dir: Path,
            last: Annotated[int, typer.Option(help="average the newest N checkpoints",
                                              min=1)] = 5,
            output: Annotated[Path | None, typer.Option(
                "-o", "--output", help="default: MODEL_DIR/averaged.safetensors")] = None
            ) -> None:
    """Average the parameters of the last N checkpoints into MODEL_DIR/averaged.safetensors."""
    from xinda.averaging import average_checkpoints
    from xinda.checkpoint import checkpoint_dir, list_checkpoints

    paths = list_checkpoints(model_dir)[-last:]
    if not paths:
        raise XindaError(f"{model_dir}: no checkpoints to average")
    out = output or model_dir / "averaged.safetensors"
    if checkpoint_dir(model_dir).resolve() in out.resolve().parents:
        raise XindaError(f"{out}: inside {checkpoint_dir(model_dir)}, the training's own "
                         "checkpoints (averaging writes elsewhere)")
    if out.suffix != ".safetensors":
        raise XindaError(f"-o {out}: averaged weights are written as a .safetensors file")
    own_folder = out.parent.resolve() == model_dir.resolve()
    if not own_folder and (out.parent / "config.yaml").is_file():
        raise XindaError(f"-o {out}: in another model's folder, whose translations would load it")
    earlier_average = out.name.startswith("averaged") and own_folder  # (not best.safetensors)
    if out.exists() and not earlier_average:
        raise XindaError(f"-o {out}: exists; averaging replaces only an earlier average in "
                         f"{model_dir} (averaged*.safetensors): choose another -o")
    average_checkpoints(paths, out)
    fewer = f", of the {last} asked: no more in {model_dir}" if len(paths) < last else ""
    say(f"averaged {len(paths)} checkpoint(s) ({paths[0].name} .. {paths[-1].name}{fewer}) "
        f"-> {out}")


@command
def grow(model_dir: Path,
         to: Annotated[int, typer.Option("--to", help="encoder layers N of the grown model "
                                         "(h < N <= 2h)")],
         out: Annotated[Path | None, typer.Option(
             "-o", "--output", "--out", help="new model directory (default: MODEL_DIR-Nl)")
         ] = None) -> None:
    """Copy the trained encoder of MODEL_DIR into an N-layer one (progressive training): then
    xinda train OUT/config.yaml --resume continues with the learning rate reset."""
    from xinda.train.grow import grow_model_dir

    new_dir = grow_model_dir(model_dir, to, out)
    say(f"grown -> {new_dir}; continue with: xinda train {new_dir / 'config.yaml'} --resume")


@command
def models() -> None:
    """List registered model presets with their parameter counts (32k joint vocabulary)."""
    import torch

    from xinda.data.vocab import VocabInfo
    from xinda.models.registry import PRESET_NOTES, build_model, list_presets

    say(f"{'preset':<28} {'arch':<12} {'parameters':>14}  description")
    for name, arch, cfg in list_presets():
        with torch.device("meta"):  # shapes only: no memory, no initialisation (18 -> 6 s)
            params = build_model(cfg, VocabInfo(32000, 32000, 0, 2, 3, True)).num_parameters()
        say(f"{name:<28} {arch:<12} {params:>14,}  {PRESET_NOTES[name]}")


@command
def demo(
    workdir: Annotated[Path | None, typer.Option(
        help="where data and model go (default: the demo config's)")] = None,
    seconds: Annotated[float | None, typer.Option(
        help="training time cap in seconds, > 0 (default: the demo config's; training also "
        "stops at its train.max_steps)")] = None,
    set_: SetOpt = None,
) -> None:
    """Generate a number-words -> digits task, train a small Transformer, translate and score."""
    from xinda.demo.run import DEMO_CONFIG, demo_config, run_demo

    if seconds is not None and not seconds > 0:  # (0 would be train.max_seconds' "no limit")
        raise XindaError(f"--seconds must be > 0 (the demo's time cap), got {seconds:g}")
    validated(demo_config(workdir, seconds, set_ or []), DEMO_CONFIG)  # before it deletes output
    run_demo(workdir, seconds, set_ or [])


def _print_outputs(outputs, nbest: int) -> None:
    """One line per output (``i ||| text ||| score`` with ``nbest`` > 1); a prompt without an
    output gets a warning on stderr and an empty line (or no n-best line)."""
    from xinda.utils import write_stdout

    lines = []
    for i, nbest_list in enumerate(outputs):
        for out in nbest_list:
            if out.error:
                log.warning("line %d: %s", i + 1, out.error)
                if nbest == 1:
                    lines.append("")
            elif nbest > 1:
                lines.append(f"{i} ||| {out.text} ||| {out.score:.4f}")
            else:
                lines.append(out.text)
    write_stdout("".join(line + "\n" for line in lines))


@command
def couplet(
    model_dir: Path,
    first_lines: Annotated[list[str], typer.Argument(help="first lines (上联)")],
    nbest: Annotated[int, typer.Option(help="second lines per first line")] = 1,
    no_copy: Annotated[bool, typer.Option(help="never the first line's character at the "
                                           "same position")] = False,
    tone: Annotated[bool, typer.Option(help="end on a level tone when the first line ends "
                                       "on an oblique one")] = False,
) -> None:
    """Write second lines (下联) of equal length, punctuation and repetition pattern."""
    from xinda.apps.generate import write_couplets
    from xinda.decode.translator import Translator

    outputs = write_couplets(Translator.load(model_dir), first_lines, nbest=nbest,
                             no_copy=no_copy, tone=tone)
    _print_outputs(outputs, nbest)


@command
def poem(
    model_dir: Path,
    keywords: Annotated[str, typer.Option(help="keywords: '春风 江月' or '春风，江月'")] = "",
    form: Annotated[int, typer.Option(help="characters per line: 5 or 7")] = 7,
    acrostic: Annotated[str, typer.Option(help="藏头诗: the first character of each line")] = "",
    nbest: Annotated[int, typer.Option(help="poems to write")] = 1,
    rhyme: Annotated[bool, typer.Option(help="lines 2 and 4 rhyme")] = False,
) -> None:
    """Write a quatrain (or one line per acrostic character) of exactly 5 or 7 characters a
    line from keywords."""
    from xinda.apps.generate import PoemPrompt, write_poems
    from xinda.apps.poetry import split_keywords
    from xinda.decode.translator import Translator

    prompt = PoemPrompt(split_keywords(keywords), form, acrostic)
    prompt.check("xinda poem")
    _print_outputs(write_poems(Translator.load(model_dir), [prompt], nbest=nbest, rhyme=rhyme),
                   nbest)


command(translate_command)  # `xinda translate`: its options are in xinda/cli/translate.py
command(serve_command)  # `xinda serve`: its options and help are in xinda/serve/command.py
app.add_typer(export_app, name="export")  # `xinda export ...`: in xinda/export/command.py
command(export_ctranslate2_command, on=export_app)


def _stderr_line(line: str) -> None:
    """``line`` and its newline in one write (print writes them apart, and the ranks of a
    torchrun job, sharing stderr, wrote into each other's lines)."""
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


def _error_line(message: str) -> None:
    _stderr_line(f"xinda: error: {message}")


def main() -> None:
    """The ``xinda`` command: a user error is one line ``xinda: error: ...`` on stderr, exit 1
    for bad files and settings, 2 for a command line click cannot parse."""
    log_to_stderr()
    if sys.stdin is None:  # started with stdin closed (<&-): read as empty, not a traceback
        sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - for the whole run
    if sys.stdout is None:  # (>&-): refused before any work whose output it would lose
        _error_line("stdout is closed (started with >&-): redirect it to a file or /dev/null")
        sys.exit(1)
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as err:  # typer's click: a command line it cannot parse
        if type(err).__name__ == "NoArgsIsHelpError":  # bare `xinda` or `xinda export`
            err.show()
        else:
            ctx = getattr(err, "ctx", None)
            _error_line(f"{' '.join(err.format_message().split())} (see "
                        f"{ctx.command_path if ctx else 'xinda'} --help)")
        sys.exit(getattr(err, "exit_code", 2))
    except XindaError as err:  # a library's multi-line message joined onto one line
        message = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        _error_line(message)
        sys.exit(1)
    except KeyboardInterrupt:
        _stderr_line("xinda: interrupted")
        sys.exit(130)
    except OSError as err:  # one a command did not name itself (a full disk, a closed pipe)
        where = f"{err.filename}: " if err.filename else ""
        _error_line(f"{where}{err.strerror or err}")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
