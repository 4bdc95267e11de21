"""Shared by the tests of jaxsprint.perf and its launchers: checking an error's field, value and allowed text."""
import contextlib
import math

import pytest

from jaxsprint.errors import ConfigError


@contextlib.contextmanager
def raises_invalid(field, value, allowed, error=ConfigError):
    """``pytest.raises(error)`` that also checks the error's field and value exactly and that ``allowed`` is
    part of what the error says is allowed."""
    with pytest.raises(error) as info:
        yield info
    e = info.value
    assert e.field == field, e
    if isinstance(value, float) and math.isnan(value):
        assert isinstance(e.value, float) and math.isnan(e.value), e
    else:
        assert e.value == value, e
    assert allowed in e.allowed, e
    assert str(e) == f"invalid {field}={e.value!r}: {e.allowed}"
