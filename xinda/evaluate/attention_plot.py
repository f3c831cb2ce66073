"""Source-target attention matrices as heat-map pictures (PNG)."""

from __future__ import annotations

import functools
import logging
import math
import warnings
from pathlib import Path

import torch

from xinda.evaluate.metrics import is_cjk
from xinda.utils import atomic_save

log = logging.getLogger("xinda")

PIECE_INCHES = 0.35  # room per piece, shrunk so that a side stays within MAX_SIDE_INCHES
MAX_SIDE_INCHES = 36.0  # ~4000 px at 110 dpi: a 400-piece output still opens in any viewer
LABEL_INCHES = 0.14  # the least room an 8-pt tick label needs: past it, every k-th is labelled
# the first installed one draws CJK pieces (matplotlib falls back glyph by glyph)
CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans CJK KR", "Source Han Sans SC",
             "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "SimHei", "Microsoft YaHei",
             "PingFang SC", "Hiragino Sans GB", "Apple SD Gothic Neo")
_warned_no_cjk_font = False


def plot_attention(weights: torch.Tensor, source: list[str], target: list[str],
                   path: str | Path, title: str = "") -> None:
    """Draw ``weights`` (len(target)+1, len(source)+1), EOS row/column included, as a heat-map:
    one row per target piece, one column per source piece."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols, rows = [*map(_literal, source), "</s>"], [*map(_literal, target), "</s>"]
    if tuple(weights.shape) != (len(rows), len(cols)):  # labels would land on other columns
        raise ValueError(f"attention {tuple(weights.shape)} does not fit {len(target)} target "
                         f"and {len(source)} source pieces (+ EOS each)")
    weights = weights.float().numpy()
    (col_in, col_every), (row_in, row_every) = _axis(len(cols)), _axis(len(rows))
    with plt.rc_context({"font.family": _font_families(cols + rows + [title])}), \
            warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")  # (said once)
        fig, ax = plt.subplots(figsize=(max(4.0, col_in * len(cols) + 1.5),
                                        max(3.0, row_in * len(rows) + 1.2)))
        image = ax.imshow(weights, cmap="viridis", aspect="auto", vmin=0.0, vmax=1.0)
        ax.set_xticks(range(0, len(cols), col_every), cols[::col_every], rotation=90, fontsize=8)
        ax.set_yticks(range(0, len(rows), row_every), rows[::row_every], fontsize=8)
        ax.set_xlabel("source")
        ax.set_ylabel("target")
        if title:
            ax.set_title(_literal(title), fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.04)
        fig.tight_layout()
        atomic_save(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
        plt.close(fig)


def _axis(n: int) -> tuple[float, int]:
    """Inches per piece of an axis of ``n`` pieces and k: every k-th piece is labelled."""
    inches = min(PIECE_INCHES, MAX_SIDE_INCHES / n)
    return inches, math.ceil(LABEL_INCHES / inches)


@functools.cache
def _installed_cjk_fonts() -> tuple[str, ...]:
    from matplotlib import font_manager

    installed = {font.name for font in font_manager.fontManager.ttflist}
    return tuple(name for name in CJK_FONTS if name in installed)


def _font_families(texts: list[str]) -> list[str]:
    """DejaVu Sans, then the installed CJK fonts; says once when CJK text has none."""
    global _warned_no_cjk_font
    cjk = _installed_cjk_fonts()
    if not cjk and not _warned_no_cjk_font and any(map(is_cjk, "".join(texts))):
        _warned_no_cjk_font = True
        log.warning("attention plots: no CJK font installed, so CJK pieces show as boxes "
                    "(Debian: apt-get install fonts-noto-cjk)")
    return ["DejaVu Sans", *cjk]


def _literal(text: str) -> str:
    """``text`` shown as written: matplotlib reads text between two $ as a formula (and fails
    on one it cannot parse, e.g. "$a_b_c$")."""
    return text.replace("$", r"\$")
