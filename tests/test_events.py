"""Tests of jaxsprint.runtime.events: checks, statistics on a hand-made log, a simulated log against the model."""
import math

import numpy as np
import pytest

from jaxsprint.errors import DataError
from jaxsprint.perf import sprint
from jaxsprint.runtime import events


def hand_log():
    """2 learners, 1 host, sub-batch 4, warm-up 1 s, stop at 10 s (hand-computed in the tests below).

    Updates (swap, publish): v1 (0, 0.5), v2 (0.5, 2), v3 (2, 4), v4 (4, 7), v5 (7, 9).
    Learner 0: [0, 1.5] read 0 -> v3; [1.5, 3.5] read 1 -> v4; [3.5, 6.5] read 2 -> v5; [6.5, 9.5] read 3,
    in flight. Learner 1: [0, 0.8] read 0 -> v3; [1.2, 1.8] read 1 -> v3; [1.8, 5] read 1 -> v5;
    [5, 8] read 3, in flight (in the buffer, never swapped).
    """
    g = [  # learner, read, applied, start, end
        (0, 0, 3, 0.0, 1.5), (1, 0, 3, 0.0, 0.8), (1, 1, 3, 1.2, 1.8), (0, 1, 4, 1.5, 3.5),
        (0, 2, 5, 3.5, 6.5), (1, 1, 5, 1.8, 5.0), (0, 3, -1, 6.5, 9.5), (1, 3, -1, 5.0, 8.0)]
    learner, read, applied, t0, t1 = map(np.asarray, zip(*g))
    return dict(
        grad_learner=learner.astype(np.int32), grad_host=np.zeros(8, np.int32),
        grad_read_version=read.astype(np.int64), grad_applied_version=applied.astype(np.int64),
        grad_t_start=t0.astype(np.float64), grad_t_end=t1.astype(np.float64),
        update_version=np.arange(1, 6), update_count=np.asarray([0, 0, 3, 1, 2]),
        update_t_start=np.asarray([0.0, 0.5, 2.0, 4.0, 7.0]), update_t_end=np.asarray([0.5, 2.0, 4.0, 7.0, 9.0]),
        warmup_until_s=np.float64(1.0), t_stop_s=np.float64(10.0), learners_per_host=np.int64(2),
        num_hosts=np.int64(1), sub_batch=np.int64(4), dataset_size=np.int64(100), network_time_s=np.float64(0.0),
        lockstep=np.int64(0))


def test_update_composition_of_a_hand_made_log():
    # Effective staleness (v1, v2 are empty): v3 gathers 0, 0, 0; v4 1; v5 2, 2. No update mixes staleness;
    # counts 3, 1, 2 against mean staleness 0, 1, 2: correlation -0.5.
    c = events.update_composition(hand_log())
    assert c["mixed_share"] == 0.0 and c["count_staleness_corr"] == pytest.approx(-0.5)
    ev = hand_log()
    ev["grad_read_version"][5] = 3  # had learner 1's gradient into v5 read v3: staleness 1 beside learner 0's 2
    assert events.update_composition(ev)["mixed_share"] == pytest.approx(0.5)  # v5 of the two (v3, v5)
    many = events.update_composition(events.simulate_log(8, 0.02, 0.005, 0.3, 0.0, duration_s=20.0, seed=1))
    assert 0.0 <= many["mixed_share"] <= 1.0 and -1.0 <= many["count_staleness_corr"] <= 1.0


def test_statistics_of_a_hand_made_log():
    s = events.statistics(hand_log())
    # After the warm-up: updates v3, v4, v5 (counts 3, 1, 2; swaps 2, 4, 7 s); gradients started at 1.2, 1.5,
    # 1.8, 3.5 s (cycles 0.6, 2.0, 3.2, 3.0 s; staleness 1, 2, 3, 2).
    assert (s["updates"], s["gradients"], s["in_flight"]) == (3, 4, 2)
    assert (s["updates_total"], s["gradients_total"]) == (5, 8)
    assert s["mean_count"] == pytest.approx(2.0)
    assert s["count_pmf"] == pytest.approx({1: 1 / 3, 2: 1 / 3, 3: 1 / 3})
    assert s["minibatch_pmf"] == pytest.approx({4: 1 / 3, 8: 1 / 3, 12: 1 / 3})
    assert s["mean_minibatch"] == pytest.approx(8.0)
    assert s["std_minibatch"] == pytest.approx(4 * math.sqrt(2 / 3))
    assert s["t_update_s"] == pytest.approx(2.5) and s["t_update_cv"] == pytest.approx(0.2)
    assert s["t_compute_s"] == pytest.approx(2.2)
    assert s["t_compute_cv"] == pytest.approx(math.sqrt(1.06) / 2.2)
    assert s["mean_staleness"] == pytest.approx(2.0)
    assert s["staleness_pmf"] == pytest.approx({1: 0.25, 2: 0.5, 3: 0.25})
    # In non-empty updates (v1 and v2 are empty): versions 2 / 2-3 / 3-4 / 2-4 lie between the reads and
    # the applications of those four gradients, holding 0, 1, 2 and 2 non-empty updates.
    assert s["effective_staleness_pmf"] == pytest.approx({0: 0.25, 1: 0.25, 2: 0.5})
    assert s["mean_effective_staleness"] == pytest.approx(1.25)
    # Completions in [1, 10] s: every gradient but the one that ended at 0.8 s: 7 x 4 images in 9 s.
    assert s["images_per_s"] == pytest.approx(28 / 9)
    assert s["epoch_time_s"] == pytest.approx(100 * 9 / 28)
    assert (s["learners"], s["sub_batch"], s["dataset_size"]) == (2, 4, 100)


def test_a_learners_cycle_runs_from_its_start_to_its_next_start():
    """The hand-off to the buffer (and any wait for the interpreter lock) after a gradient's end is part of its
    learner's cycle, the model's T_c: the rate of completions is then N b / T_c (here to the log's edges)."""
    ev = hand_log()
    ev["grad_t_end"][2] = 1.7  # learner 1's gradient [1.2, 1.8] hands off for 0.1 s before its next start
    s = events.statistics(ev)
    assert s["t_compute_s"] == pytest.approx(2.2) and s["t_compute_cv"] == pytest.approx(math.sqrt(1.06) / 2.2)
    ev["lockstep"] = np.int64(1)  # a lockstep learner waits for the next version between cycles: end - start
    assert events.statistics(ev)["t_compute_s"] == pytest.approx((0.5 + 2.0 + 3.2 + 3.0) / 4)
    sim = events.statistics(events.simulate_log(4, 0.02, 0.005, 0.3, 0.0, duration_s=60.0, seed=2))
    assert sim["learners"] * sim["sub_batch"] / sim["images_per_s"] == pytest.approx(sim["t_compute_s"], rel=5e-3)


def test_statistics_split_the_updater_cycles_by_kind():
    """The gap from a swap to the next is an empty cycle where its update gathered nothing, else an applying one."""
    s = events.statistics(hand_log())  # after the warm-up: v3, v4 apply (gaps 2 and 3 s), no empty cycle
    assert s["t_update_applying_s"] == pytest.approx(2.5) and s["applying_cycles"] == 2
    assert math.isnan(s["t_update_empty_s"]) and s["empty_cycles"] == 0
    ev = hand_log()
    ev["warmup_until_s"] = np.float64(0.0)  # v1, v2 empty (gaps 0.5 and 1.5 s) as well
    s = events.statistics(ev)
    assert (s["t_update_empty_s"], s["empty_cycles"]) == (pytest.approx(1.0), 2)
    assert (s["t_update_applying_s"], s["applying_cycles"]) == (pytest.approx(2.5), 2)
    n = s["empty_cycles"] + s["applying_cycles"]
    assert (s["empty_cycles"] * s["t_update_empty_s"] + s["applying_cycles"] * s["t_update_applying_s"]) / n == \
        pytest.approx(s["t_update_s"])


def test_no_warm_up_counts_everything():
    ev = hand_log()
    ev["warmup_until_s"] = np.float64(0.0)
    s = events.statistics(ev)
    assert (s["updates"], s["gradients"]) == (5, 6)
    assert s["count_pmf"] == pytest.approx({0: 0.4, 1: 0.2, 2: 0.2, 3: 0.2})


def test_save_load_round_trip(tmp_path):
    path = str(tmp_path / "events.npz")
    events.save(path, hand_log())
    back = events.load(path)
    for k, v in events.check(hand_log()).items():
        np.testing.assert_array_equal(back[k], v)
        assert back[k].dtype == v.dtype
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.npz"]  # no temporary file left


def test_load_refuses_a_missing_file(tmp_path):
    with pytest.raises(DataError, match="invalid events="):
        events.load(str(tmp_path / "nothing.npz"))


def _broken(**changes):
    ev = hand_log()
    for k, v in changes.items():
        if v is None:
            del ev[k]
        else:
            ev[k] = v
    return ev


@pytest.mark.parametrize("changes,field", [
    (dict(grad_t_end=None), "events.grad_t_end"),
    (dict(update_count=np.asarray([0, 0, 3, 1])), "events.update_version"),
    # a gradient applied twice: the counts no longer add up
    (dict(update_count=np.asarray([0, 0, 3, 2, 2])), "events.update_count"),
    (dict(update_version=np.asarray([1, 2, 3, 5, 6])), "events.update_version"),
    (dict(grad_applied_version=np.asarray([3, 3, 3, 4, 5, 5, -1, 9])), "events.grad_applied_version"),
    (dict(grad_read_version=np.asarray([0, 0, 1, 4, 2, 1, 3, 3])), "events.grad_applied_version"),  # S < 0
    (dict(update_t_start=np.asarray([0.0, 0.4, 2.0, 4.0, 7.0])), "events.update_t_start"),
    (dict(grad_t_end=np.asarray([1.5, 0.8, 1.8, 3.5, 6.5, 5.0, 9.5, 4.0])), "events.grad_t_end"),
    (dict(grad_t_start=np.asarray([0.0, 0.0, 1.2, 1.4, 3.5, 1.8, 6.5, 5.0])), "events.grad_t_start"),
    (dict(grad_learner=np.asarray([0, 1, 1, 0, 0, 1, 0, 2])), "events.grad_learner"),
    (dict(grad_host=np.ones(8, np.int32)), "events.grad_host"),
    (dict(grad_t_start=np.full(8, np.nan)), "events.grad_t_start"),
    (dict(sub_batch=np.int64(0)), "events.sub_batch"),
])
def test_check_names_the_inconsistent_field(changes, field):
    with pytest.raises(DataError, match=f"invalid {field}="):
        events.check(_broken(**changes))


def test_a_partial_multi_host_log_is_checked_with_at_most():
    # Host 0's gradients only of a 2-host run: the global counts may exceed what this log applies.
    ev = _broken(num_hosts=np.int64(2), update_count=np.asarray([0, 2, 5, 1, 2]))
    events.check(ev)
    with pytest.raises(DataError, match="invalid events.update_count="):
        events.check(_broken(num_hosts=np.int64(2), update_count=np.asarray([0, 0, 2, 1, 2])))


def test_simulated_log_is_consistent_and_accounts_for_every_gradient():
    ev = events.simulate_log(3, 0.1, 0.07, 0.3, 0.2, duration_s=20.0, warmup_s=1.0, sub_batch=8, seed=1)
    s = events.statistics(ev)
    applied = ev["grad_applied_version"] >= 1
    assert np.sum(ev["update_count"]) == np.count_nonzero(applied)
    assert s["gradients_total"] == np.count_nonzero(applied) + s["in_flight"]
    assert s["in_flight"] > 0
    # A gradient never applied ended after the last published update's swap (else that swap took it).
    assert np.all(ev["grad_t_end"][~applied] > ev["update_t_start"][-1])


def _tv(measured: dict, offset, pmf) -> float:
    pmf = np.asarray(pmf, np.float64)
    model = {int(offset) + i: p for i, p in enumerate(pmf) if p > 0}
    return 0.5 * sum(abs(measured.get(k, 0.0) - model.get(k, 0.0)) for k in set(measured) | set(model))


@pytest.mark.parametrize("n,tu,cv", [(4, 0.37, 0.3), (8, 2.5, 0.1), (2, 0.2, 0.15), (1, 0.15, 0.5)])
def test_statistics_of_a_long_simulated_run_match_the_model(n, tu, cv):
    # With jitter: one run of learners without jitter keeps its start phases (the model assumes uniform ones).
    tc = 1.0
    # At least 20,000 updates and 20,000 gradients (the empirical pmfs' TV noise is about 0.01 then).
    ev = events.simulate_log(n, tc, tu, cv, duration_s=20_000 * max(tu, tc / n), warmup_s=5.0, sub_batch=4,
                             seed=2)
    s = events.statistics(ev)
    assert s["t_compute_s"] == pytest.approx(tc, rel=0.02)
    assert s["t_update_s"] == pytest.approx(tu, rel=1e-6)
    d = sprint.distributions(n, tc, tu, cv)  # the default windows hold these pmfs (one compilation for all)
    assert s["mean_count"] == pytest.approx(float(d.mean_count), rel=0.02)
    assert s["mean_staleness"] == pytest.approx(float(d.mean_staleness), rel=0.02)
    assert s["images_per_s"] == pytest.approx(4 * n / tc, rel=0.02)
    assert _tv(s["count_pmf"], d.count_offset, d.count_pmf) < 0.02
    assert _tv(s["staleness_pmf"], d.staleness_offset, d.staleness_pmf) < 0.02


def _with_global_stalls(ev: dict, mean_stall: float, seed: int) -> dict:
    """The log with a stall of the whole process (every thread frozen, exponential length) right after each
    swap: the updater's cycles jitter by the stalls, and no gradient progresses during one."""
    ev = {k: np.array(v) for k, v in ev.items()}
    swaps = ev["update_t_start"].copy()
    extra = np.cumsum(np.random.default_rng(seed).exponential(mean_stall, swaps.size))

    def shift(t):
        i = np.searchsorted(swaps, t, side="right") - 1
        return t + np.where(i >= 0, extra[np.maximum(i, 0)], 0.0)

    for k in ("grad_t_start", "grad_t_end", "update_t_start", "update_t_end"):
        ev[k] = shift(ev[k])
    ev["t_stop_s"] = np.float64(shift(np.asarray([float(ev["t_stop_s"])]))[0])
    return ev


def test_count_coupling_finds_what_the_model_assumes_and_what_breaks_it():
    ev = events.simulate_log(4, 0.02, 0.03, 0.3, 0.3, duration_s=300.0, warmup_s=1.0, seed=3)
    c = events.count_coupling(ev)
    # The model's protocol: arrivals independent of the updater, so the count follows the cycle's length at
    # the learners' rate and a swap-aligned window is like any other of its length.
    assert c["slope_ratio"] == pytest.approx(1.0, abs=0.1)
    assert c["variance_ratio"] == pytest.approx(1.0, abs=0.1)
    # Global stalls: the same arrivals in operational time, cycles stretched by time in which nothing runs.
    stalled = events.count_coupling(_with_global_stalls(
        events.simulate_log(4, 0.02, 0.03, 0.3, 0.0, duration_s=300.0, warmup_s=1.0, seed=3), 0.01, 4))
    assert abs(stalled["slope_ratio"]) < 0.15
    assert stalled["variance_ratio"] < 0.8
    # Renewal learners: one gradient's compute time says nothing of the next one's.
    assert c["compute_lag1"] == pytest.approx(0.0, abs=0.05)
    # A slowness that persists (the whole host's speed swinging by +-80% over 2 s, about 100 gradients): the
    # same log on a warped clock, t -> int 1 + 0.8 sin(2 pi t / 2 s) dt.
    warp = lambda t: t + (0.8 * 2.0 / (2 * math.pi)) * (1 - np.cos(2 * math.pi * np.asarray(t) / 2.0))  # noqa: E731
    slow = {k: (warp(v) if k.startswith(("grad_t_", "update_t_")) or k in ("warmup_until_s", "t_stop_s")
                else np.array(v)) for k, v in ev.items()}
    assert events.count_coupling(slow)["compute_lag1"] > 0.5
    small = events.count_coupling(hand_log())  # swaps at 2, 4 and 7 s after the warm-up: counts 1 and 2
    assert small["var_cycles"] == pytest.approx(0.25)
    ev = hand_log()
    ev["warmup_until_s"] = np.float64(3.0)  # two swaps left: one cycle is not enough
    assert math.isnan(events.count_coupling(ev)["slope_ratio"])
