"""Shared launcher plumbing: a bad flag or a `JaxsprintError` ends in exit status 2 and one line, no traceback."""
from __future__ import annotations

import functools
import sys
from typing import Callable

from absl import app, flags

from jaxsprint.errors import JaxsprintError


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


def fail(error: BaseException) -> None:
    """Prints ``error: <message>`` to stderr and exits with status 2."""
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


def guarded(main: Callable[[list[str]], object]) -> Callable[[list[str]], object]:
    """Wraps an absl ``main`` so that a `JaxsprintError` becomes exit status 2 with its message alone."""

    @functools.wraps(main)
    def wrapper(argv):
        try:
            return main(argv)
        except JaxsprintError as e:
            fail(e)

    return wrapper


def run(main: Callable[[list[str]], object]) -> None:
    """``app.run`` with this module's flag parser and error handling: the one call at a launcher's bottom."""
    app.run(guarded(main), flags_parser=parse_flags)
