"""``python -m xinda.apps {couplet,poetry} SHARED OUT_DIR``: write a task's corpus from the
shared data folder (e.g. ../shared/data) into OUT_DIR, as its recipe expects
(``recipes/couplet.yaml``: runs/apps/couplet/raw, ``recipes/poetry.yaml``:
runs/apps/poetry/raw). Errors are one line and exit code 1, as in the ``xinda`` command."""

from __future__ import annotations

import argparse
import sys

from xinda.apps.couplet import write_couplet_corpus
from xinda.apps.poetry import write_poetry_corpus
from xinda.errors import XindaError
from xinda.utils import log_to_stderr

WRITERS = {"couplet": write_couplet_corpus, "poetry": write_poetry_corpus}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xinda.apps", description=__doc__)
    parser.add_argument("task", choices=sorted(WRITERS))
    parser.add_argument("shared", help="the shared data folder, e.g. ../shared/data")
    parser.add_argument("out_dir", help="where the split files go, e.g. runs/apps/couplet/raw")
    args = parser.parse_args(argv)
    log_to_stderr()
    try:
        prefixes = WRITERS[args.task](args.shared, args.out_dir)
    except XindaError as err:
        print(f"xinda: error: {err}", file=sys.stderr)
        return 1
    for split, prefix in prefixes.items():
        print(f"{split}: {prefix}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
