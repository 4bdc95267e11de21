"""Machine presets as files: a machine's figures and their sources, in and out of JSON.

A **preset** (format :data:`PRESET_FORMAT`) holds a machine's figures and their sources, plus whatever its
writer adds (the fit's command, relative standard errors, a ``host`` section of runtime figures that
:func:`jaxsprint.calibration.host.load_host` reads). :func:`save_preset` writes one, :func:`load_preset` reads
it back, :func:`load_machine` takes a preset name or a preset file (the ``--machine`` / ``--machine_file``
flags of the launchers). The fitted presets ship as such files (:data:`jaxsprint.perf.machines.DATA_DIR`).
Measurement files, the calibration's input, are read by :mod:`jaxsprint.calibration.measurements`.
"""
from __future__ import annotations

import json
import os
from typing import Any

from jaxsprint.errors import ConfigError, DataError
from jaxsprint.perf import machines
from jaxsprint.perf.machines import Machine

__all__ = ["PRESET_FORMAT", "RUNTIME_CALIBRATION_FORMAT", "figure", "load_machine", "load_preset", "save_preset"]

PRESET_FORMAT = "jaxsprint-machine-1"
# experiments/calibrate_runtime.py's measurement file (its --measurements; not a preset).
RUNTIME_CALIBRATION_FORMAT = "jaxsprint-runtime-calibration-1"
WRITER = "a file written by experiments/calibrate.py or experiments/calibrate_runtime.py"


def figure(value: Any) -> float:
    """A float32 figure as the decimal it stands for (7 significant digits: 1.04e11, not 103999995904.0)."""
    return float(f"{float(value):.7g}")


def save_preset(path: str, machine: Machine, **extra: Any) -> None:
    """Writes ``machine`` (every figure, its sources) and ``extra`` (fit summary, cv, ...) as JSON."""
    data = dict(format=PRESET_FORMAT, name=machine.name, description=machine.description,
                figures={f: figure(getattr(machine, f)) for f in machines.FIELDS},
                sources=dict(machine.sources), **extra)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1, default=float)


def read_json(path: str, field: str, what: str) -> Any:
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise DataError(field, path, f"an existing {what} (no such file)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(field, path, f"a readable {what} ({e})") from None


def load_preset(path: str) -> tuple[Machine, dict[str, Any]]:
    """Reads a preset written by :func:`save_preset`: ``(machine, the whole JSON object)``.

    Raises:
      DataError: a missing or unreadable file, another format, a missing or invalid figure (field
        ``machine_file``).
    """
    what = f"JSON machine preset ({WRITER})"
    data = read_json(path, "machine_file", what)
    if not isinstance(data, dict) or data.get("format") != PRESET_FORMAT:
        raise DataError("machine_file", path, f"a {what}: a JSON object with format {PRESET_FORMAT!r}")
    if not isinstance(data.get("figures"), dict):
        raise DataError("machine_file", path, f"a {what} with a 'figures' object")
    try:
        m = machines.from_preset(data)
    except ConfigError as e:
        raise DataError("machine_file", path, f"a {what} with valid figures ({e})") from None
    return m, data


def load_machine(name: str | None = None, path: str | None = None) -> Machine:
    """The machine of a preset name (:data:`jaxsprint.perf.machines.PRESETS`) or of a preset file.

    Args:
      name: A preset name (the ``machine`` flag).
      path: A preset file (the ``machine_file`` flag).

    Raises:
      ConfigError: both or neither given, an unknown name.
      DataError: an unreadable preset file.
    """
    if name and path:
        raise ConfigError("machine_file", path, f"not given together with machine={name!r}: one of them")
    if path:
        return load_preset(path)[0]
    if not name:
        raise ConfigError("machine", name, f"a preset ({', '.join(machines.PRESETS)}); or give machine_file")
    return machines.get(name)
