"""Source-target attention matrices as heat-map pictures (PNG)."""

from __future__ import annotations

from pathlib import Path

import torch

from xinda.utils import atomic_save


def plot_attention(weights: torch.Tensor, source: list[str], target: list[str],
                   path: str | Path, title: str = "") -> None:
    """Draw ``weights`` (len(target)+1, len(source)+1), EOS row/column included, as a heat-map:
    one row per target piece, one column per source piece."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols, rows = [*map(_literal, source), "</s>"], [*map(_literal, target), "</s>"]
    weights = weights[: len(rows), : len(cols)].float().numpy()
    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * len(cols) + 1.5),
                                    max(3.0, 0.35 * len(rows) + 1.2)))
    image = ax.imshow(weights, cmap="viridis", aspect="auto", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    if title:
        ax.set_title(_literal(title), fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04)
    fig.tight_layout()
    atomic_save(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


def _literal(text: str) -> str:
    """``text`` shown as written: matplotlib reads text between two $ as a formula (and fails
    on one it cannot parse, e.g. "$a_b_c$")."""
    return text.replace("$", r"\$")
