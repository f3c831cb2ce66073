"""Checks of what ``Translator.translate`` is given: formats, the constraints built for its
lines, and decode options that would be ignored (the lines: ``xinda.utils.check_lines``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from xinda.config import DecodeConfig
from xinda.data.vocab import Vocab
from xinda.decode.constraints import Constraint
from xinda.decode.sampling import SamplingConfig
from xinda.errors import XindaError

log = logging.getLogger("xinda")

FORMATS = ("text", "pieces")  # input_format / output_format
BEAM_ONLY = DecodeConfig.BEAM_ONLY  # beam-search options, unused when sampling
SAMPLING_ONLY = DecodeConfig.SAMPLING_ONLY  # sampling options, unused by beam search


def check_constraints(constraints: Sequence[Constraint], lines: int) -> list[Constraint]:
    """``constraints`` as a list (a generator read once would be read as none); a bare
    Constraint, or one built for another number of sentences than ``lines``, is a XindaError."""
    if isinstance(constraints, Constraint):
        raise XindaError(f"constraints: a list of constraints, not one "
                         f"{type(constraints).__name__} (write [constraint])")
    constraints = list(constraints)
    for constraint in constraints:
        if not isinstance(constraint, Constraint):
            raise XindaError(f"constraints: expected Constraint objects (e.g. from "
                             f"Translator.constraints_for), got {type(constraint).__name__}")
        if (n := constraint.sentences()) is not None and n != lines:
            raise XindaError(f"a {type(constraint).__name__} constraint built for {n} "
                             f"sentences, given with {lines} lines")
    return constraints


def warn_unknown_pieces(lines: Sequence[str], pieces_in: bool, vocab: Vocab) -> None:
    """With input given as pieces (``pieces_in``), one warning for the pieces that are not in
    ``vocab``: the model reads each as <unk> (pieces of another vocabulary, or plain text)."""
    unknown = [(i, piece) for i, line in enumerate(lines if pieces_in else (), start=1)
               for piece in line.split()
               if vocab.sp.piece_to_id(piece) == vocab.unk and piece != vocab.unk_piece]
    if unknown:
        (line, first), n = unknown[0], len(unknown)
        log.warning("%d input piece%s not in the model's vocabulary, read as <unk> (the first: "
                    "%r, line %d): pieces of another vocabulary, or text given as pieces?", n,
                    " is" if n == 1 else "s are", first, line)


def check_format(name: str, value: str) -> str:
    """``value`` of ``input_format``/``output_format`` (``name``), or a XindaError."""
    if value not in FORMATS:
        raise XindaError(f"{name} must be {' or '.join(map(repr, FORMATS))}, got {value!r}")
    return value


def check_sampling_options(options: dict, dec: DecodeConfig,
                           sampler: SamplingConfig | None) -> None:
    """A XindaError for settings among ``options`` that would be ignored: sampling ones
    without sampling or beside a ``sampler`` (which has its own), beam-search ones when
    sampling."""
    beam_given = ", ".join(name for name in BEAM_ONLY if name in options)
    if beam_given and (sampler is not None or dec.sampling):
        raise XindaError(f"{beam_given}: beam-search options, not used when sampling "
                         "(samples sets the outputs per line)")
    if sampler is not None and options.get("sampling") is False:
        raise XindaError("a sampler with sampling=False: give one or the other")
    given = ", ".join(name for name in SAMPLING_ONLY if name in options)
    if given and sampler is not None:
        raise XindaError(f"{given}: set them on the sampler, not as options, when one is given")
    if given and not dec.sampling:
        raise XindaError(f"{', '.join(SAMPLING_ONLY[:-1])} and {SAMPLING_ONLY[-1]} need "
                         f"sampling=True (given: {given})")


def check_model_dir(folder: Path) -> None:
    """``folder`` is a trained model directory (with config.yaml); prepared data, which has
    only a manifest, is named as such."""
    if not folder.is_dir():
        raise XindaError(f"{folder}: model directory not found")
    if not (folder / "config.yaml").is_file():
        what = ("prepared data (manifest.json): give the model's folder, train.out_dir"
                if (folder / "manifest.json").is_file() else "no config.yaml")
        raise XindaError(f"{folder}: not a trained model directory ({what})")
