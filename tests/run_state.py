"""What two runs' saved progress must share when one was interrupted and resumed: everything
but the clocks."""

from __future__ import annotations

CLOCKS = ("train_seconds", "wall_seconds")


def without_clocks(progress: dict) -> dict:
    """A checkpoint's ``progress`` without its wall-clock fields (and the log window's
    seconds), which differ between any two runs."""
    kept = {k: v for k, v in progress.items() if k not in CLOCKS}
    if "log_window" in kept:
        kept["log_window"] = [*kept["log_window"][:3], None]
    return kept
