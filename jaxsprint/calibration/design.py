r"""The calibration's runs, chosen from the figures' sensitivities: a greedy D-optimal design under a time budget.

A runtime run measures the mean learner cycle ``T_c`` and the mean updater cycle ``T_u`` and, where it has
both kinds, the mean empty and the mean applying updater cycle; the host figures enter them through
:func:`jaxsprint.calibration.host.runtime_times`. Fitted in log parameters
to log times with noise ``sigma`` per run, the figures' covariance is ``sigma^2 (J^T J)^{-1}``, ``J`` the
sensitivities ``d log T / d log theta`` of the chosen runs (two or four rows each). :func:`select` picks, from a pool
of candidate configurations (:func:`candidates`: 1-2 hosts, 1-8 learners, sub-batch 8-128, network 0-100 ms,
both updater placements), the runs that most increase ``log det (J^T J + lambda I)`` per second of
measuring (each run's planned length plus what it adds to the runs chosen before it: ``select(extra_s=...)``,
the start-up of processes and compilations no earlier run paid), until the budget is spent: the classic greedy
algorithm for D-optimality with costs, after one run of every regime (:func:`strata`).
:func:`predicted_rel_std_error` says before anything is measured how well each figure will be determined; the
fit afterwards reports the real ones and holds the undetermined (``host_fit.fit_all(fix_undetermined=True)``).
Where the runs take longer than planned, :func:`squeeze` fits the runs left to what is left: :func:`trim` drops
the least informative per second (never one a determined figure needs while another can go), then every run is
shortened before a regime loses its last run.

The sensitivities are taken at the preset's figures, a figure at 0 (a term off) at the fit's second start
(``host_fit.RUNTIME_START``), where the term is on: a design at 0 could not see it.
"""
from __future__ import annotations

import itertools
import math
from typing import Callable, Iterable, Sequence

import numpy as np

from jaxsprint.calibration import host_fit
from jaxsprint.calibration.grids import PLACEMENTS, Entry
from jaxsprint.calibration.host import HostFigures
from jaxsprint.errors import check
from jaxsprint.perf.machines import Machine
from jaxsprint.perf.networks import NetworkCost

__all__ = ["COVER_SHARE", "DETERMINED_RSE", "PACE_PRIOR_S", "candidates", "cover_s", "pace",
           "predicted_rel_std_error", "run_scale", "select", "sensitivities", "squeeze", "strata", "trim"]

# Seconds of runs at the planned pace that :func:`pace` adds to those measured: one series' pace is noisy (a
# calibration's series took 0.87-1.06 of their plan, docs/calibration.md), two series' worth is not.
PACE_PRIOR_S = 60.0
# The share of the budget that covering every regime may take (:func:`run_scale`); the rest goes to the runs
# that pin the figures (docs/calibration.md: a design that spent it all on covering left learner_step_cores
# undetermined).
COVER_SHARE = 0.85
# A figure whose predicted relative standard error (:func:`predicted_rel_std_error`, 5% per run) is at most this
# counts as determined, and an overrun drops no run whose loss would leave it above (:func:`trim`): the fits came
# out 4-14 times the prediction, and held figures whose prediction rose to 0.21-0.26 (docs/calibration.md).
DETERMINED_RSE = 0.2


def candidates(*, hosts: Sequence[int] = (1, 2), learners_per_host: Sequence[int] = (1, 2, 4, 8),
               sub_batches: Sequence[int] = (8, 16, 32, 64, 128), network_ms: Sequence[int] = (0, 5, 20, 100),
               placements: Sequence[str] = PLACEMENTS) -> tuple[Entry, ...]:
    """Every combination of the given values, named ``cal_h2_l4_b32_n20_own``."""
    out = []
    for h, n, b, net, where in itertools.product(hosts, learners_per_host, sub_batches, network_ms, placements):
        out.append(Entry(f"cal_h{h}_l{n}_b{b}_n{net}_{where}", int(h), int(n), int(b), int(net), where))
    return tuple(out)


def _runs(entries: Sequence[Entry]) -> list[host_fit.RuntimeRun]:
    return [host_fit.RuntimeRun(e.learners_per_host, e.hosts, e.sub_batch, e.network_ms / 1e3, 1.0, 1.0,
                                label=e.name, updater_device=e.updater_device or "own") for e in entries]


def sensitivities(machine: Machine, host: HostFigures, network: NetworkCost, entries: Sequence[Entry],
                  fields: Sequence[str], split: Sequence[bool] | None = None) -> np.ndarray:
    """``d log T / d log theta`` of every entry (:func:`jaxsprint.calibration.host_fit.sensitivities`): rows
    ``T_c`` of each entry, then ``T_u`` of each (with ``split``, a flag per entry, then its empty and its
    applying updater cycles: four blocks); a column per field (a figure at 0 taken at
    ``host_fit.RUNTIME_START``, module docstring)."""
    at = {}
    for f in fields:
        v = host_fit.figure(machine, host, f)
        at[f] = v if v > 0 else host_fit.RUNTIME_START.get(f, 1e-3)
    machine, host = host_fit.with_figures(machine, host, **at)
    return host_fit.sensitivities(machine, host, network, _runs(entries), fields, split)


def _rows(jac: np.ndarray, i: int, n: int, blocks: int) -> np.ndarray:
    return jac[[b * n + i for b in range(blocks)]]


def predicted_rel_std_error(jac: np.ndarray, chosen: Sequence[int], sigma: float = 0.05, *,
                            blocks: int = 2) -> np.ndarray:
    """Each figure's relative standard error if the ``chosen`` entries' log times are measured with noise
    ``sigma``: ``expm1`` of ``sigma sqrt(diag (J^T J)^+)`` (inf where the runs do not see a figure).
    ``blocks``: rows per entry in ``jac`` (2, or 4 with the split cycles)."""
    n = jac.shape[0] // blocks
    rows = np.concatenate([_rows(jac, i, n, blocks) for i in chosen]) if len(chosen) else np.zeros((0, jac.shape[1]))
    info = rows.T @ rows
    cov = np.linalg.pinv(info)
    seen = np.linalg.norm(rows, axis=0) > 1e-6 if len(rows) else np.zeros(jac.shape[1], bool)
    sd = sigma * np.sqrt(np.clip(np.diag(cov), 0.0, None))
    return np.where(seen & (sd < 20.0), np.expm1(np.minimum(sd, 20.0)), np.inf)


def strata(entries: Sequence[Entry], long_network_ms: int = 50, large_sub_batch: int = 64) -> list[tuple]:
    """Each entry's regime: ``(hosts, updater placement, network)`` with network ``none`` (the updater cycles
    back to back), ``short`` (below ``long_network_ms``) or ``long`` (the updater mostly sleeps, the learners'
    cycle is their own); without network time, also how many learners a host has: one, several, or (on one
    host) the most of the entries (an updater that never sleeps beside many learners is where the form strays
    most when no run shows it: its applying cycle waits for cores, its empty ones for the interpreter lock),
    and a one-host lone learner's sub-batch, below or from ``large_sub_batch`` (the updater that never sleeps
    stretches its step by a share, ``learner_updater_stretch``, and holds its lock for a fixed wait,
    ``learner_lock_wait_s``: only steps far apart tell the two apart; one run of either placement, as both
    figures hold for both).
    :func:`select` takes one run of every regime first, so that the design covers the space the form is judged
    on even where the form's own sensitivities would not ask for it (a design is only as good as the form it is
    computed from)."""
    most = max((e.learners_per_host for e in entries), default=1)

    def crowd(e):
        if e.learners_per_host == 1:
            return 3 if e.hosts == 1 and e.sub_batch >= large_sub_batch else 0
        return 2 if e.hosts == 1 and e.learners_per_host == most > 2 else 1

    def where(e):
        return "either" if crowd(e) == 3 else e.updater_device

    return [(e.hosts, e.updater_device, "short" if e.network_ms < long_network_ms else "long") if e.network_ms
            else (e.hosts, where(e), "none", crowd(e)) for e in entries]


def select(jac: np.ndarray, cost_s: Sequence[float], budget_s: float, *, ridge: float = 1e-4,
           required: Sequence[int] = (), groups: Sequence | None = None, blocks: int = 2,
           extra_s: Callable[[int, Sequence[int]], float] | None = None,
           candidates: Sequence[int] | None = None, log: Callable[[str], None] | None = None) -> list[int]:
    """The entries (indices into the rows of ``jac``, :func:`sensitivities`) a greedy D-optimal design picks.

    Starting from ``required``, each step adds the affordable entry with the largest gain of
    ``log det(J^T J + ridge I)`` per second of ``cost_s``, until no entry fits in what is left of ``budget_s``
    or none adds information (gain below 1e-6). With ``groups`` (a label per entry, e.g. :func:`strata`), the
    first steps take only entries of a group no chosen entry has, until every group has one: the most informative
    per second among those that leave what covering the other groups costs after them (:func:`cover_s`, start-ups
    included), where the budget allows covering them all. ``blocks``: rows
    per entry in ``jac`` (2, or 4 with the split cycles). ``extra_s(i, chosen)``: what entry ``i`` costs beyond
    ``cost_s[i]`` after the ``chosen`` ones (e.g. starting processes that no chosen entry has started already).
    ``candidates``: the entries it may add (default all), e.g. what is left of a design once some runs are done.

    Raises:
      ConfigError: costs that are not positive and finite, one per entry, or a budget below the required runs.
    """
    n = jac.shape[0] // blocks
    cost = np.asarray(cost_s, np.float64)
    check(cost.shape == (n,) and bool(np.all(np.isfinite(cost) & (cost > 0))), "cost_s", tuple(cost_s),
          f"{n} finite costs > 0 (one per entry)")

    def price(i, before):
        return float(cost[i]) + (float(extra_s(i, before)) if extra_s is not None else 0.0)

    chosen = []
    spent = 0.0
    for i in required:
        spent += price(i, chosen)
        chosen.append(i)
    check(math.isfinite(budget_s) and spent <= budget_s, "budget_s", budget_s,
          f"at least the required runs' {spent:.0f} s")
    info = ridge * np.eye(jac.shape[1])
    for i in chosen:
        rows = _rows(jac, i, n, blocks)
        info = info + rows.T @ rows
    pool = range(n) if candidates is None else candidates
    while True:
        _, base = np.linalg.slogdet(info)
        missing = {groups[i] for i in pool} - {groups[i] for i in chosen} if groups is not None else set()
        fits = {i: c for i in pool if i not in chosen and spent + (c := price(i, chosen)) <= budget_s}
        if missing and not any(groups[i] in missing for i in fits):
            missing = set()  # no regime left uncovered is affordable: the rest by their information alone
        gains = []
        for i, c in fits.items():
            if missing and groups[i] not in missing:
                continue
            rows = _rows(jac, i, n, blocks)
            _, val = np.linalg.slogdet(info + rows.T @ rows)
            gains.append(((val - base) / c, i, c))
        gains.sort(key=lambda t: -t[0])
        best_gain, best, best_cost = gains[0] if gains else (-math.inf, None, 0.0)
        # While regimes are uncovered, the best run is the one that leaves what covering the others costs after it
        # (:func:`cover_s`: their cheapest runs one by one, start-ups included); where none does, the best.
        if missing and cover_s(missing, fits, groups, chosen, price) <= budget_s - spent:
            for gain, i, c in gains:
                if spent + c + cover_s(missing - {groups[i]}, fits, groups, chosen + [i], price) <= budget_s:
                    best, best_gain, best_cost = i, gain, c
                    break
        if best is None or (best_gain < 1e-6 and not missing):
            return chosen
        rows = _rows(jac, best, n, blocks)
        info = info + rows.T @ rows
        chosen.append(best)
        spent += best_cost
        if log:
            log(f"design: + entry {best} ({best_cost:.0f} s, {spent:.0f} s of {budget_s:.0f})")


def cover_s(regimes: set, candidates: Iterable[int], groups: Sequence, chosen: Sequence[int],
            price: Callable[[int, Sequence[int]], float]) -> float:
    """What covering ``regimes`` (labels of ``groups``) with ``candidates`` costs after ``chosen``: greedily, the
    cheapest run (``price(i, before)``, start-ups included) of any regime still uncovered, until none is (a run
    that shares a series with one taken before it pays no start-up); ``inf`` where no candidate covers one."""
    left, taken, total, pool = set(regimes), list(chosen), 0.0, list(candidates)
    while left:
        best = min(((price(i, taken), i) for i in pool if groups[i] in left), default=None)
        if best is None:
            return math.inf
        total += best[0]
        taken.append(best[1])
        left.discard(groups[best[1]])
    return total


def run_scale(cover: Callable[[float], float], budget_s: float, smallest: float, share: float = COVER_SHARE) -> float:
    """The share of each run's planned measuring the design takes: the largest of 1, 0.9, ... down to
    ``smallest`` at which covering every regime (``cover(scale)`` seconds, :func:`cover_s`) takes at most
    ``share`` of ``budget_s``, leaving the rest to the runs that pin the figures; ``smallest`` where none does (a
    slow machine gets shorter runs of every regime, not fewer regimes)."""
    larger = [s for s in (round(1.0 - 0.1 * j, 6) for j in range(10)) if s > smallest + 1e-9]
    return next((s for s in larger if cover(s) <= share * budget_s), float(smallest))


def pace(took_s: float, planned_s: float, prior_s: float = PACE_PRIOR_S) -> float:
    """How much longer than planned the runs take: ``(took + prior) / (planned + prior)``, at least 1 (a fast
    start adds no runs); ``prior_s`` seconds at the planned pace keep one short series from setting it alone."""
    return max(1.0, (float(took_s) + prior_s) / (float(planned_s) + prior_s))


def _spend(runs: Sequence[int], price: Callable[[int, Sequence[int]], float], pace: float) -> float:
    """What ``runs`` cost in their order at ``pace``: each its ``price(i, runs before it)``."""
    return pace * sum(float(price(i, list(runs[:m]))) for m, i in enumerate(runs))


def trim(jac: np.ndarray, ahead: Sequence[int], price: Callable[[int, Sequence[int]], float], budget_s: float, *,
         scale: float = 1.0, required: Sequence[int] = (), groups: Sequence | None = None, lasts: bool = True,
         determined: float | None = None, blocks: int = 2, ridge: float = 1e-4) -> list[int]:
    """The runs of ``ahead`` kept when they cost ``scale`` times their ``price(i, kept before it)`` and must fit
    in ``budget_s``: runs are dropped one at a time, each time the one whose loss of ``log det(J^T J)`` (with
    the ``required`` runs, those done) per second saved is least, until the rest fit, so that an overrun
    drops no more than it needs. A run that is its regime's last (``groups``) or, with ``determined``, the one
    that keeps some figure's predicted relative standard error at most ``determined`` (:data:`DETERMINED_RSE`)
    goes only when every run left is one, and with ``lasts=False`` never (the runs kept may then not fit).
    ``blocks`` and ``ridge`` as in :func:`select`. Returns the kept runs in ``ahead``'s order."""
    n = jac.shape[0] // blocks

    def logdet(runs):
        rows = np.concatenate([_rows(jac, i, n, blocks) for i in runs]) if len(runs) else np.zeros((0, jac.shape[1]))
        return np.linalg.slogdet(ridge * np.eye(jac.shape[1]) + rows.T @ rows)[1]

    def rse(runs):
        return predicted_rel_std_error(jac, list(required) + runs, blocks=blocks)

    def pins(i, kept, now):  # without run i, a figure determined ``now`` would not be
        return determined is not None and bool(np.any((now <= determined) & (
            rse([j for j in kept if j != i]) > determined)))

    kept = list(ahead)
    while kept and _spend(kept, price, scale) > budget_s:
        now = rse(kept) if determined is not None else None
        covered = [i for i in kept if (groups is None or sum(groups[j] == groups[i]
                                                             for j in list(required) + kept) > 1)
                   and not pins(i, kept, now)]
        base, cost = logdet(list(required) + kept), _spend(kept, price, scale)
        best, best_loss = None, math.inf
        for i in covered or (kept if lasts else []):
            rest = [j for j in kept if j != i]
            loss = (base - logdet(list(required) + rest)) / max(cost - _spend(rest, price, scale), 1e-9)
            if loss < best_loss:
                best, best_loss = i, loss
        if best is None:  # every run left is its regime's last or pins a figure, and those stay
            return kept
        kept.remove(best)
    return kept


def squeeze(jac: np.ndarray, ahead: Sequence[int], price: Callable[[int, Sequence[int], float], float],
            budget_s: float, *, share: float, smallest: float, pace: float = 1.0, required: Sequence[int] = (),
            groups: Sequence | None = None, determined: float | None = None, blocks: int = 2,
            ridge: float = 1e-4) -> tuple[list[int], float]:
    """What an overrun keeps of the runs ``ahead``, and the share of its planned measuring each run then gets:
    ``price(i, before, s)`` seconds at the plan for share ``s``, ``pace`` times that as measured, within
    ``budget_s``. First the runs that are not their regime's last go (:func:`trim`), then every run left is
    shortened, to the largest of ``share``, ``share - 0.05``, ... down to ``smallest`` at which they fit (a
    shorter run of a regime tells more than none); only where none does do regimes' last runs go, at
    ``smallest``; a run that keeps a figure determined (``determined``) counts as a last. ``required``,
    ``groups``, ``determined``, ``blocks``, ``ridge`` as in :func:`trim`. Returns (kept, share)."""
    def at(s):
        return lambda i, before: price(i, before, s)

    opts = dict(required=required, groups=groups, determined=determined, blocks=blocks, ridge=ridge)
    kept = trim(jac, ahead, at(share), budget_s, scale=pace, lasts=False, **opts)
    smallest = min(float(smallest), float(share))
    shares = [float(share)] + [s for s in (round(share - 0.05 * j, 6) for j in range(1, 20)) if s > smallest + 1e-9]
    for s in shares + [smallest]:
        if _spend(kept, at(s), pace) <= budget_s:
            return kept, s
    return trim(jac, kept, at(smallest), budget_s, scale=pace, **opts), smallest
