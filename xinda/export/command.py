"""``xinda export``: the sub-commands' options (``xinda.cli`` registers ``export_app``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

export_app = typer.Typer(no_args_is_help=True, help="Write a trained model in another runtime's "
                         "format.")


def ctranslate2(
    model_dir: Annotated[Path, typer.Argument(help="trained model directory (a Transformer)")],
    out_dir: Annotated[Path, typer.Argument(help="the CTranslate2 model directory to write")],
    checkpoint: Annotated[Path | None, typer.Option(help="weights file to export (default: "
                                                    "the one xinda translate loads)")] = None,
    quantization: Annotated[str | None, typer.Option(
        help="store weights as int8, int8_float32, int16, float16, ... (default: float32; "
             "CTranslate2 can also quantise at load time)")] = None,
    force: Annotated[bool, typer.Option(
        help="replace OUT_DIR if it holds an earlier CTranslate2 export (model.bin, config.json, "
             "vocabularies, sentencepiece models and nothing else); any other folder is "
             "refused unless empty")] = False,
) -> None:
    """Export the Transformer of MODEL_DIR to a CTranslate2 model directory: it translates
    space-separated sentencepiece pieces, greedy decoding as xinda's with the length limits of
    the README (needs the ctranslate2 package: the "export" extra of xinda)."""
    from xinda.export.ctranslate2 import export_ctranslate2

    out = export_ctranslate2(model_dir, out_dir, checkpoint, quantization, force)
    print(f"exported {model_dir} -> {out} (CTranslate2; input and output: sentencepiece "
          "pieces)")
