"""Errors meant for people, in one hierarchy and one message format: the field, the value, what is allowed.

    invalid <field>=<value!r>: <allowed>

Launchers catch `JaxsprintError` (see :func:`jaxsprint.cli.run`) and exit with status 2 and the message alone,
without a traceback. Modules raise the subclass that says what went wrong; they do not define their own.

  * `ConfigError`: a configuration field, flag or file entry has a value that is not allowed.
  * `DataError`: a dataset or input file cannot be read (missing directory, not prepared, malformed).
  * `CheckpointError`: a work directory or checkpoint does not match the run that reads it.
  * `NonFiniteError`: training produced a NaN or Inf (the field names the metric and the step).
"""
import math
import numbers
from typing import Any

__all__ = ["CheckpointError", "ConfigError", "DataError", "JaxsprintError", "NonFiniteError", "check", "is_int",
           "is_real"]


class JaxsprintError(ValueError):
    """Base class of user-facing errors: ``invalid {field}={value!r}: {allowed}``.

    Attributes:
      field: the config field, flag or input the value came from (``config.lr.base``, ``--repeats``).
      value: the offending value.
      allowed: what is allowed instead, or why the value cannot be used.
    """

    def __init__(self, field: str, value: Any, allowed: str):
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"invalid {field}={value!r}: {allowed}")

    def __reduce__(self):  # picklable with its three arguments (errors cross process boundaries in studies)
        return (type(self), (self.field, self.value, self.allowed))


class ConfigError(JaxsprintError):
    """A configuration field, flag or file entry has a value that is not allowed."""


class DataError(JaxsprintError):
    """A dataset or input file cannot be read (missing directory, not prepared, unknown name, malformed)."""


class CheckpointError(JaxsprintError):
    """A work directory or checkpoint does not match the run that reads it."""


class NonFiniteError(JaxsprintError):
    """Training produced a NaN or Inf; carries the first offending step."""

    def __init__(self, step: int, name: str, value: float):
        self.step = step
        self.name = name
        JaxsprintError.__init__(self, name, value, f"must be finite; stopped at step {step} "
                                                  "(the last checkpoint is kept)")

    def __reduce__(self):
        return (type(self), (self.step, self.name, self.value))


def check(ok: bool, field: str, value: Any, allowed: str, error: type[JaxsprintError] = ConfigError) -> None:
    """Raises ``error(field, value, allowed)`` unless ``ok``: the one-line form of a settings check."""
    if not ok:
        raise error(field, value, allowed)


def is_int(value: Any) -> bool:
    """An integer (Python or NumPy), not a bool: what a count or index setting accepts."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A finite real number (Python or NumPy, integers included), not a bool: NaN and +-inf are refused."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
