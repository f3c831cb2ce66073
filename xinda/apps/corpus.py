"""What the corpus writers share: locating a folder of ``../shared/data``, reading aligned
files (plain or .gz), traditional -> simplified conversion and writing a split's files."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path

from xinda.errors import XindaError
from xinda.utils import atomic_write_text, read_lines

log = logging.getLogger("xinda")


@cache
def _t2s():
    import opencc

    return opencc.OpenCC("t2s")


def to_simplified(text: str) -> str:
    """Traditional -> simplified Chinese with OpenCC's ``t2s`` (phrase-aware: characters
    separated by spaces are converted one by one)."""
    return _t2s().convert(text)


def corpus_dir(shared: str | Path, name: str) -> Path:
    """``shared/name``, or a XindaError saying where the data is expected."""
    folder = Path(shared) / name
    if not folder.is_dir():
        raise XindaError(f"{folder}: corpus folder not found (the shared data folder, e.g. "
                         f"../shared/data, must hold {name}/; see its SOURCES.md)")
    return folder


def split_file(folder: Path, name: str) -> Path:
    """``folder/name``, or ``folder/name.gz`` when only the compressed file exists."""
    path = folder / name
    gz = folder / f"{name}.gz"
    if not path.exists() and gz.exists():
        return gz
    if not path.exists():
        raise XindaError(f"{path}: file not found (nor {gz.name})")
    return path


def read_aligned(paths: list[Path]) -> list[list[str]]:
    """The lines of each file (plain or gzipped UTF-8), which must have equal line counts."""
    sides = [list(read_lines(path)) for path in paths]
    if len({len(lines) for lines in sides}) > 1:
        counts = ", ".join(f"{path} has {len(lines)}" for path, lines in zip(paths, sides))
        raise XindaError(f"files are not line-aligned: {counts} lines")
    return sides


def write_split(out_dir: Path, split: str, sides: dict[str, list[str]]) -> str:
    """Write ``out_dir/{split}.{suffix}`` for each side (suffix -> its lines); return the
    split's prefix ``out_dir/split``, as ``data.train`` / ``data.valid`` / ``data.test`` take."""
    for suffix, lines in sides.items():
        atomic_write_text(out_dir / f"{split}.{suffix}", "".join(f"{line}\n" for line in lines))
    return str(out_dir / split)


def drop_held_out(splits: dict[str, list[list[str]]], cleaned: Sequence[str],
                  keys: Callable[[tuple[str, ...]], set[str]]) -> None:
    """Drop from each split in ``cleaned`` the records (one line per side) that share a key
    with a record of a split after it in ``splits`` (in place; logged). The shared data was
    de-duplicated in traditional characters: variants that the conversion to simplified makes
    equal (遊/游) would leak valid and test data into training."""
    names = list(splits)
    for split in cleaned:
        later = names[names.index(split) + 1:]
        held = {key for name in later for record in zip(*splits[name]) for key in keys(record)}
        keep = [k for k, record in enumerate(zip(*splits[split])) if not held & keys(record)]
        if len(keep) < len(splits[split][0]):
            log.info("%s: %d dropped, shared with %s", split, len(splits[split][0]) - len(keep),
                     "/".join(later))
            splits[split] = [[side[k] for k in keep] for side in splits[split]]
