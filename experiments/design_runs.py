"""The calibration's designed runtime runs (``calibration.runs=design`` of ``experiments/calibrate_runtime.py``).

:func:`plan` fits this machine's lone steps and all-reduces into the cpu_runtime preset (:func:`start`), takes
the candidates' sensitivities there and chooses the runs (``jaxsprint.calibration.design``: one run of every
regime first, every run measuring the share of its plan at which those fit, then the most informative per
second); :func:`measure` runs them, the runs of one process layout in a row in the same processes
(``experiments.runtime_runs.run_series``). Where the series take longer than planned, the runs left are fitted
to what is left of ``budget_s`` and ``total_s`` (``design.squeeze``): runs that are not their regime's last and
that no determined figure needs (``design.DETERMINED_RSE``) go first, then every run left is shortened (down to
``run_scale_floor`` of its plan), and those go only where even the shortest would not fit.
"""
from __future__ import annotations

import dataclasses
import math
import os
import shutil
import tempfile
import time

import numpy as np

from experiments import runtime_runs
from jaxsprint.calibration import compare, design, host_fit
from jaxsprint.errors import check

__all__ = ["Plan", "measure", "plan", "start"]


def start(config, measured):
    """The cpu_runtime preset with the lone steps and all-reduces of ``measured`` fitted (stages 1-2): the
    network, the step and all-reduce timings, the step's cores, the input draws, the machine and its host."""
    from jaxsprint.calibration import host, model_fit, timing
    from jaxsprint.calibration.measurements import gradient_step_seconds
    from jaxsprint.errors import DataError
    from jaxsprint.perf import machines

    net = timing.runtime_network(config)
    steps = [model_fit.StepTiming(net, int(s["sub_batch"]), gradient_step_seconds(s), 0.0,
                                  f"gradient b{s['sub_batch']}") for s in measured["gradient_steps"]]
    cores = [float(c["cores"]) for c in measured.get("step_cores", [])]
    ars = [model_fit.AllreduceTiming(float(a["bytes"]), int(a["ranks"]), float(a["measured_s"]))
           for a in measured["allreduces"]]
    try:  # absent in files of before the input draws: the preset's figure is kept
        draws = [(int(d["sub_batch"]), [float(x) for x in d["samples"]]) for d in measured.get("input_draws", [])]
    except (KeyError, TypeError, ValueError):
        raise DataError("config.calibration.measurements", "input_draws", "a list of records with a sub_batch and "
                        "its draw times (samples), as calibrate_runtime.py writes") from None
    machine = machines.get("cpu_runtime")
    return (net, steps, ars, (float(np.median(cores)) if cores else None), draws, machine,
            host.load_host(machine, "cpu_runtime"))


@dataclasses.dataclass
class Plan:
    """A design: the candidate ``pool`` with each one's process ``layout`` and regime (``groups``), their
    sensitivities ``jac`` to ``fields``, the runs ``chosen`` within ``budget_s`` and the share of its planned
    measuring each gets (``scale``), under ``k`` (``config.calibration``); ``times``: each candidate's predicted
    (T_c, T_u)."""
    k: object
    pool: list
    times: list
    layout: list
    groups: list
    fields: list
    jac: np.ndarray | None = None
    chosen: list = dataclasses.field(default_factory=list)
    scale: float = 1.0
    budget_s: float = 0.0
    _lengths: dict = dataclasses.field(default_factory=dict, repr=False)

    def extra_s(self, i, before):
        """What run ``i`` adds after ``before``: its series' processes if none is started, the step's compilation
        for a sub-batch new to the series."""
        same = [self.pool[j].sub_batch for j in before if self.layout[j] == self.layout[i]]
        compile_s = self.k.run_compile_s * self.pool[i].hosts * self.pool[i].learners_per_host
        start_s = self.k.run_startup_s * self.pool[i].hosts  # the processes share the cores and then join
        return (0.0 if same else start_s) + (0.0 if self.pool[i].sub_batch in same else compile_s)

    def lengths(self, scale):
        """Every candidate's planned length (s) measuring ``scale`` of its plan."""
        k = self.k
        if scale not in self._lengths:
            self._lengths[scale] = [
                runtime_runs.plan_duration(tc, tu, e.hosts * e.learners_per_host, min_gradients=k.run_min_gradients,
                                           min_updates=k.run_min_updates, warmup_s=k.warmup_s, scale=scale,
                                           max_duration_s=k.run_max_duration_s, min_measure_s=k.run_min_measure_s)
                for e, (tc, tu) in zip(self.pool, self.times)]
        return self._lengths[scale]

    def price(self, i, before, scale):
        """Run ``i``'s seconds after ``before`` at ``scale``: its length, its own start and end, its start-ups."""
        return self.k.run_segment_s + self.lengths(scale)[i] + self.extra_s(i, before)


def plan(config, measured, budget_s):
    """The runs a greedy D-optimal design chooses within ``budget_s()`` seconds (asked once the candidates are
    priced), at the preset with the lone steps and all-reduces of ``measured`` fitted (:class:`Plan`, its
    ``budget_s`` that; ``chosen`` empty where no run fits)."""
    k = config.calibration
    net, steps, ars, cores, draws, machine, host = start(config, measured)
    held = {f: host_fit.FIXED[f] for f in host_fit.ALWAYS_FIXED}
    machine, host, *_ = host_fit.fit_device(machine, host, net, steps=steps, allreduces=ars, step_cores=cores,
                                            input_draws=draws, fixed=held)
    pool = design.candidates()
    times = compare.spec_cycles(net, machine, host, pool)  # the plan's T_c, T_u
    fields = [f for f in host_fit.RUNTIME_FIELDS if f not in host_fit.ALWAYS_FIXED]
    p = Plan(k, pool, times, [runtime_runs.same_processes(e) for e in pool], design.strata(pool), fields)

    def cover(scale):  # what one run of every regime costs, at this share of the planned measuring
        return design.cover_s(set(p.groups), range(len(pool)), p.groups, [], lambda i, b: p.price(i, b, scale))

    p.budget_s = budget = max(float(budget_s()), 0.0)
    p.scale = design.run_scale(cover, budget, k.run_scale_min)
    split = []
    for e, (tc, tu), d in zip(pool, times, p.lengths(p.scale)):
        applying = -math.expm1(-e.hosts * e.learners_per_host * tu / tc)  # cycles that gather a gradient (Poisson)
        split.append(min(applying, 1.0 - applying) * (d - k.warmup_s) / tu >= host_fit.MIN_SPLIT_CYCLES)
    p.jac = design.sensitivities(machine, host, net, pool, fields, split)
    cost = [k.run_segment_s + d for d in p.lengths(p.scale)]
    p.chosen = design.select(p.jac, cost, budget, groups=p.groups, blocks=4, extra_s=p.extra_s)
    return p


def measure(config, measured, *, config_file, overrides=(), log=print, deadline=None, probe=None):
    """The designed runs (:func:`plan` within ``budget_s`` and what is left before ``deadline``, a
    ``time.monotonic()``: ``total_s``), each as its own processes. ``config_file`` and ``overrides``: the SPRINT
    config the runs start from. ``probe() -> seconds`` (``timing.lone_step_probe``), where given, times the lone
    step before the first series and after each: each run's record gets ``probe_s``, the geometric mean of the
    probes around its series (how fast the machine was then). Returns their records (a failed series is reported
    and left out) and the design (the runs chosen, their planned lengths and share, the predicted relative
    standard errors, the runs dropped and those shortened at an overrun, the probes: seconds since the first
    and the step's seconds).

    Raises:
      ConfigError: no run fits in what is left of ``total_s``."""
    k = config.calibration

    probes, began_runs, probe_s = [], time.monotonic(), 0.0

    def probed():  # the lone step now, and its change since the first probe
        probes.append(dict(t_s=time.monotonic() - began_runs, seconds=probe()))
        return probes[-1]["seconds"], probes[-1]["seconds"] / probes[0]["seconds"] - 1.0

    if probe is not None:  # the first probe before the plan, which then reads what is left after it
        probed()
        probe_s = time.monotonic() - began_runs

    def left_s(took_s, probes_left):  # what the runs may still spend: budget_s, and what is left of the wall
        # clock after the probes still to come
        return min(k.budget_s - took_s,
                   math.inf if deadline is None else deadline - time.monotonic() - probe_s * probes_left)

    layouts = {runtime_runs.same_processes(e) for e in design.candidates()}  # the most series a design has
    p = plan(config, measured, lambda: left_s(0.0, len(layouts)))
    budget = p.budget_s
    check(len(p.chosen) > 0, "config.calibration.total_s", k.total_s,
          f"a wall clock that leaves the runs time after the lone steps and all-reduces ({budget:.0f} s left of it, "
          f"less than the shortest run) or config.calibration.fit_s={k.fit_s:g} less")
    pool, chosen = p.pool, p.chosen
    rse = design.predicted_rel_std_error(p.jac, chosen, blocks=4)
    series = {}
    for i in chosen:  # the runs of one layout in a row, in the order chosen
        series.setdefault(p.layout[i], []).append(i)
    planned = sum(p.price(i, chosen[:n], p.scale) for n, i in enumerate(chosen))
    out = dict(chosen=[pool[i].name for i in chosen], planned_s=[p.lengths(p.scale)[i] for i in chosen],
               scale=p.scale, series=[[pool[i].name for i in s] for s in series.values()],
               predicted_rel_std_error={f: (float(v) if v < 1e9 else None) for f, v in zip(p.fields, rse)})
    log(f"design: {len(chosen)} runs in {len(series)} series, about {planned:.0f} s of {budget:.0f} (each run "
        f"measuring {p.scale:.0%} of its plan); predicted "
        "relative standard errors " + ", ".join(f"{f} {v:.2g}" for f, v in zip(p.fields, rse)))
    records, done, took_s, planned_s, dropped, share, shortened = [], [], 0.0, 0.0, [], p.scale, {}
    if probe is not None:
        log(f"lone step probe before the runs: {1e3 * probes[0]['seconds']:.2f} ms")
    root = tempfile.mkdtemp(prefix="jaxsprint-calibrate-runtime-")
    try:
        for n, members in enumerate(series.values()):
            # The runs left, fitted to what is left at the pace measured so far (design.squeeze): a run that pins
            # a figure stays while another would do, and every regime keeps a run while shorter runs fit.
            ahead = [i for i in chosen if i not in done and i not in dropped]
            pace, left, was = design.pace(took_s, planned_s), left_s(took_s, len(series) - n), share
            keep, share = design.squeeze(p.jac, ahead, lambda i, b, s: p.price(i, done + list(b), s), left,
                                         share=share, smallest=k.run_scale_floor, pace=pace, required=done,
                                         groups=p.groups, determined=design.DETERMINED_RSE, blocks=4)
            why = (f"to stay within budget_s={k.budget_s:g} s and total_s={k.total_s:g} s ({left:.0f} s left; the "
                   f"series so far took {took_s:.0f} s of {planned_s:.0f} planned, pace {pace:.3f})")
            if len(keep) < len(ahead):
                dropped += [i for i in ahead if i not in keep]
                log(f"runs dropped {why}: {', '.join(pool[i].name for i in ahead if i not in keep)}")
            if share < was:
                log(f"runs left shortened to measure {share:.0%} of their plan {why}")
            members = [i for i in members if i in keep]
            if not members:
                continue
            entries = [pool[i] for i in members]
            plan_s = sum(p.price(i, done + members[:m], share) for m, i in enumerate(members))
            began = time.monotonic()
            try:
                results = runtime_runs.run_series(entries, [p.lengths(share)[i] for i in members],
                                                  os.path.join(root, f"series{n}"), config_file=config_file,
                                                  overrides=list(overrides), machine_args=["--machine=cpu_runtime"],
                                                  warmup_s=k.warmup_s, timeout_s=k.run_timeout_s * len(members),
                                                  specs=False, compile_cache_dir=os.path.join(root, "compile-cache"))
            except RuntimeError as err:  # one failed series does not end the calibration; it is reported
                log(f"series of {', '.join(e.name for e in entries)}: FAILED: {err}")
                done += members
                continue
            took = time.monotonic() - began
            done += members
            took_s, planned_s = took_s + took, planned_s + plan_s
            shortened.update({e.name: share for e in entries if share < p.scale})
            speed = ""
            if probe is not None:
                before = probes[-1]["seconds"]
                after, change = probed()
                speed = f"; lone step probe {1e3 * after:.2f} ms ({100 * change:+.0f}% on the first)"
            log(f"series {n + 1} of {len(series)}: {len(entries)} runs in {took:.0f} s (planned {plan_s:.0f} s){speed}")
            for e, res in zip(entries, results):
                rec = dict(label=e.name, learners_per_host=e.learners_per_host, hosts=e.hosts, sub_batch=e.sub_batch,
                           updater_device=e.updater_device, **runtime_runs.record(res["measured"]))
                if probe is not None:
                    rec["probe_s"] = math.sqrt(before * after)
                records.append(rec)
                log(f"{e.name}: T_c {1e3 * rec['t_compute_s']:.2f} ms (cv {rec['t_compute_cv']:.2f}), T_u "
                    f"{1e3 * rec['t_update_s']:.2f} ms (cv {rec['t_update_cv']:.2f}), {rec['gradients']} gradients, "
                    f"{rec['updates']} updates")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return records, dict(out, dropped=[pool[i].name for i in dropped], shortened=shortened, probes=probes)
