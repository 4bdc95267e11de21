r"""The SPRINT runtime's event log (``events.npz``): format, consistency checks, measured statistics.

numpy only. The runtime (:mod:`jaxsprint.runtime`) writes one row per gradient and one row per update
(docs/sprint-runtime.md, "The event log"):

* gradients, in order of application, then the ones still in flight at the stop:
  ``grad_learner`` (global learner index), ``grad_host``, ``grad_read_version`` (version of the weights
  the learner read), ``grad_applied_version`` (version published by the update that applied it, -1 if
  none did), ``grad_t_start`` (the read, start of the learner's cycle), ``grad_t_end`` (the gradient
  computed, just before it is added to the node buffer);
* updates (one per published version, host 0's clock): ``update_version`` (1, 2, ...),
  ``update_count`` (gradients in it, all hosts), ``update_t_start`` (buffer swap), ``update_t_end``
  (publish);
* scalars: ``warmup_until_s``, ``t_stop_s``, ``learners_per_host``, ``num_hosts``, ``sub_batch``,
  ``dataset_size``, ``network_time_s``, ``lockstep``.

Times are seconds since the run's common start. Staleness of a gradient: ``S = applied - 1 - read``
(0 for synchronous SGD); mini-batch of an update: ``B = sub_batch * count``.

:func:`statistics` measures what the SPRINT model (:mod:`jaxsprint.perf.sprint`) predicts, leaving out
the start-up transient (every learner starts on version 0, so the first cycles gather a burst of
staleness-0 gradients): gradients whose cycle starts before ``warmup_until_s`` and updates whose swap
happens before it are not counted.

:func:`simulate_log` writes the log the runtime would write if it followed the model's protocol exactly
(gamma compute and updater times): the reference that checks the statistics against the model.
"""
from __future__ import annotations

import math
import os
import tempfile
from typing import Any

import numpy as np

from jaxsprint.errors import DataError

__all__ = ["GRADIENT_FIELDS", "SCALAR_FIELDS", "UPDATE_FIELDS", "check", "count_coupling", "load", "save",
           "simulate_log", "staleness", "statistics", "update_composition"]

GRADIENT_FIELDS = {"grad_learner": np.int32, "grad_host": np.int32, "grad_read_version": np.int64,
                   "grad_applied_version": np.int64, "grad_t_start": np.float64, "grad_t_end": np.float64}
UPDATE_FIELDS = {"update_version": np.int64, "update_count": np.int64, "update_t_start": np.float64,
                 "update_t_end": np.float64}
SCALAR_FIELDS = {"warmup_until_s": np.float64, "t_stop_s": np.float64, "learners_per_host": np.int64,
                 "num_hosts": np.int64, "sub_batch": np.int64, "dataset_size": np.int64,
                 "network_time_s": np.float64, "lockstep": np.int64}

# Clock readings of two threads around one lock: allow this much disorder (seconds).
_TIME_TOLERANCE_S = 1e-6


def _fail(field: str, value: Any, allowed: str) -> None:
    raise DataError(f"events.{field}", value, allowed)


def _coerce(ev: dict[str, Any]) -> dict[str, np.ndarray]:
    """The log's arrays with the contract's dtypes; missing or misshapen fields are refused."""
    out: dict[str, np.ndarray] = {}
    for group, ndim in ((GRADIENT_FIELDS, 1), (UPDATE_FIELDS, 1), (SCALAR_FIELDS, 0)):
        for name, dtype in group.items():
            if name not in ev:
                _fail(name, None, "missing from the event log")
            a = np.asarray(ev[name])
            if a.ndim != ndim:
                _fail(name, a.shape, f"a {ndim}-d array")
            if np.issubdtype(dtype, np.integer):
                if a.size and not np.all(np.isfinite(a.astype(np.float64))):
                    _fail(name, "nan/inf", "integers")
                if a.size and not np.array_equal(a.astype(np.float64), np.round(a.astype(np.float64))):
                    _fail(name, a.dtype.name, "integers")
            out[name] = a.astype(dtype)
    for group in (GRADIENT_FIELDS, UPDATE_FIELDS):
        sizes = {name: out[name].size for name in group}
        if len(set(sizes.values())) > 1:
            _fail(next(iter(group)), sizes, "the same length for every field of the group")
    return out


def staleness(ev: dict[str, np.ndarray]) -> np.ndarray:
    """``applied - 1 - read`` per gradient (meaningless, -2 - read, for the in-flight rows)."""
    return ev["grad_applied_version"] - 1 - ev["grad_read_version"]


def effective_staleness(ev: dict[str, np.ndarray]) -> np.ndarray:
    """Per gradient, the NON-EMPTY updates published between its read and its application.

    An empty cycle publishes a version but leaves the weights as they were, so a gradient read at version
    ``v`` and applied by version ``u`` was computed at weights ``u - 1 - v`` versions old but only this many
    weight changes old. It is the delay the delayed-gradient emulator counts: its ring buffer stands still on
    an empty update (``jaxsprint.plan.emulator``, ``jaxsprint.emulation.adapter``), so it is what the emulator
    must draw to stand in for the run. Meaningless for the in-flight rows.
    """
    nonempty = np.concatenate([[0], np.cumsum(np.asarray(ev["update_count"]) > 0)])  # [x]: in versions 1..x
    last = nonempty.size - 1
    applied = np.clip(np.asarray(ev["grad_applied_version"]) - 1, 0, last)
    read = np.clip(np.asarray(ev["grad_read_version"]), 0, last)
    return nonempty[applied] - nonempty[read]


def update_composition(ev: dict[str, np.ndarray]) -> dict[str, float]:
    """How each update's gradients are composed, where the delayed-gradient emulator draws one staleness per
    update and its mini-batch independently of it (docs/planning.md).

    Over the whole log (every applied gradient).

    Returns:
      ``mixed_share``: of the updates with two or more gradients, the share whose gradients differ in
      (effective) staleness; ``count_staleness_corr``: the correlation over non-empty updates between an
      update's gradient count and its gradients' mean effective staleness (0 for independent draws). NaN
      where undefined.
    """
    ok = np.asarray(ev["grad_applied_version"]) > 0
    s = effective_staleness(ev)[ok].astype(np.float64)
    _, inv = np.unique(np.asarray(ev["grad_applied_version"])[ok], return_inverse=True)
    if s.size == 0:
        return {"mixed_share": math.nan, "count_staleness_corr": math.nan}
    count = np.bincount(inv).astype(np.float64)
    mean = np.bincount(inv, s) / count
    spread = np.bincount(inv, s * s) / count - mean ** 2
    multi = count > 1
    mixed = float(np.mean(spread[multi] > 1e-9)) if multi.any() else math.nan
    corr = (float(np.corrcoef(count, mean)[0, 1]) if count.size > 2 and np.std(count) > 0 and np.std(mean) > 0
            else math.nan)
    return {"mixed_share": mixed, "count_staleness_corr": corr}


def check(ev: dict[str, Any]) -> dict[str, np.ndarray]:
    """Checks that a log is complete and consistent; returns it with the contract's dtypes.

    Checked: every field present with the right rank, equal lengths per group, finite times with
    ``t_start <= t_end``; versions ``1, 2, ...`` in order, swaps in order and each update's swap after
    the previous publish (the updater runs its cycles one after the other); every gradient applied at
    most once, by a published version, with staleness ``>= 0``; ``update_count`` equal to the
    gradients applied by that version (at least that many when the log holds only some hosts'
    gradients); one learner's cycles one after the other, reading non-decreasing versions.

    Raises:
      DataError: naming the first field that is wrong (``events.<field>``).
    """
    ev = _coerce(ev)
    for name in ("grad_t_start", "grad_t_end", "update_t_start", "update_t_end", "warmup_until_s",
                 "t_stop_s", "network_time_s"):
        if not np.all(np.isfinite(ev[name])):
            _fail(name, "nan/inf", "finite times")
    for group in ("grad", "update"):
        bad = np.nonzero(ev[f"{group}_t_end"] < ev[f"{group}_t_start"] - _TIME_TOLERANCE_S)[0]
        if bad.size:
            _fail(f"{group}_t_end", float(ev[f"{group}_t_end"][bad[0]]),
                  f"not before its start {float(ev[f'{group}_t_start'][bad[0]])} (row {bad[0]})")
    for name in ("learners_per_host", "num_hosts", "sub_batch", "dataset_size"):
        if int(ev[name]) < 1:
            _fail(name, int(ev[name]), "an integer >= 1")
    n_updates = ev["update_version"].size
    if not np.array_equal(ev["update_version"], np.arange(1, n_updates + 1)):
        _fail("update_version", ev["update_version"][:8].tolist(), "1, 2, 3, ... (one row per published version)")
    gaps = ev["update_t_start"][1:] - ev["update_t_end"][:-1]
    if gaps.size and gaps.min() < -_TIME_TOLERANCE_S:
        k = int(np.argmin(gaps)) + 1
        _fail("update_t_start", float(ev["update_t_start"][k]),
              f"after the previous update's publish {float(ev['update_t_end'][k - 1])} (version {k + 1})")
    if np.any(ev["update_count"] < 0):
        _fail("update_count", int(ev["update_count"].min()), "counts >= 0")
    lph, hosts = int(ev["learners_per_host"]), int(ev["num_hosts"])
    learner, host = ev["grad_learner"], ev["grad_host"]
    if learner.size and (learner.min() < 0 or learner.max() >= lph * hosts):
        _fail("grad_learner", int(learner.max() if learner.max() >= lph * hosts else learner.min()),
              f"global learner indices 0..{lph * hosts - 1}")
    if not np.array_equal(host, learner // lph):
        _fail("grad_host", host[np.nonzero(host != learner // lph)[0][0]], "grad_learner // learners_per_host")
    read, applied = ev["grad_read_version"], ev["grad_applied_version"]
    if read.size and (read.min() < 0 or read.max() > n_updates):
        _fail("grad_read_version", int(read.min() if read.min() < 0 else read.max()),
              f"a published version 0..{n_updates}")
    ok_applied = (applied == -1) | ((applied >= 1) & (applied <= n_updates))
    if not np.all(ok_applied):
        _fail("grad_applied_version", int(applied[~ok_applied][0]), f"-1 (in flight) or a version 1..{n_updates}")
    done = applied >= 1
    s = staleness(ev)[done]
    if s.size and s.min() < 0:
        row = np.nonzero(done)[0][np.argmin(s)]
        _fail("grad_applied_version", int(applied[row]),
              f"after the version read, {int(read[row])} (staleness {int(s.min())} < 0, row {row})")
    applied_per_version = np.bincount(applied[done] - 1, minlength=n_updates)[:n_updates]
    complete = hosts == 1 or np.unique(host).size == hosts
    wrong = applied_per_version != ev["update_count"] if complete else applied_per_version > ev["update_count"]
    if np.any(wrong):
        u = int(np.nonzero(wrong)[0][0])
        _fail("update_count", int(ev["update_count"][u]),
              f"the {int(applied_per_version[u])} gradients applied by version {u + 1} (each gradient is "
              f"applied once{'' if complete else '; this log holds some hosts only'})")
    order = np.lexsort((ev["grad_t_start"], learner))
    same = learner[order][1:] == learner[order][:-1]
    overlap = same & (ev["grad_t_start"][order][1:] < ev["grad_t_end"][order][:-1] - _TIME_TOLERANCE_S)
    if np.any(overlap):
        row = order[1:][np.nonzero(overlap)[0][0]]
        _fail("grad_t_start", float(ev["grad_t_start"][row]),
              f"after learner {int(learner[row])}'s previous gradient ended (row {row}): one cycle at a time")
    back = same & (read[order][1:] < read[order][:-1])
    if np.any(back):
        row = order[1:][np.nonzero(back)[0][0]]
        _fail("grad_read_version", int(read[row]), f"not older than learner {int(learner[row])}'s previous read")
    return ev


def save(path: str, ev: dict[str, Any]) -> None:
    """Checks a log (:func:`check`) and writes it to ``path`` (a compressed ``.npz``) atomically."""
    ev = check(ev)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(suffix=".npz", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez_compressed(fh, **ev)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load(path: str) -> dict[str, np.ndarray]:
    """Reads and checks (:func:`check`) a log written by the runtime or :func:`save`.

    Raises:
      DataError: a missing or unreadable file, or an inconsistent log.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            ev = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise DataError("events", path, f"an events.npz written by the SPRINT runtime ({e})") from None
    return check(ev)


def _mean_cv(x: np.ndarray) -> tuple[float, float]:
    if x.size == 0:
        return math.nan, math.nan
    m = float(np.mean(x))
    return m, (float(np.std(x)) / m if m > 0 else math.nan)


def _pmf(values: np.ndarray, scale: int = 1) -> dict[int, float]:
    if values.size == 0:
        return {}
    v, c = np.unique(values, return_counts=True)
    return {int(scale * a): float(b) / values.size for a, b in zip(v, c)}


def _cycles(ev: dict[str, np.ndarray], warm: float) -> np.ndarray:
    """Every learner's cycles that start after ``warm``: from a start to the same learner's next start."""
    order = np.lexsort((ev["grad_t_start"], ev["grad_learner"]))
    who, start = ev["grad_learner"][order], ev["grad_t_start"][order]
    full = (who[1:] == who[:-1]) & (start[:-1] >= warm)
    return (start[1:] - start[:-1])[full]


def statistics(ev: dict[str, Any]) -> dict[str, Any]:
    r"""Measured statistics of a log, without the warm-up (see the module docstring).

    * ``t_compute_s``, ``t_compute_cv``: mean and coefficient of variation (population standard
      deviation / mean) of the learners' cycles, each from a gradient's start to the same learner's next
      start (the model's ``T_c``: the hand-off to the buffer and any wait for the interpreter lock
      included); in a lockstep log, where a learner waits for the next version between its cycles,
      ``t_end - t_start`` of the applied gradients;
    * ``t_update_s``, ``t_update_cv``: the same of the updater's cycle, the gap between consecutive swaps
      (both swaps after the warm-up); ``t_update_p01_s``: the 1st percentile of those cycles (the fixed
      part of a cycle, :func:`jaxsprint.calibration.compare.predict_from_timings`); ``t_update_empty_s``,
      ``t_update_applying_s``: the mean of those cycles that gathered no gradient and of those that applied
      one (NaN where there is none), ``empty_cycles``, ``applying_cycles`` their numbers (the calibration fits
      both kinds, :mod:`jaxsprint.calibration.host`);
    * ``images_per_s``: ``sub_batch`` times the gradients that ended in ``[warmup_until_s, t_stop_s]``,
      over that window's length (a rate of completions, unbiased for stationary learners, whether or
      not a gradient's start fell in the warm-up); ``epoch_time_s = dataset_size / images_per_s``;
    * ``mean_count``, ``std_count``, ``count_pmf`` (gradients per update) and ``mean_minibatch``,
      ``std_minibatch``, ``minibatch_pmf`` (images, ``sub_batch * count``), over the updates;
    * ``mean_staleness``, ``std_staleness``, ``staleness_pmf`` over the applied gradients;
    * ``mean_effective_staleness``, ``effective_staleness_pmf``: the same of :func:`effective_staleness` (the
      delay in non-empty updates, what the emulator draws);
    * ``gradients``, ``updates``: how many of each the statistics use; ``gradients_total``,
      ``updates_total``, ``in_flight`` (gradients never applied) over the whole run; and the
      configuration of the run (``learners``, ``learners_per_host``, ``num_hosts``, ``sub_batch``,
      ``dataset_size``, ``network_time_s``, ``lockstep``, ``warmup_until_s``, ``t_stop_s``).

    pmfs are dicts ``value -> probability``. Statistics of an empty selection are NaN (empty pmf).

    Args:
      ev: An event log (checked with :func:`check`).

    Returns:
      The dict above (Python scalars).
    """
    ev = check(ev)
    warm, stop = float(ev["warmup_until_s"]), float(ev["t_stop_s"])
    b = int(ev["sub_batch"])
    applied = ev["grad_applied_version"] >= 1
    grads = applied & (ev["grad_t_start"] >= warm)
    cycle = (ev["grad_t_end"] - ev["grad_t_start"])[grads] if int(ev["lockstep"]) else _cycles(ev, warm)
    stale = staleness(ev)[grads]
    eff = effective_staleness(ev)[grads]
    ups = ev["update_t_start"] >= warm
    counts = ev["update_count"][ups]
    tc, tc_cv = _mean_cv(cycle)
    gaps = np.diff(ev["update_t_start"][ups])
    tu, tu_cv = _mean_cv(gaps)
    tu_p01 = float(np.percentile(gaps, 1)) if gaps.size else math.nan
    empty = counts[:-1] == 0  # the kind of the cycle each gap measures
    tu_empty = float(np.mean(gaps[empty])) if np.any(empty) else math.nan
    tu_applying = float(np.mean(gaps[~empty])) if np.any(~empty) else math.nan
    window = stop - warm
    ended = np.count_nonzero((ev["grad_t_end"] >= warm) & (ev["grad_t_end"] <= stop))
    images_per_s = float(b * ended / window) if window > 0 else math.nan
    mean_count = float(np.mean(counts)) if counts.size else math.nan
    std_count = float(np.std(counts)) if counts.size else math.nan
    lph, hosts = int(ev["learners_per_host"]), int(ev["num_hosts"])
    return dict(
        t_compute_s=tc, t_compute_cv=tc_cv, t_update_s=tu, t_update_cv=tu_cv, t_update_p01_s=tu_p01,
        t_update_empty_s=tu_empty, t_update_applying_s=tu_applying, empty_cycles=int(np.count_nonzero(empty)),
        applying_cycles=int(np.count_nonzero(~empty)),
        images_per_s=images_per_s,
        epoch_time_s=int(ev["dataset_size"]) / images_per_s if images_per_s > 0 else math.nan,
        mean_count=mean_count, std_count=std_count, count_pmf=_pmf(counts),
        mean_minibatch=b * mean_count, std_minibatch=b * std_count, minibatch_pmf=_pmf(counts, b),
        mean_staleness=float(np.mean(stale)) if stale.size else math.nan,
        std_staleness=float(np.std(stale)) if stale.size else math.nan,
        staleness_pmf=_pmf(stale),
        mean_effective_staleness=float(np.mean(eff)) if eff.size else math.nan,
        effective_staleness_pmf=_pmf(eff),
        gradients=int(np.count_nonzero(grads)), updates=int(np.count_nonzero(ups)),
        gradients_total=int(ev["grad_learner"].size), updates_total=int(ev["update_version"].size),
        in_flight=int(np.count_nonzero(~applied)),
        learners=lph * hosts, learners_per_host=lph, num_hosts=hosts, sub_batch=b,
        dataset_size=int(ev["dataset_size"]), network_time_s=float(ev["network_time_s"]),
        lockstep=bool(ev["lockstep"]), warmup_until_s=warm, t_stop_s=stop,
    )


def count_coupling(ev: dict[str, Any], *, windows: int = 20000, seed: int = 0) -> dict[str, float]:
    r"""How the gradients per update depend on the updater's own cycles (the model assumes they do not).

    The model counts the arrivals of ``N`` independent stationary learners in a window of the updater's
    cycle length: the count grows with the cycle at the learners' rate, and a window placed at the
    updater's swaps holds as many arrivals as a window of the same length placed anywhere. Two
    measurements of a log test that, after the warm-up:

    * ``slope_ratio``: the least-squares slope of an update's count against its cycle's length (swap to
      swap, host 0's clock), over the measured arrival rate (gradients that ended per second). 1 when
      the learners progress through the whole cycle; 0 when the cycle's jitter is time in which no
      learner progresses either (a stall of the whole process).
    * ``var_cycles`` / ``var_random``: the variance of the counts over the updater's cycles, and of the
      arrivals in ``windows`` random windows (lengths drawn from the cycles, starts uniform in the
      measured span); ``variance_ratio`` their ratio, 1 for independent arrivals, below 1 when the
      arrivals keep step with the swaps.
    * ``compute_lag1``: the lag-1 autocorrelation of each learner's compute times (its gradients in order,
      after the warm-up), averaged over the learners with at least 3. 0 for the model's renewal learners;
      above 0 when a learner's slowness persists from one gradient to the next, which widens the counts
      beyond the model's (docs/calibration.md).

    Args:
      ev: An event log (checked with :func:`check`).
      windows: Random windows.
      seed: Seed of their draws.

    Returns:
      ``slope_ratio``, ``var_cycles``, ``var_random``, ``variance_ratio``, ``compute_lag1`` (NaN with fewer
      than 3 updates after the warm-up).
    """
    ev = check(ev)
    warm, stop = float(ev["warmup_until_s"]), float(ev["t_stop_s"])
    ups = ev["update_t_start"] >= warm
    swaps, counts = ev["update_t_start"][ups], ev["update_count"][ups].astype(np.float64)
    nan = dict(slope_ratio=math.nan, var_cycles=math.nan, var_random=math.nan, variance_ratio=math.nan,
               compute_lag1=math.nan)
    if swaps.size < 3 or stop <= warm:
        return nan
    gaps, c = np.diff(swaps), counts[1:]  # update k gathers what ended between swaps k-1 and k
    ends = np.sort(ev["grad_t_end"][(ev["grad_t_end"] >= warm) & (ev["grad_t_end"] <= stop)])
    rate = ends.size / (stop - warm)
    slope = float(np.polyfit(gaps, c, 1)[0]) if np.ptp(gaps) > 0 else math.nan
    rng = np.random.default_rng(seed)
    lengths = rng.choice(gaps, int(windows))
    span = stop - warm - lengths.max()
    if span <= 0:
        return nan
    t0 = warm + rng.random(int(windows)) * span
    arrivals = np.searchsorted(ends, t0 + lengths) - np.searchsorted(ends, t0)
    var_c, var_r = float(np.var(c)), float(np.var(arrivals))
    return dict(slope_ratio=slope / rate if rate > 0 else math.nan, var_cycles=var_c, var_random=var_r,
                variance_ratio=var_c / var_r if var_r > 0 else math.nan, compute_lag1=_compute_lag1(ev, warm))


def _compute_lag1(ev: dict[str, np.ndarray], warm: float) -> float:
    """Mean over learners of the lag-1 autocorrelation of their compute times after ``warm``."""
    keep = ev["grad_t_start"] >= warm
    start, dur = ev["grad_t_start"][keep], (ev["grad_t_end"] - ev["grad_t_start"])[keep]
    who = ev["grad_host"][keep].astype(np.int64) * (int(ev["learners_per_host"]) + 1) + ev["grad_learner"][keep]
    acs = []
    for w in np.unique(who):
        x = dur[who == w][np.argsort(start[who == w], kind="stable")]
        if x.size >= 3 and np.std(x[:-1]) > 0 and np.std(x[1:]) > 0:
            acs.append(float(np.corrcoef(x[:-1], x[1:])[0, 1]))
    return float(np.mean(acs)) if acs else math.nan


def _gamma(rng: np.random.Generator, mean: float, cv: float, size: int, shift: float = 0.0) -> np.ndarray:
    """``shift + G``, ``G`` gamma, of the given mean and cv (``shift = 0``: a gamma, draw for draw)."""
    if cv == 0:
        return np.full(size, mean)
    tail = (mean - shift) / mean
    shape = tail * tail / cv ** 2
    return shift + rng.gamma(shape, (mean - shift) / shape, size=size)


def simulate_log(learners_per_host: int, t_compute_s: float, t_update_s: float, cv: float = 0.0,
                 update_cv: float = 0.0, *, duration_s: float, warmup_s: float = 0.0, num_hosts: int = 1,
                 sub_batch: int = 1, dataset_size: int = 1000, network_time_s: float = 0.0,
                 seed: int = 0, update_shift_s: float = 0.0) -> dict[str, np.ndarray]:
    """The event log of the model's protocol (docs/sprint-model.md), as the runtime writes it.

    Learner ``i`` starts at a uniform random phase in ``[0, T_c)`` on version 0 (the phases of
    learners that start together get mixed by their jitter; the model assumes independent uniform
    phases) and computes gradients of gamma times (mean ``T_c``, cv ``cv``) back to back. The updater's
    cycles are gamma (mean ``T_u``, cv ``update_cv``) and back to back from time 0: update ``u`` swaps
    the buffer at the end of cycle ``u - 1`` and publishes version ``u`` at the end of cycle ``u``. A
    gradient ending at ``t`` goes into the first swap after ``t``; a learner reads the newest version
    published by its start. Gradients that started before ``duration_s`` but were not applied by an
    update published by then are in flight.

    Args:
      learners_per_host: Learners per host (``N = learners_per_host * num_hosts``, all equal here).
      t_compute_s: ``T_c``.
      t_update_s: ``T_u``.
      cv: Coefficient of variation of the compute time.
      update_cv: Coefficient of variation of the updater's cycle.
      duration_s: Stop time ``t_stop_s``.
      warmup_s: ``warmup_until_s``.
      num_hosts: Hosts (learners are split evenly; the clock is shared).
      sub_batch: Images per gradient.
      dataset_size: Images per epoch.
      network_time_s: Recorded only.
      seed: Seed of numpy's generator.
      update_shift_s: Fixed part ``s`` of the updater's cycle, in ``[0, T_u)``: cycles ``s + G`` with
        ``G`` gamma of mean ``T_u - s`` (same mean and cv ``update_cv``; the model's ``update_shift_s``).

    Returns:
      An event log (checked), ``grad_*`` rows ordered by applied version, in-flight rows last.
    """
    rng = np.random.default_rng(seed)
    n = int(learners_per_host) * int(num_hosts)
    m = int(duration_s / t_update_s + 6.0 * update_cv * math.sqrt(duration_s / t_update_s) + 3)
    if not (math.isfinite(update_shift_s) and 0 <= update_shift_s < t_update_s):
        raise ValueError(f"update_shift_s={update_shift_s!r}: must be in [0, t_update_s={t_update_s!r})")
    cycles = _gamma(rng, t_update_s, update_cv, m, update_shift_s)
    while cycles.sum() < duration_s:
        cycles = np.concatenate([cycles, _gamma(rng, t_update_s, update_cv, m, update_shift_s)])
    bounds = np.concatenate([[0.0], np.cumsum(cycles)])
    # Update u (u = 1, 2, ...) swaps at bounds[u - 1] and publishes at bounds[u].
    n_updates = int(np.searchsorted(bounds, duration_s, side="right")) - 1
    swap, publish = bounds[:n_updates], bounds[1:n_updates + 1]
    rows = []
    for i in range(n):
        t = rng.random() * t_compute_s
        per = int(duration_s / t_compute_s + 6.0 * cv * math.sqrt(duration_s / t_compute_s + 1) + 3)
        starts, ends = [np.zeros(0)], [np.zeros(0)]
        while t < duration_s:
            d = _gamma(rng, t_compute_s, cv, per)
            e = t + np.cumsum(d)
            s = np.concatenate([[t], e[:-1]])
            keep = s < duration_s
            starts.append(s[keep])
            ends.append(e[keep])
            t = e[-1]
        s, e = np.concatenate(starts), np.concatenate(ends)
        read = np.searchsorted(publish, s, side="right")          # versions published by the start
        applied = np.searchsorted(swap, e, side="left") + 1       # first swap at or after the end
        applied = np.where(applied <= n_updates, applied, -1)
        rows.append((np.full(s.size, i), s, e, read, applied))
    learner, t_start, t_end, read, applied = (np.concatenate(c) for c in zip(*rows))
    key = np.where(applied > 0, applied, np.iinfo(np.int64).max)
    order = np.lexsort((t_end, key))
    count = np.bincount(applied[applied > 0] - 1, minlength=n_updates)[:n_updates]
    ev = dict(
        grad_learner=learner[order], grad_host=learner[order] // learners_per_host,
        grad_read_version=read[order], grad_applied_version=applied[order],
        grad_t_start=t_start[order], grad_t_end=t_end[order],
        update_version=np.arange(1, n_updates + 1), update_count=count,
        update_t_start=swap, update_t_end=publish,
        warmup_until_s=np.float64(warmup_s), t_stop_s=np.float64(duration_s),
        learners_per_host=np.int64(learners_per_host), num_hosts=np.int64(num_hosts),
        sub_batch=np.int64(sub_batch), dataset_size=np.int64(dataset_size),
        network_time_s=np.float64(network_time_s), lockstep=np.int64(0),
    )
    return check(ev)
