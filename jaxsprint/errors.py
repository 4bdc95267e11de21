"""Errors meant for people: each names the field, the value and what is allowed.

Launchers catch `JaxsprintError` and exit with status 2 and the message alone (no traceback).
"""
from typing import Any


class JaxsprintError(ValueError):
    """Base class of user-facing errors (bad configuration, missing data)."""


class ConfigError(JaxsprintError):
    """A configuration field has a value that is not allowed."""

    def __init__(self, field: str, value: Any, allowed: str):
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"invalid {field}={value!r}: {allowed}")


class DataError(JaxsprintError):
    """A dataset cannot be read (missing directory, not prepared, unknown name)."""


class NonFiniteError(RuntimeError):
    """Training produced a NaN or Inf; carries the first offending step."""

    def __init__(self, step: int, name: str, value: float):
        self.step = step
        super().__init__(f"non-finite {name}={value} at step {step}; stopping (last checkpoint is kept)")
