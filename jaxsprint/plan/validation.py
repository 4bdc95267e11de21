r"""The planner against the real SPRINT runtime: measured time to accuracy beside the predicted one.

For each configuration ``(learners, sub-batch, emulated network time)`` on this machine:

1. **Measure** (:func:`measure`): :func:`jaxsprint.runtime.run` trains the runtime's network (``tiny_nobn``
   at 8x8 on digits, momentum SGD at a constant learning rate, evaluated every few updates); from its event
   log (:func:`jaxsprint.runtime.events.statistics`) come the measured ``T_u``, mean mini-batch, mean
   staleness and both pmfs; from its evaluation history the first published version whose test accuracy
   reaches the target (interpolated), ``U_meas``; the measured time to accuracy is the publish time of that
   version (the updater's clock), also reported as ``U_meas T_u``.
2. **Emulate** (:func:`emulated_spec`): the same network in the emulator (:mod:`jaxsprint.plan.emulator`,
   proxy ``tiny_nobn``), with delays and mini-batches drawn from the runtime's *measured* pmfs and the same
   learning rate (the delays in non-empty updates, :func:`jaxsprint.runtime.events.effective_staleness`).
3. **Predict** (:func:`compare`): the law (:func:`jaxsprint.plan.law.fit_law`) fitted to the emulated cells,
   evaluated at this one's measured mean mini-batch and staleness, times its measured ``T_u``: fitted to every
   configuration's cell, as the planner fits the cells of its own candidates (no runtime accuracy enters a
   prediction), and, stricter, to the OTHER configurations' cells only (leave one out, keys ``*_loo``: the law
   extrapolates to a cell it never saw). The planner's choice is the configuration with the smallest
   prediction within the staleness of the fitted cells that reached the target (beyond it the law is
   extrapolated; the row says ``extrapolated``); it is compared with the measured fastest.

This isolates the convergence half (law + emulator) from the timing model, whose own validation against the
runtime is :mod:`jaxsprint.calibration.compare`.
"""
from __future__ import annotations

import copy
import json
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

from jaxsprint.plan import emulator
from jaxsprint.errors import ConfigError, check
from jaxsprint.plan import law as plan_lib

__all__ = ["check_runtime_configs", "compare", "emulated_spec", "measure", "parse_configs", "pool", "runtime_config",
           "updates_from_history"]


def parse_configs(text: Sequence[str]) -> list[tuple[int, int, float]]:
    """``["learners:sub_batch:network_time_s", ...]`` -> tuples.

    Raises:
      ConfigError: naming ``config.runtime_configs``.
    """
    out = []
    for item in text:
        try:
            n, b, t = str(item).split(":")
            cfg = (int(n), int(b), float(t))
        except ValueError:
            raise ConfigError("config.runtime_configs", item,
                              "learners:sub_batch:network_time_s, e.g. 4:16:0.01") from None
        check(cfg[0] >= 1 and cfg[1] >= 1 and math.isfinite(cfg[2]) and cfg[2] >= 0, "config.runtime_configs",
              item, "learners >= 1, sub_batch >= 1, network_time_s >= 0")
        out.append(cfg)
    check(len(out) >= 2, "config.runtime_configs", list(text),
          "at least two configurations (one is left out at a time)")
    return out


def runtime_config(base: Any, *, learners: int, sub_batch: int, network_time_s: float, num_updates: int,
                   eval_every_updates: int, learning_rate: float, seed: int = 0, training: Any = None) -> Any:
    """A SPRINT config (``experiments/configs/sprint.py``) for one configuration of the comparison: of the
    proxy ``tiny_nobn`` at 8x8 on the digits, or of `training`'s network (model, data, augmentation, the
    optimizer's weight decay), as the network emulator trains it."""
    c = copy.deepcopy(base)
    with c.unlocked():
        if training is None:
            c.model, c.image_size, c.dataset = "tiny_nobn", 8, "digits"
            # The emulator trains the proxy on the un-augmented images (emulator.load_proxy_data): so must the
            # runtime, or the comparison measures the augmentation (the SPRINT config's random-resized crops
            # made the runtime need about 1.8x the emulator's updates at every staleness).
            c.augment.kind = "none"
        else:
            for field in ("model", "image_size", "dataset", "data_dir", "label_smoothing", "dtype"):
                c[field] = training[field]
            c.augment = copy.deepcopy(training.augment)
            c.optimizer.weight_decay = training.optimizer.weight_decay
        c.lr.scaling, c.lr.schedule, c.lr.base, c.lr.warmup_epochs = "none", "constant", float(learning_rate), 0.0
        s = c.sprint
        s.learners_per_host, s.sub_batch, s.network_time_s = int(learners), int(sub_batch), float(network_time_s)
        s.num_updates, s.duration_s, s.num_epochs = int(num_updates), 0.0, 0.0
        s.eval_every_updates, s.seed, s.checkpoint = int(eval_every_updates), int(seed), False
        # Evaluated after the run: evaluating while it runs takes the cores from the updater and the learners
        # and changes the staleness being measured (with 8 learners at sub-batch 64 on this project's 2-core
        # machine, mean staleness 6.3 with live evaluation every 10 updates, 15-16 without).
        s.eval_deferred = True
        s.warmup_s = 0.0  # every update counts: the statistics must describe the whole run to the target
    return c


# The plan config's field behind each SPRINT field that `runtime_config` sets (the errors name the user's field).
_FIELDS = {"config.sprint.learners_per_host": "config.runtime_configs",
           "config.sprint.sub_batch": "config.runtime_configs",
           "config.sprint.network_time_s": "config.runtime_configs",
           "config.sprint.num_updates": "config.runtime_updates",
           "config.sprint.eval_every_updates": "config.eval_every",
           "config.lr.base": "config.base_lr", "config.optimizer.momentum": "config.momentum"}


def check_runtime_configs(base: Any, configs: Sequence[tuple[int, int, float]], num_local_devices: int,
                          **kwargs: Any) -> None:
    """Checks the runtime run of every configuration (`runtime_config` of `base` with `kwargs`) as
    :func:`jaxsprint.runtime.validate_config` would, this host's bounds included, before any runs.

    Raises:
      ConfigError: naming the plan config's field (``config.runtime_configs`` for a configuration's learners,
        sub-batch or network time).
    """
    from jaxsprint import runtime

    for n, b, t in configs:
        try:
            runtime.validate_config(runtime_config(base, learners=n, sub_batch=b, network_time_s=t, **kwargs),
                                    num_local_devices)
        except ConfigError as e:
            field = _FIELDS.get(e.field, e.field)
            value = f"{n}:{b}:{t:g}" if field == "config.runtime_configs" else e.value
            raise ConfigError(field, value, f"{e.allowed} (as {e.field} of its runtime run)") from None


def updates_from_history(history: Sequence[tuple[int, Mapping[str, float]]], target: float) -> float | None:
    """First version at which the evaluated accuracy reaches ``target`` (interpolated), or None."""
    if not history:
        return None
    v = np.asarray([h[0] for h in history], np.float64)
    a = np.asarray([h[1]["accuracy"] for h in history], np.float64)
    return emulator.updates_to_target(v, a, target)


def _pmf_array(pmf: Mapping[Any, float], size: int | None = None) -> np.ndarray:
    keys = [int(k) for k in pmf]
    out = np.zeros((max(keys) + 1 if size is None else size))
    for k, p in pmf.items():
        out[min(int(k), out.size - 1)] += float(p)
    return out / out.sum()


RUN_RECORD = "plan_runtime_config.json"  # the config a finished run of the workdir was made with


def _saved_run(config: Any, workdir: str) -> tuple[dict[str, np.ndarray], list, dict] | None:
    """The finished run in ``workdir`` (events, evaluation history, final evaluation) if it was made with
    exactly ``config`` (its JSON equals :data:`RUN_RECORD`'s), else None."""
    from jaxsprint.runtime import events

    paths = [os.path.join(workdir, f) for f in (RUN_RECORD, "events.npz", "summary.json")]
    if not all(os.path.isfile(p) for p in paths):
        return None
    with open(paths[0]) as fh:
        if fh.read() != config.to_json(sort_keys=True):
            return None
    with open(paths[2]) as fh:
        summary = json.load(fh)
    history = [(int(h["version"]), {k: v for k, v in h.items() if k != "version"}) for h in summary["eval_history"]]
    return events.load(paths[1]), history, dict(summary.get("eval", {}))


def measure(config: Any, workdir: str, target_accuracy: float, *, reuse: bool = False) -> dict[str, Any]:
    """Runs the runtime on ``config``; its measured statistics and time to accuracy (module docstring).

    With ``reuse``, a finished run in ``workdir`` made with the same config (:data:`RUN_RECORD`) is read
    instead of run again, so that one set of runs can be judged at several targets; any difference in the
    config runs it again.
    """
    from jaxsprint import runtime
    from jaxsprint.runtime import events

    saved = _saved_run(config, workdir) if reuse else None
    if saved is None:
        record = os.path.join(workdir, RUN_RECORD)
        if os.path.exists(record):  # the old run's record must not vouch for the new run's files
            os.remove(record)
        res = runtime.run(config, workdir)
        log, history, final = res.events, res.eval_history, res.eval
        with open(record, "w") as fh:
            fh.write(config.to_json(sort_keys=True))
    else:
        log, history, final = saved
    st = events.statistics(log)
    u = updates_from_history(history, target_accuracy)
    t_end = np.asarray(log["update_t_end"], np.float64)
    wall = None
    if u is not None and t_end.size:
        i = min(int(math.ceil(u)), t_end.size) - 1
        wall = float(t_end[i])
    keep = ("t_compute_s", "t_update_s", "mean_minibatch", "mean_staleness", "staleness_pmf", "minibatch_pmf",
            "mean_effective_staleness", "effective_staleness_pmf", "learners", "sub_batch", "network_time_s",
            "updates")
    return {**{k: st[k] for k in keep}, "updates_to_target": u,
            "time_to_accuracy_s": wall, "time_to_accuracy_from_updates_s": None if u is None else u * st["t_update_s"],
            "final_accuracy": float(final.get("accuracy", math.nan)), "reused": saved is not None}


def _median_or_none(values: Sequence[float | None]) -> float | None:
    """Median with a run that never reached the target counted as infinitely late (None when it is one)."""
    m = float(np.median([math.inf if v is None else float(v) for v in values]))
    return m if math.isfinite(m) else None


def pool(seeds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One configuration's :func:`measure` of several runtime seeds as one measurement.

    The statistics (``T_u``, mean mini-batch and staleness) are the seeds' means and the pmfs their average
    (the emulator draws from the pooled run); the updates and time to the target are the seeds' medians, a
    seed that never reached it counting as infinitely late (so the configuration reaches it when most seeds
    do). ``per_seed`` keeps each seed's numbers.
    """
    check(len(seeds) >= 1, "config.runtime_seeds", len(seeds), "an integer >= 1")
    if len(seeds) == 1:
        return {**seeds[0], "per_seed": [_seed_row(seeds[0])]}
    out = dict(seeds[0])
    for k in ("t_compute_s", "t_update_s", "mean_minibatch", "mean_staleness", "mean_effective_staleness"):
        out[k] = float(np.mean([m[k] for m in seeds]))
    for k in ("staleness_pmf", "minibatch_pmf", "effective_staleness_pmf"):
        if all(m.get(k) for m in seeds):
            size = max(max(int(j) for j in m[k]) for m in seeds) + 1
            out[k] = {i: float(p) for i, p in enumerate(np.mean([_pmf_array(m[k], size) for m in seeds], 0))
                      if p > 0}
    for k in ("updates_to_target", "time_to_accuracy_s", "time_to_accuracy_from_updates_s"):
        out[k] = _median_or_none([m[k] for m in seeds])
    out["final_accuracy"] = float(np.mean([m["final_accuracy"] for m in seeds]))
    out["updates"] = int(sum(m["updates"] for m in seeds))
    out["reused"] = all(m["reused"] for m in seeds)
    out["per_seed"] = [_seed_row(m) for m in seeds]
    return out


def _seed_row(m: Mapping[str, Any]) -> dict[str, Any]:
    return {k: m[k] for k in ("mean_staleness", "mean_minibatch", "t_update_s", "updates_to_target",
                              "time_to_accuracy_s")}


def emulated_spec(measured: Mapping[str, Any], learning_rate: float) -> emulator.RunSpec:
    """The emulator's run under a runtime configuration's measured pmfs (staleness; mini-batch in samples)."""
    check(bool(measured["staleness_pmf"]) and bool(measured["minibatch_pmf"]), "config.runtime_updates",
          measured.get("updates"), "enough updates for measured statistics (the run recorded none)")
    # The emulator's ring stands still on an empty update, so its delay counts non-empty updates: it draws the
    # run's staleness in those (events.effective_staleness), not in versions, or it trains a staler run than
    # the one measured wherever empty cycles are common (the high-staleness configurations). The law keeps the
    # version staleness as its coordinate, as the planner's candidates do.
    stale = _pmf_array(measured.get("effective_staleness_pmf") or measured["staleness_pmf"],
                       emulator.MAX_STALENESS + 1)
    mb = _pmf_array(measured["minibatch_pmf"])
    return emulator.RunSpec(stale, mb, float(learning_rate), "none", float(measured["mean_minibatch"]),
                            float(measured["mean_staleness"]), sub_batch=int(measured.get("sub_batch", 0)))


def compare(measured: Sequence[Mapping[str, Any]], cells: Sequence[emulator.RunResult | Any],
            target_accuracy: float, max_updates: int) -> dict[str, Any]:
    """Leave-one-out predictions of each configuration's time to accuracy against the measured ones.

    Args:
      measured: :func:`measure` of each configuration.
      cells: The emulated :class:`~jaxsprint.plan.emulator.RunResult` of each (same order).
      target_accuracy: The target.
      max_updates: The emulated runs' length (censoring).

    Returns:
      ``{"rows": [...], "median_abs_error": ..., "choice": ..., "measured_fastest": ..., "choice_within": ...}``.
    """
    from jaxsprint.plan import planner

    cs = [planner.cell_from_result(r, target_accuracy, max_updates) for r in cells]

    fits: dict[tuple[int, ...], plan_lib.LawFit] = {}  # the all-cells fit serves every row: fitted once

    def law_at(i: int, cells_used: list[int]) -> tuple[float, float, float, bool] | None:
        if not any(not cs[j].censored for j in cells_used):
            return None
        key = tuple(cells_used)
        if key not in fits:
            fits[key] = plan_lib.fit_law([measured[j]["mean_minibatch"] for j in cells_used],
                                         [measured[j]["mean_staleness"] for j in cells_used],
                                         [cs[j].log_updates for j in cells_used],
                                         [cs[j].log_var for j in cells_used], [cs[j].censored for j in cells_used])
        fit = fits[key]
        u, lo, hi = (float(v[0]) for v in plan_lib.band(fit, measured[i]["mean_minibatch"],
                                                       measured[i]["mean_staleness"]))
        return u, lo, hi, measured[i]["mean_staleness"] > fit.max_staleness * (1.0 + 1e-6)

    rows = []
    everyone = list(range(len(measured)))
    for i, m in enumerate(measured):
        row = {k: m[k] for k in ("learners", "sub_batch", "network_time_s", "t_update_s", "mean_minibatch",
                                 "mean_staleness", "updates_to_target", "time_to_accuracy_s")}
        row["emulated_updates"] = cs[i].updates
        for suffix, used in (("", everyone), ("_loo", [j for j in everyone if j != i])):
            pred = law_at(i, used)
            if pred is None:
                continue
            u, lo, hi, beyond = pred
            row.update({f"extrapolated{suffix}": beyond, f"predicted_updates{suffix}": u,
                        f"predicted_time_to_accuracy_s{suffix}": u * m["t_update_s"],
                        f"predicted_time_low_s{suffix}": lo * m["t_update_s"],
                        f"predicted_time_high_s{suffix}": hi * m["t_update_s"]})
            if m["time_to_accuracy_s"]:
                row[f"relative_error{suffix}"] = u * m["t_update_s"] / m["time_to_accuracy_s"] - 1.0
        if "per_seed" in m:
            row["per_seed"] = m["per_seed"]
        rows.append(row)
    meas = [r["time_to_accuracy_s"] or math.inf for r in rows]
    fastest = int(np.argmin(meas))
    # The staleness factor of the emulated runs against the runtime's: updates to the target, both reached.
    both = [r["emulated_updates"] / r["updates_to_target"] - 1.0 for r in rows
            if r["emulated_updates"] and r["updates_to_target"]]
    out: dict[str, Any] = {"rows": rows, "measured_fastest": fastest,
                           "emulator_median_abs_error": float(np.median(np.abs(both))) if both else None}
    for suffix in ("", "_loo"):
        errs = [abs(r[f"relative_error{suffix}"]) for r in rows if f"relative_error{suffix}" in r]
        # The choice, as the planner's (law.plan_search), is held to the staleness of the cells that reached
        # the target: beyond it the law's staleness factor is extrapolated from censored cells only.
        pred = [math.inf if r.get(f"extrapolated{suffix}", True) else r[f"predicted_time_to_accuracy_s{suffix}"]
                for r in rows]
        choice = int(np.argmin(pred))
        out[f"median_abs_error{suffix}"] = float(np.median(errs)) if errs else None
        out[f"choice{suffix}"] = choice
        out[f"choice_slower_than_fastest_by{suffix}"] = (meas[choice] / meas[fastest] - 1.0
                                                         if math.isfinite(meas[fastest]) else None)
    return out
