"""The config a run remembers (``WORKDIR/config.json``), compared when the run resumes.

A resumed run must continue the trajectory its checkpoints began. So before a run resumes from a checkpoint
in a workdir that has a config.json, it compares that config with its own (:func:`changed_fields`, pure):
every field must match except the trajectory-neutral ones of `TRAJECTORY_NEUTRAL` (when metrics, evaluations
and checkpoints happen, where the data is read from, how to resume, what to profile), which may change. The
list names the neutral fields rather than the trajectory ones: a field added later counts as changing the
trajectory until it is listed here.

``config.resume_allow_changes`` (field names, a tuple or comma-separated text; a group such as ``lr`` covers
every field in it) lets named fields differ on purpose: more epochs, a lower ``lr.base``. The resumed run then
keeps the previous config as ``config.<step>.json`` (step: the checkpoint it resumed from; a file already
kept for that step is not replaced, since that config produced the checkpoint) and writes its own as
``config.json``: the ``config.<step>.json`` files and ``config.json`` say which config produced which steps.

A field that only the saved config has (removed from the code) cannot steer this run; a warning names it. A
workdir with checkpoints and no config.json (written by an older version) resumes with a warning.
"""
from __future__ import annotations

import json
import math
from typing import Any

from absl import logging

from jaxsprint import cli, paths
from jaxsprint.errors import ConfigError

__all__ = ["CONFIG_FILE", "MISSING", "TRAJECTORY_NEUTRAL", "allowed_changes", "as_json", "changed_fields",
           "check_resume", "dropped_fields", "flatten", "is_neutral", "read_saved", "remember", "resume_check",
           "validate_config"]

CONFIG_FILE = "config.json"

# Fields that may differ between a run and its resumption: none changes what an update computes or which
# batch it reads (evaluation and checkpoints read the state and never change it; resuming is bit-identical
# from any checkpoint). An entry covers a field and, for a group, every field inside it.
TRAJECTORY_NEUTRAL = (
    "log_every_steps",          # when metrics are written
    "eval_every_epochs",        # when the state is evaluated
    "checkpoint_every_epochs",  # when the state is saved
    "keep_checkpoints",         # how many are kept
    "progress_bar",             # the terminal's bar
    "data_dir",                 # where the same dataset is read from
    "resume",                   # which checkpoint is read ("latest" or "latest_good")
    "resume_allow_changes",     # this very list of allowed changes
    "profile_steps",            # which updates are traced by jax.profiler
)

MISSING = object()  # the saved value of a field the saved config does not have


def as_json(config) -> dict[str, Any]:
    """`config` (a ConfigDict, or a dict already in that form) as its config.json holds it (tuples as lists)."""
    if isinstance(config, dict):
        return json.loads(json.dumps(config))
    return json.loads(config.to_json_best_effort())


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"lr": {"base": 0.1}}`` -> ``{"lr.base": 0.1}``: every leaf of a nested dict under its dotted name."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def is_neutral(field: str, neutral=TRAJECTORY_NEUTRAL) -> bool:
    """Whether the dotted `field` is one of `neutral` or inside one of its groups."""
    return any(field == n or field.startswith(n + ".") for n in neutral)


def _same(a, b) -> bool:
    """JSON values equal, NaN equal to NaN, a bool never equal to a number."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def changed_fields(saved: dict[str, Any], new: dict[str, Any],
                   neutral=TRAJECTORY_NEUTRAL) -> list[tuple[str, Any, Any]]:
    """``(field, saved value, new value)`` of every field of `new` that is not neutral and differs from
    `saved` (both nested dicts as in config.json), sorted by field; a field that `saved` lacks has the saved
    value `MISSING`."""
    old, cur = flatten(saved), flatten(new)
    out = []
    for field in sorted(cur):
        value = old.get(field, MISSING)
        if not is_neutral(field, neutral) and (value is MISSING or not _same(value, cur[field])):
            out.append((field, value, cur[field]))
    return out


def dropped_fields(saved: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Fields of `saved` that `new` does not have (nor a group of), sorted; a launcher's ``launcher`` entry of
    `jaxsprint.cli.write_config` is not a config field and is left out."""
    cur = flatten(new)
    return sorted(f for f in flatten({k: v for k, v in saved.items() if k != "launcher"})
                  if f not in cur and not any(f.startswith(c + ".") for c in cur))


def allowed_changes(config) -> list[str]:
    """The fields of ``config.resume_allow_changes`` (absent or empty: none), without a ``config.`` prefix.

    Raises:
      ConfigError: an entry that names no field (nor group) of `config`.
    """
    value = config.get("resume_allow_changes", ())
    names = [str(n).removeprefix("config.") for n in cli.text_list("config.resume_allow_changes", value)]
    fields = flatten(as_json(config))
    for name in names:
        if not any(f == name or f.startswith(name + ".") for f in fields):
            raise ConfigError("config.resume_allow_changes", value,
                              f"names of config fields or groups (such as lr.base,num_epochs); {name!r} is none")
    return names


def validate_config(config) -> None:
    """Checks ``config.resume_allow_changes``. Needs no data: call it before anything is written."""
    allowed_changes(config)


def check_resume(saved: dict[str, Any], new: dict[str, Any], allowed: list[str],
                 workdir: str) -> list[tuple[str, Any, Any]]:
    """The changes from `saved` to `new` (:func:`changed_fields`), when every one is covered by `allowed`.

    Raises:
      ConfigError: named after the first change not allowed, in one line listing each such field with both
        values and the setting of ``config.resume_allow_changes`` that would allow them.
    """
    changes = changed_fields(saved, new)
    refused = [c for c in changes if not is_neutral(c[0], allowed)]
    if not refused:
        return changes

    def was(field, old):
        return f"without config.{field}" if old is MISSING else f"with config.{field}={old!r}"

    (field, old, value), rest = refused[0], refused[1:]
    text = f"the run in {workdir} was made {was(field, old)}"
    if rest:
        text += "; also differ: " + ", ".join(f"config.{f}={v!r} (made {was(f, o)})" for f, o, v in rest)
    names = ",".join(dict.fromkeys(allowed + [f for f, _, _ in refused]))
    them = "this change" if len(refused) == 1 else "these changes"
    raise ConfigError(f"config.{field}", value,
                      f"{text}; config.resume_allow_changes={names} allows {them} (or use another workdir)")


def read_saved(workdir: str) -> dict[str, Any] | None:
    """The config.json of `workdir` as a dict, or None when there is none."""
    path = paths.as_path(workdir) / CONFIG_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError("workdir config.json", str(path), f"the JSON config of a run (it does not parse: {e})") from None


def resume_check(config, workdir: str) -> list[tuple[str, Any, Any]]:
    """:func:`check_resume` of `config` against the config.json of `workdir`, for a run that resumes from a
    checkpoint there; without a config.json (an older version) a warning, and no changes."""
    saved = read_saved(workdir)
    if saved is None:
        logging.warning("%s has checkpoints but no %s (written by an older version): resuming without comparing "
                        "its config", workdir, CONFIG_FILE)
        return []
    new = as_json(config)
    dropped = dropped_fields(saved, new)
    if dropped:
        logging.warning("the config of the run in %s had fields this version does not (ignored): %s", workdir,
                        ", ".join(dropped))
    return check_resume(saved, new, allowed_changes(config), workdir)


def remember(workdir: str, config, step: int, changes: list) -> None:
    """Writes `config` as the run's config.json; when it resumed at `step` with `changes` (allowed ones),
    the previous config.json is kept first as ``config.<step>.json`` (unless one is kept for that step)."""
    directory = paths.as_path(workdir)
    if changes and (directory / CONFIG_FILE).exists():
        kept = directory / f"config.{step}.json"
        if not kept.exists():
            kept.write_text((directory / CONFIG_FILE).read_text())
        logging.warning("resuming at step %d with changed %s; the previous config is kept as %s", step,
                        ", ".join(f"config.{f}" for f, _, _ in changes), kept.name)
    cli.write_config(workdir, config, name=CONFIG_FILE)
