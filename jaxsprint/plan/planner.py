r"""The time-to-accuracy planner: candidates -> emulated convergence -> fitted law -> choice.

Ties the pure model side (:mod:`jaxsprint.plan.law`: candidates, law, fit, search) to the emulated runs
(:mod:`jaxsprint.plan.emulator`):

1. **Candidates**: SPRINT's rule (:func:`jaxsprint.plan.law.candidates`) over a ladder of mean mini-batch
   targets and mean-staleness limits.
2. **Runs**: each candidate's staleness and mini-batch pmfs (:func:`jaxsprint.perf.sprint.delay_pmfs`) drive
   an emulated run of the proxy (:class:`jaxsprint.plan.emulator.Emulator`), cached on disk. A space-filling
   first design (farthest points in ``(log B, log(1 + tau))``) is followed by rounds of runs where the fit
   is least certain (:func:`jaxsprint.plan.law.least_certain`) until ``budget_runs`` runs are spent.
3. **Fit**: the law ``U(B, tau)`` with its uncertainty (:func:`jaxsprint.plan.law.fit_law`).
4. **Choice**: the configuration minimising ``U T_u`` (:func:`jaxsprint.plan.law.plan_search`), beside the
   configuration SPRINT's rule picks for the same target mini-batch.

When no run reaches the target the answer says so and gives the best accuracy reached (and where); the
planner does not fail. :func:`holdout` measures the law's error on cells that were not fitted.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Sequence

import numpy as np

from jaxsprint.plan import emulator
from jaxsprint.errors import ConfigError, check
from jaxsprint.plan import law as plan_lib
from jaxsprint.perf import search, sprint
from jaxsprint.perf import space as spaces

__all__ = ["Cell", "PlanSettings", "cell_from_result", "candidate_spec", "check_target_accuracy", "holdout",
           "run_plan", "settings_from_config", "spread_design"]


# The size of a plan: each emulated run takes seconds to minutes, and every candidate is one gradient search, so
# beyond these a plan runs for days; they are far above what a plan needs (docs/planning.md: 16 runs, 8 starts).
MAX_RUNS = 1000          # budget_runs, runs_per_round, holdout cells
MAX_SEARCH_STARTS = 1000


def check_target_accuracy(value: Any) -> float:
    """``float(value)`` when in ``(0, 1]``, else a :class:`ConfigError` naming ``config.target_accuracy``."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if not 0.0 < v <= 1.0:  # NaN fails too
        raise ConfigError("config.target_accuracy", value, "a fraction in (0, 1], e.g. 0.95")
    return v


@dataclasses.dataclass(frozen=True)
class PlanSettings:
    """The planner's part of a plan config (``experiments/configs/plan.py``), typed; built by
    :func:`settings_from_config`. Every field has the name and meaning of the config field.

    Attributes:
      target_accuracy: Test accuracy to reach, in (0, 1].
      lr_rule, base_lr, reference_batch: The proxy's learning rate (:func:`jaxsprint.plan.emulator.make_spec`).
      minibatch_scale: Cluster samples per proxy sample (resolved: the config's, or derived from the data).
      t_compute_cv: Coefficient of variation of the learners' compute time (the pmfs' jitter).
      tolerance: Relative band of SPRINT's rule around each mini-batch target.
      budget_runs: Emulated runs at most (cached runs count as well: they are fitted too), at most `MAX_RUNS`.
      initial_runs: Runs of the space-filling first design, at most budget_runs.
      runs_per_round: Runs added per round where the fit is least certain.
      search_starts: Starts of each gradient search.
      b_noise: A measured gradient noise scale of the emulated network on its data (its samples; None: the
        law fits B_noise too); the fit takes it as B_noise (times minibatch_scale), with
      b_noise_se: its standard error (:func:`jaxsprint.plan.law.measured_noise_prior`).
    """

    target_accuracy: float = 0.95
    lr_rule: str = "linear"
    base_lr: float = 0.05
    reference_batch: float = 32.0
    minibatch_scale: float = 1.0
    t_compute_cv: float = 0.05
    tolerance: float = 0.05
    budget_runs: int = 16
    initial_runs: int = 8
    runs_per_round: int = 2
    search_starts: int = 8
    b_noise: float | None = None
    b_noise_se: float = 0.0

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming the config field of the first bad value."""
        check_target_accuracy(self.target_accuracy)
        check(self.lr_rule in emulator.LR_RULES, "config.lr_rule", self.lr_rule,
              f"one of {', '.join(emulator.LR_RULES)}")
        for field in ("base_lr", "reference_batch", "minibatch_scale"):
            v = getattr(self, field)
            check(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0,
                  f"config.{field}", v, "a finite number > 0")
        check(isinstance(self.t_compute_cv, (int, float)) and 0.0 <= self.t_compute_cv <= 2.0,
              "config.t_compute_cv", self.t_compute_cv, "a number in [0, 2]")
        check(isinstance(self.tolerance, (int, float)) and 0.0 < self.tolerance < 1.0, "config.tolerance",
              self.tolerance, "a number > 0 and < 1")
        for field, most in (("budget_runs", MAX_RUNS), ("initial_runs", MAX_RUNS), ("runs_per_round", MAX_RUNS),
                            ("search_starts", MAX_SEARCH_STARTS)):
            v = getattr(self, field)
            check(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= most, f"config.{field}", v,
                  f"an integer in [1, {most}]")
        check(self.initial_runs <= self.budget_runs, "config.initial_runs", self.initial_runs,
              f"at most config.budget_runs={self.budget_runs} (the first design is part of the budget)")
        check(self.b_noise is None or (isinstance(self.b_noise, (int, float)) and math.isfinite(self.b_noise)
                                       and self.b_noise > 0), "config.b_noise", self.b_noise,
              "None (fitted) or a measured noise scale > 0 (experiments/configs/noise_scale.py measures it)")
        check(isinstance(self.b_noise_se, (int, float)) and math.isfinite(self.b_noise_se) and self.b_noise_se >= 0,
              "config.b_noise_se", self.b_noise_se, "a standard error >= 0")


def settings_from_config(config: Any, **resolved: Any) -> PlanSettings:
    """The validated :class:`PlanSettings` of a plan config (any mapping with its fields), the one place where
    the config becomes the planner's settings; `resolved` gives values the launcher derived (minibatch_scale).

    Raises:
      ConfigError: naming the first bad field (``config.<field>``).
    """
    values = {f.name: resolved.get(f.name, config.get(f.name, f.default)) for f in dataclasses.fields(PlanSettings)}
    if values["target_accuracy"] is None:
        raise ConfigError("config.target_accuracy", None, "a fraction in (0, 1]; the field is required")
    if values["minibatch_scale"] is None:
        values["minibatch_scale"] = 1.0
    settings = PlanSettings(**values)
    settings.validate()
    return settings


# ----------------------------------------------------------------------------------------------
# Candidates as runs, runs as cells
# ----------------------------------------------------------------------------------------------


def candidate_spec(cand: search.Candidate, opts: PlanSettings) -> emulator.RunSpec:
    """The emulated run of a candidate: its model pmfs, mapped to proxy mini-batches, and the lr rule."""
    n = cand.nodes * cand.gpus_per_node
    mean_k = cand.mean_minibatch / cand.sub_batch
    max_count = int(math.ceil(mean_k + 12.0 * math.sqrt(mean_k + 1.0) * (1.0 + opts.t_compute_cv) + 16))
    stale, count = sprint.delay_pmfs(n, cand.t_compute_s, cand.t_update_s, opts.t_compute_cv,
                                     max_staleness=emulator.MAX_STALENESS, max_count=max_count)
    return emulator.make_spec(np.asarray(stale, np.float64), np.asarray(count, np.float64),
                                 sub_batch=cand.sub_batch, scale=opts.minibatch_scale, lr_rule=opts.lr_rule,
                                 base_lr=opts.base_lr, reference_batch=opts.reference_batch,
                                 mean_minibatch=cand.mean_minibatch, mean_staleness=cand.mean_staleness,
                                 statistics={"learners": n, "t_compute_s": cand.t_compute_s,
                                             "t_update_s": cand.t_update_s, "cv": opts.t_compute_cv})


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run as the fit sees it.

    Attributes:
      log_updates: log of the updates to the target of the seed-mean curve (censored: of the run's length).
      log_var: Variance of that log (from the per-seed crossings, over the number of seeds).
      censored: The seed-mean curve never reached the target.
      best_accuracy: Highest seed-mean accuracy of the run.
      seeds_reached: Seeds whose own curve reached the target.
    """

    log_updates: float
    log_var: float
    censored: bool
    best_accuracy: float
    seeds_reached: int

    @property
    def updates(self) -> float | None:
        return None if self.censored else math.exp(self.log_updates)


def cell_from_result(result: emulator.RunResult, target: float, max_updates: int) -> Cell:
    """The :class:`Cell` of a run: crossing of the seed-mean curve, spread of the per-seed crossings."""
    mean = np.nanmean(np.nan_to_num(result.accuracy, nan=0.0), 0)
    u = emulator.updates_to_target(result.updates, mean, target)
    per_seed = [emulator.updates_to_target(result.updates, a, target) for a in result.accuracy]
    reached = [math.log(max(v, 1e-3)) for v in per_seed if v is not None]
    seeds = result.accuracy.shape[0]
    # Seed spread of log U over the number of seeds; with fewer than two crossings a broad default.
    var = float(np.var(reached, ddof=1)) / seeds if len(reached) >= 2 else 0.25
    if u is None:
        return Cell(math.log(max_updates), var, True, float(mean.max()), len(reached))
    return Cell(math.log(max(u, 1e-3)), var, False, float(mean.max()), len(reached))


def spread_design(points: np.ndarray, k: int) -> list[int]:
    """``k`` indices of ``points`` ``[n, d]`` by farthest-point sampling (starting from the first point)."""
    pts = np.asarray(points, np.float64)
    if len(pts) == 0:
        return []
    span = np.ptp(pts, 0)
    pts = (pts - pts.min(0)) / np.where(span > 0, span, 1.0)
    chosen = [0]
    dist = np.linalg.norm(pts - pts[0], axis=1)
    while len(chosen) < min(k, len(pts)):
        i = int(np.argmax(dist))
        chosen.append(i)
        dist = np.minimum(dist, np.linalg.norm(pts - pts[i], axis=1))
    return chosen


def _design_points(cands: Sequence[search.Candidate]) -> np.ndarray:
    return np.asarray([[math.log(c.mean_minibatch), math.log1p(c.mean_staleness)] for c in cands])


def _fit(cands, cells: dict[int, Cell], opts: PlanSettings) -> plan_lib.LawFit:
    """The law over the cells run so far; B_noise from `opts.b_noise` (in cluster samples) when measured."""
    idx = sorted(cells)
    b = [cands[i].mean_minibatch for i in idx]
    b_ref = float(np.exp(np.mean(np.log(b))))
    prior = None
    if opts.b_noise is not None:
        prior = plan_lib.measured_noise_prior(opts.b_noise * opts.minibatch_scale,
                                              opts.b_noise_se * opts.minibatch_scale, b_ref)
    return plan_lib.fit_law(b, [cands[i].mean_staleness for i in idx], [cells[i].log_updates for i in idx],
                            [cells[i].log_var for i in idx], [cells[i].censored for i in idx], b_ref=b_ref,
                            prior=prior)


def _row(c: search.Candidate, fit: plan_lib.LawFit | None, cell: Cell | None, role: str) -> dict[str, Any]:
    row = {"role": role, "nodes": c.nodes, "gpus_per_node": c.gpus_per_node, "sub_batch": c.sub_batch,
           "epoch_time_s": c.epoch_time_s, "mean_minibatch": c.mean_minibatch, "mean_staleness": c.mean_staleness,
           "t_update_s": c.t_update_s}
    if cell is not None:
        row.update(emulated_updates=cell.updates, emulated_best_accuracy=cell.best_accuracy,
                   emulated_time_to_accuracy_s=None if cell.censored else cell.updates * c.t_update_s)
    if fit is not None:
        u, lo, hi = (float(v[0]) for v in plan_lib.band(fit, c.mean_minibatch, c.mean_staleness))
        row.update(predicted_updates=u, predicted_updates_low=lo, predicted_updates_high=hi,
                   predicted_time_to_accuracy_s=u * c.t_update_s,
                   predicted_time_low_s=lo * c.t_update_s, predicted_time_high_s=hi * c.t_update_s,
                   in_fitted_range=bool(fit.minibatch_range[0] * (1 - 1e-6) <= c.mean_minibatch
                                        <= fit.minibatch_range[1] * (1 + 1e-6)))
    return row


def _candidate_of(space: spaces.Space, config: Sequence[int], tolerance: float) -> search.Candidate:
    return search.evaluate_configs(space, spaces.make_target(1.0, tolerance), [list(config)])[0]


# ----------------------------------------------------------------------------------------------
# The planner
# ----------------------------------------------------------------------------------------------


def run_plan(space: spaces.Space, emulator: emulator.Emulator, cache: emulator.RunCache, opts: PlanSettings,
             *, minibatch_targets: Sequence[float], staleness_limits: Sequence[float],
             max_staleness: float | None = None, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Candidates, emulated runs within the budget, the fitted law, the choice (module docstring).

    Args:
      space: The configuration space (machine, network, ranges).
      emulator: The proxy's emulator.
      cache: Where runs are kept between plans.
      opts: Settings.
      minibatch_targets: The ladder of mean mini-batch targets (cluster samples).
      staleness_limits: Mean-staleness limits of the candidates (``inf``: none).
      max_staleness: A limit on the chosen configuration's mean staleness (None: the fitted range's).
      log: Progress messages.

    Returns:
      A JSON-ready report: ``candidates`` (rows), ``fit``, ``chosen``, ``sprint_rule``, ``reached``,
      ``best_reached`` (when nothing reached the target), ``runs`` (trained, cached), ``seconds`` by phase.

    Raises:
      ConfigError: bad options, or no configuration of the space meets any mini-batch target.
    """
    opts.validate()
    t0 = time.perf_counter()
    cands = plan_lib.candidates(space, minibatch_targets, staleness_limits, tolerance=opts.tolerance,
                                starts=opts.search_starts)
    if not cands:
        raise ConfigError("config.minibatch_range", [float(b) for b in minibatch_targets],
                          f"mini-batch targets some configuration of {space.machine.name} meets (none of them is "
                          f"met with at most {space.max_nodes} nodes; try a larger config.max_nodes or smaller "
                          "targets)")
    t_cand = time.perf_counter() - t0
    log(f"{len(cands)} candidates in {t_cand:.1f} s")
    specs = [candidate_spec(c, opts) for c in cands]
    emulator.min_bucket = max([emulator.min_bucket] + [s.max_minibatch for s in specs])
    cells: dict[int, Cell] = {}
    trained_before = cache.misses

    def run(i: int) -> None:
        t = time.perf_counter()
        r = cache.run(emulator, specs[i])
        cells[i] = cell_from_result(r, opts.target_accuracy, emulator.max_updates)
        c = cells[i]
        log(f"  run {len(cells)}: {cands[i].config} B={cands[i].mean_minibatch:.4g} tau={cands[i].mean_staleness:.3g}"
            f" -> {'not reached' if c.censored else f'{c.updates:.0f} updates'} (best {c.best_accuracy:.3f})"
            f"{' cached' if r.cached else f' {time.perf_counter() - t:.1f} s'}")

    t1 = time.perf_counter()
    budget = min(opts.budget_runs, len(cands))
    for i in spread_design(_design_points(cands), min(opts.initial_runs, budget)):
        run(i)
    fit = None
    while True:
        if any(not c.censored for c in cells.values()):
            fit = _fit(cands, cells, opts)
        if len(cells) >= budget:
            break
        done = [i in cells for i in range(len(cands))]
        k = min(opts.runs_per_round, budget - len(cells))
        if fit is None:
            nxt = [i for i in spread_design(_design_points(cands), len(cands)) if not done[i]][:k]
        else:
            nxt = plan_lib.least_certain(fit, [c.mean_minibatch for c in cands], [c.mean_staleness for c in cands],
                                         done, k)
        for i in nxt:
            run(i)
    t_runs = time.perf_counter() - t1
    report: dict[str, Any] = {
        "target_accuracy": opts.target_accuracy, "options": dataclasses.asdict(opts),
        "emulator": emulator.key_fields(), "describes": emulator.describe(),
        "b_noise_source": "fitted" if opts.b_noise is None else "measured",
        "runs": {"used": len(cells), "trained": cache.misses - trained_before,
                 "cached": len(cells) - (cache.misses - trained_before)},
        "reached": fit is not None,
    }
    if fit is None:  # no run reached the target: the best reached, not a crash
        i = max(cells, key=lambda j: cells[j].best_accuracy)
        report["best_reached"] = {**_row(cands[i], None, cells[i], "best reached"),
                                  "accuracy": cells[i].best_accuracy}
        report["candidates"] = [_row(c, None, cells.get(j), "candidate") for j, c in enumerate(cands)]
        report["seconds"] = {"candidates": t_cand, "runs": t_runs, "total": time.perf_counter() - t0}
        return report
    t2 = time.perf_counter()
    choice = plan_lib.plan_search(space, fit, max_staleness=max_staleness)
    chosen = _candidate_of(space, choice.config, opts.tolerance)
    rule = search.gradient_search(space, spaces.make_target(chosen.mean_minibatch, opts.tolerance),
                                  starts=opts.search_starts).best
    report.update(
        fit=fit.as_dict(),
        chosen={**_row(chosen, fit, None, "chosen"), "feasible": choice.feasible,
                "evaluations": choice.evaluations},
        sprint_rule=_row(rule, fit, None, "SPRINT rule") if rule is not None else None,
        candidates=[_row(c, fit, cells.get(j), "candidate") for j, c in enumerate(cands)],
    )
    if rule is not None:
        report["speedup_over_sprint_rule"] = (report["sprint_rule"]["predicted_time_to_accuracy_s"]
                                              / report["chosen"]["predicted_time_to_accuracy_s"])
    report["seconds"] = {"candidates": t_cand, "runs": t_runs, "choice": time.perf_counter() - t2,
                         "total": time.perf_counter() - t0}
    report["_fit"] = fit  # for holdout(); dropped by the launcher's JSON
    return report


def holdout(space: spaces.Space, emulator: emulator.Emulator, cache: emulator.RunCache, opts: PlanSettings,
            fit: plan_lib.LawFit, fitted: Sequence[tuple[int, ...]], *, minibatch_targets: Sequence[float],
            staleness_limits: Sequence[float], cells: int = 8,
            log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """The law's error on cells it was not fitted to: candidates of another ladder, each emulated.

    Args:
      fit: The law fitted by :func:`run_plan`.
      fitted: Configurations that were fitted (left out here).
      minibatch_targets, staleness_limits: The held-out ladder (e.g. the midpoints of the plan's ladder).
      cells: Held-out cells at most (farthest-point spread over the held-out candidates).

    Returns:
      ``{"cells": [...], "median_abs_error": ..., "reached": n, "censored_predicted_ok": n}``: per cell the
      predicted and emulated updates and ``|U_pred / U_emulated - 1|`` (cells the emulation did not finish
      are reported with whether the law also predicts more updates than the run's length).
    """
    cands = [c for c in plan_lib.candidates(space, minibatch_targets, staleness_limits, tolerance=opts.tolerance,
                                            starts=opts.search_starts) if c.config not in set(map(tuple, fitted))]
    lo, hi = fit.minibatch_range
    cands = [c for c in cands if lo <= c.mean_minibatch <= hi]
    picked = [cands[i] for i in spread_design(_design_points(cands), cells)] if cands else []
    rows, errs, cens_ok = [], [], 0
    for c in picked:
        spec = candidate_spec(c, opts)
        emulator.min_bucket = max(emulator.min_bucket, spec.max_minibatch)
        cell = cell_from_result(cache.run(emulator, spec), opts.target_accuracy, emulator.max_updates)
        u, ulo, uhi = (float(v[0]) for v in plan_lib.band(fit, c.mean_minibatch, c.mean_staleness))
        row = {**_row(c, None, cell, "held out"), "predicted_updates": u, "predicted_updates_low": ulo,
               "predicted_updates_high": uhi}
        if cell.censored:
            row["law_predicts_beyond_run"] = u > emulator.max_updates
            cens_ok += int(row["law_predicts_beyond_run"])
        else:
            row["relative_error"] = u / cell.updates - 1.0
            errs.append(abs(row["relative_error"]))
        log(f"  held out {c.config} B={c.mean_minibatch:.4g} tau={c.mean_staleness:.3g}: predicted {u:.0f}, "
            f"emulated {'not reached' if cell.censored else f'{cell.updates:.0f}'}")
        rows.append(row)
    return {"cells": rows, "reached": len(errs), "censored": len(rows) - len(errs),
            "censored_predicted_ok": cens_ok, "median_abs_error": float(np.median(errs)) if errs else None}
