"""jaxsprint.errors: one hierarchy, one message format, picklable with its parts."""
import pickle

import pytest

from jaxsprint import errors


@pytest.mark.parametrize("cls", [errors.JaxsprintError, errors.ConfigError, errors.DataError, errors.CheckpointError])
def test_message_names_field_value_and_what_is_allowed(cls):
    e = cls("config.lr.base", -0.1, "allowed: a finite number >= 0")
    assert str(e) == "invalid config.lr.base=-0.1: allowed: a finite number >= 0"
    assert (e.field, e.value, e.allowed) == ("config.lr.base", -0.1, "allowed: a finite number >= 0")
    assert isinstance(e, errors.JaxsprintError) and isinstance(e, ValueError)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls and str(back) == str(e)


def test_non_finite_error_names_the_metric_and_the_step():
    e = errors.NonFiniteError(7, "loss", float("nan"))
    assert e.step == 7 and e.field == "loss" and str(e).startswith("invalid loss=nan: must be finite; stopped at step 7")
    assert isinstance(e, errors.JaxsprintError)
    back = pickle.loads(pickle.dumps(e))
    assert back.step == 7 and str(back) == str(e)


def test_check_raises_only_when_not_ok():
    errors.check(True, "x", 1, "anything")
    with pytest.raises(errors.DataError, match=r"^invalid --file='a.json': not found$"):
        errors.check(False, "--file", "a.json", "not found", errors.DataError)


def test_is_int_accepts_python_and_numpy_integers_not_bools_or_floats():
    np = pytest.importorskip("numpy")
    for v in (0, -3, 2**40, np.int32(5), np.int64(-1), np.uint8(7)):
        assert errors.is_int(v), v
    for v in (True, False, np.bool_(True), 1.0, np.float32(2), "1", None, float("nan"), np.array(3)):
        assert not errors.is_int(v), v


def test_is_real_accepts_finite_numbers_not_bools_nan_or_inf():
    np = pytest.importorskip("numpy")
    for v in (0, 1.5, -2, np.float32(0.25), np.int64(4), 1e300):
        assert errors.is_real(v), v
    for v in (True, np.bool_(False), float("nan"), float("inf"), -float("inf"), np.float64("nan"), "1.0", None,
              np.array(1.0), 1j):
        assert not errors.is_real(v), v
