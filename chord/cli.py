"""The ``chord`` command's entry: the console script ``chord = chord.cli:main`` and
``python -m chord.cli ...``. The command line itself is :mod:`chord.lab.cli`; this module only
hands over to it (the one module outside ``chord/lab`` that imports the lab)."""
from __future__ import annotations

import sys
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from chord.lab.cli import main as _main

    return _main(argv)


def build_parser():
    """The command's argparse parser (chord.lab.cli.build_parser)."""
    from chord.lab.cli import build_parser as _build

    return _build()


if __name__ == "__main__":
    sys.exit(main())
