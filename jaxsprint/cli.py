"""Shared launcher plumbing: absl flag parsing that turns a bad flag into exit status 2 and one line."""
from __future__ import annotations

import sys

from absl import flags


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parser for ``app.run(main, flags_parser=parse_flags)``.

    A malformed or unknown flag prints ``error: ...`` to stderr and exits with status 2, without a traceback
    (absl's default is status 1).
    """
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
