"""jaxsprint.calibration.design: the calibration's runs chosen from the figures' sensitivities."""
import numpy as np
import pytest

from jaxsprint.calibration import design, host, host_fit
from jaxsprint.errors import ConfigError
from jaxsprint.perf import machines, zoo


def test_select_prefers_the_runs_that_see_each_figure():
    """Two figures, three candidate runs: one sees the first, one the second, one neither; with one run of
    budget each the greedy design takes the informative ones, the cheaper first, and stops when nothing gains."""
    jac = np.zeros((6, 2))  # rows: T_c of runs 0-2, then T_u of runs 0-2
    jac[0, 0] = 1.0   # run 0's T_c sees figure 0
    jac[4, 1] = 2.0   # run 1's T_u sees figure 1
    chosen = design.select(jac, [10.0, 5.0, 1.0], 100.0)
    assert chosen == [1, 0]  # run 2 adds nothing
    assert design.select(jac, [10.0, 5.0, 1.0], 9.0) == [1]  # the budget left after run 1 is too small for run 0
    rse = design.predicted_rel_std_error(jac, [0, 1], sigma=0.1)
    assert rse[0] == pytest.approx(np.expm1(0.1)) and rse[1] == pytest.approx(np.expm1(0.05))
    assert np.isinf(design.predicted_rel_std_error(jac, [0], sigma=0.1)[1])  # a figure no chosen run sees
    with pytest.raises(ConfigError, match="cost_s"):
        design.select(jac, [1.0, 0.0, 1.0], 10.0)


def test_groups_are_covered_first():
    jac = np.zeros((6, 2))
    jac[0, 0], jac[1, 1] = 1.0, 1.0   # runs 0 and 1 carry all the information; run 2 none
    chosen = design.select(jac, [1.0, 1.0, 1.0], 10.0, groups=["a", "a", "b"])
    assert chosen[:2] in ([0, 2], [1, 2], [2, 0], [2, 1]) and set(chosen) == {0, 1, 2}


def test_the_design_determines_more_than_one_host_runs():
    """From the candidates of the whole space, a design of 330 s of runs (20 s each) covers every regime and
    determines more host figures (predicted relative standard error below 1 at 5% noise per log time; both
    kinds of updater cycle measured, as the calibration's runs do) than the old default's eight one-host runs
    at sub-batch 32 (the updater on the first learner's device), which cannot see the two-host stretch."""
    net = zoo.get("resnet8")
    m = machines.get("cpu_runtime")
    h = host.load_host(m, "cpu_runtime")
    pool = design.candidates()
    assert len(pool) == 2 * 4 * 5 * 4 * 2 and len({e.name for e in pool}) == len(pool)
    fields = list(host_fit.RUNTIME_FIELDS)
    jac = design.sensitivities(m, h, net, pool, fields, [True] * len(pool))
    assert jac.shape == (4 * len(pool), len(fields)) and np.all(np.isfinite(jac))
    col = fields.index("updater_shared_wait")
    assert np.all(jac[[i for i, e in enumerate(pool) if e.updater_device == "own"], col] == 0)
    assert np.any(jac[[len(pool) + i for i, e in enumerate(pool) if e.updater_device == "shared"], col] > 0.01)
    sleep = fields.index("updater_shared_sleep_wait")  # after the network's sleep only, any learners
    assert np.all(jac[[len(pool) + i for i, e in enumerate(pool) if e.updater_device == "own" or e.network_ms == 0],
                      sleep] == 0)
    assert np.any(jac[[len(pool) + i for i, e in enumerate(pool) if e.updater_device == "shared"
                       and e.learners_per_host == 1 and e.network_ms > 0], sleep] > 0.01)
    chosen = design.select(jac, [20.0] * len(pool), 390.0, groups=design.strata(pool), blocks=4)
    regimes = set(design.strata(pool))
    assert len(regimes) == 19 and len(chosen) == 19 and {design.strata(pool)[i] for i in chosen} == regimes
    lone = [(e.updater_device, e.sub_batch >= 64) for e in (pool[i] for i in chosen)
            if e.hosts == 1 and e.learners_per_host == 1 and e.network_ms == 0]
    assert sorted(p for p, large in lone if not large) == ["own", "shared"] and sum(large for _, large in lone) == 1
    assert {e.updater_device for e in (pool[i] for i in chosen) if e.hosts == 1 and e.network_ms == 0
            and e.learners_per_host == 8} == {"own", "shared"}  # one host's most learners, both placements
    assert {(e.hosts, e.updater_device) for e in pool if e.network_ms == 0 and e.learners_per_host > 1} == {
        (pool[i].hosts, pool[i].updater_device) for i in chosen if pool[i].network_ms == 0
        and pool[i].learners_per_host > 1}  # without network time, a run of several learners per host each
    old = [i for i, e in enumerate(pool) if e.hosts == 1 and e.sub_batch == 32 and e.network_ms in (0, 20)
           and e.updater_device == "shared"]
    assert len(old) == 8
    rse, rse_old = design.predicted_rel_std_error(jac, chosen, blocks=4), design.predicted_rel_std_error(
        jac, old, blocks=4)
    assert np.sum(rse < 1.0) > np.sum(rse_old < 1.0)
    stretch = fields.index("updater_hosts_stretch")  # one host only: the old runs cannot see it
    assert rse[stretch] < 1.0 and np.isinf(rse_old[stretch])
    for f in ("updater_shared_wait", "updater_shared_sleep_wait", "learner_step_cores"):
        assert rse[fields.index(f)] < 1.0, f


def test_an_entry_costs_what_it_adds_to_the_entries_chosen_before_it():
    """``extra_s``: runs 0 and 1 share processes, whose start (10 s) only the first of them pays. Run 2 sees a
    figure as well as run 1 does and costs as little on its own, but once run 0 has started the processes,
    run 1 is the cheaper and is taken; the budget counts each run at its price when it was chosen."""
    jac = np.zeros((6, 2))
    jac[0, 0], jac[1, 1], jac[2, 1] = 2.0, 1.0, 1.0
    layout = ["p", "p", "q"]

    def extra_s(i, chosen):
        return 0.0 if any(layout[j] == layout[i] for j in chosen) else 10.0

    assert design.select(jac, [1.0, 1.0, 1.0], 100.0, extra_s=extra_s)[:2] == [0, 1]
    assert design.select(jac, [1.0, 1.0, 1.0], 12.0, extra_s=extra_s) == [0, 1]  # 11 + 1 s: run 2 no longer fits
    assert design.select(jac, [1.0, 1.0, 1.0], 12.0, required=[2], extra_s=extra_s) == [2]  # 11 s; run 0: 11 more
    with pytest.raises(ConfigError, match="budget_s"):
        design.select(jac, [1.0, 1.0, 1.0], 20.0, required=[0, 2], extra_s=extra_s)  # 22 s required


def test_trim_drops_only_what_the_overrun_needs_and_the_least_informative_per_second():
    """Four runs of 10 s seeing figure 0 twice, figure 1 and figure 2 once each: 5 s over drops one of the
    two looks at figure 0 (the least information per second), not the run that alone sees a figure; 15 s
    over drops two."""
    jac = np.zeros((8, 3))
    jac[0, 0], jac[1, 0], jac[2, 1], jac[3, 2] = 1.0, 1.0, 1.0, 1.0
    price = lambda i, before: 10.0  # noqa: E731
    assert design.trim(jac, [0, 1, 2, 3], price, 40.0) == [0, 1, 2, 3]
    kept = design.trim(jac, [0, 1, 2, 3], price, 35.0)
    assert len(kept) == 3 and {2, 3} <= set(kept)
    assert design.trim(jac, [0, 1, 2, 3], price, 36.0, scale=1.2) == kept  # 48 s at the pace, 36 s left
    assert len(design.trim(jac, [0, 1, 2, 3], price, 25.0)) == 2
    # The runs done (required) count: with run 0 done, run 1 adds least and goes first.
    assert design.trim(jac, [1, 2, 3], price, 25.0, required=[0]) == [2, 3]
    # A run that is its regime's last stays while another can go, whatever it adds.
    assert design.trim(jac, [0, 1, 2, 3], price, 35.0, groups=["a", "b", "c", "c"]) in ([0, 1, 2], [0, 1, 3])
    # The price may depend on the runs kept before it (a series' processes started once).
    started = lambda i, before: 10.0 + (0.0 if before else 8.0)  # noqa: E731
    assert design.trim(jac, [2, 3], started, 28.0) == [2, 3] and len(design.trim(jac, [2, 3], started, 27.0)) == 1
    assert design.trim(jac, [0, 1], price, 5.0) == []


def test_trim_keeps_the_run_a_determined_figure_needs_while_another_can_go():
    """Figure 0 seen by run 0 (0.3, 30 s) and run 1 (0.2, 5 s): predicted relative standard error 0.149, 0.284
    without run 0; figure 1 by runs 2 and 3 (1.0, 10 s each). 5 s over, the least information per second is
    run 0; with ``determined=0.2`` it stays (figure 0 would leave 0.2) and one of runs 2, 3 goes instead."""
    jac = np.zeros((8, 2))
    jac[0, 0], jac[1, 0], jac[2, 1], jac[3, 1] = 0.3, 0.2, 1.0, 1.0
    cost = [30.0, 5.0, 10.0, 10.0]
    price = lambda i, before: cost[i]  # noqa: E731
    rse = design.predicted_rel_std_error(jac, [0, 1, 2, 3])
    assert rse[0] <= design.DETERMINED_RSE < design.predicted_rel_std_error(jac, [1, 2, 3])[0]
    assert design.trim(jac, [0, 1, 2, 3], price, 50.0) == [1, 2, 3]
    kept = design.trim(jac, [0, 1, 2, 3], price, 50.0, determined=design.DETERMINED_RSE)
    assert kept in ([0, 1, 2], [0, 1, 3])
    # A run it protects still goes where nothing else is left to drop (lasts), and never with lasts=False.
    assert 0 not in design.trim(jac, [0, 1, 2, 3], price, 20.0, determined=0.2)
    assert 0 in design.trim(jac, [0, 1, 2, 3], price, 20.0, determined=0.2, lasts=False)
    kept, share = design.squeeze(jac, [0, 1, 2, 3], lambda i, b, s: cost[i], 50.0, share=1.0, smallest=0.3,
                                 determined=0.2)
    assert 0 in kept and len(kept) == 3


def test_an_overrun_shortens_every_regimes_run_before_it_drops_one():
    """squeeze: four runs of regimes a, b, c, c, each 4 s of start and end plus 10 s x its share of measuring.
    With room for all: all at the share. A little over: run 2 or 3 (regime c's second) goes first, then the
    rest are shortened to the largest share that fits (0.6 - 0.05 j), a regime's only run kept; where even the
    smallest share would not fit, regimes' last runs go too, at the smallest share."""
    jac = np.zeros((8, 3))
    jac[0, 0], jac[1, 1], jac[2, 2], jac[3, 2] = 1.0, 1.0, 1.0, 0.5
    price = lambda i, before, s: 4.0 + 10.0 * s  # noqa: E731
    groups = ["a", "b", "c", "c"]
    kw = dict(share=0.6, smallest=0.3, groups=groups)
    assert design.squeeze(jac, [0, 1, 2, 3], price, 40.0, **kw) == ([0, 1, 2, 3], 0.6)  # 40 s
    assert design.squeeze(jac, [0, 1, 2, 3], price, 30.0, **kw) == ([0, 1, 2], 0.6)  # run 3 adds least
    kept, share = design.squeeze(jac, [0, 1, 2, 3], price, 25.0, **kw)  # three runs fit at 0.45: 25.5 s > 25
    assert (kept, share) == ([0, 1, 2], 0.4)
    # At a pace of 1.25, 25 s left holds 20 s as planned: three runs at 0.25 would, the floor 0.3 does not.
    kept, share = design.squeeze(jac, [0, 1, 2, 3], price, 25.0, pace=1.25, **kw)
    assert share == 0.3 and len(kept) == 2 and 2 in kept
    # Without regimes (groups None), runs are dropped as trim drops them (two of 10 s fit), none shortened.
    kept, share = design.squeeze(jac, [0, 1, 2, 3], price, 25.0, share=0.6, smallest=0.3)
    assert len(kept) == 2 and 3 not in kept and share == 0.6


def test_pace_is_the_measured_over_the_planned_with_a_prior_at_the_plan():
    assert design.pace(0.0, 0.0) == 1.0 and design.pace(10.0, 20.0) == 1.0  # faster than planned: 1
    assert design.pace(19.0, 18.0) == pytest.approx(79.0 / 78.0)  # one short series barely moves it
    assert design.pace(300.0, 200.0, prior_s=0.0) == 1.5 and design.pace(600.0, 400.0) == pytest.approx(660 / 460)


def test_a_design_chosen_again_among_the_runs_left_keeps_the_one_that_pins_a_figure():
    """``candidates`` with ``required`` (the runs done): entries 0 and 1 see figure 0, only entry 3 sees figure
    1; the design's order was 0, 1, 2, 3. With room for one run after entry 0, the order would keep entry 1 (a
    second look at figure 0); chosen again, entry 3 (figure 1's only run). A regime left uncovered whose runs
    no longer fit does not stop the choice of the rest."""
    jac = np.zeros((8, 2))
    jac[0, 0], jac[1, 0], jac[2, 0], jac[3, 1] = 2.0, 1.9, 0.5, 1.0
    assert design.select(jac, [1.0] * 4, 2.0, required=[0], candidates=[1, 2, 3]) == [0, 3]
    assert design.select(jac, [1.0] * 4, 2.0, required=[0], candidates=[1, 2]) == [0, 1]
    groups = ["a", "a", "b", "a"]  # regime b (entry 2) costs more than what is left
    assert design.select(jac, [1.0, 1.0, 5.0, 1.0], 2.0, required=[0], candidates=[1, 2, 3], groups=groups) == [0, 3]


def test_the_first_regimes_leave_the_budget_what_covering_the_others_costs():
    """Regime A's informative run (30 s) would leave too little for B's and C's only runs (10 s each) within
    40 s: the design takes A's cheaper run and covers every regime; with room for all, A's informative run."""
    jac = np.zeros((2 * 4, 3))
    jac[0] = [3.0, 0.0, 0.0]  # entry 0 (A, 30 s): much information
    jac[1] = [0.01, 0.0, 0.0]  # entry 1 (A, 10 s): little
    jac[2] = [0.0, 1.0, 0.0]  # entry 2 (B)
    jac[3] = [0.0, 0.0, 1.0]  # entry 3 (C)
    cost, groups = [30.0, 10.0, 10.0, 10.0], ["A", "A", "B", "C"]
    tight = design.select(jac, cost, 40.0, groups=groups)
    assert sorted(tight) == [1, 2, 3]
    roomy = design.select(jac, cost, 50.0, groups=groups)
    assert 0 in roomy and {groups[i] for i in roomy} == {"A", "B", "C"}


def test_covering_the_other_regimes_counts_their_start_ups():
    """Regime A's informative run (20 s) and its cheap one (5 s) share processes; regime B's only run (5 s) needs
    processes of its own (10 s to start, as A's). Within 40 s, A's informative run would leave 10 s, less than
    B's 15 s with its start-up: the design takes A's cheap run and covers B; within 50 s, the informative one."""
    jac = np.zeros((3 * 4, 2))
    jac[0], jac[1], jac[2] = [3.0, 0.0], [0.01, 0.0], [0.0, 0.001]  # B's run adds least: it is not taken first
    layout, groups = ["p", "p", "q"], ["A", "A", "B"]

    def extra_s(i, chosen):
        return 0.0 if any(layout[j] == layout[i] for j in chosen) else 10.0

    cost = [20.0, 5.0, 5.0]
    assert sorted(design.select(jac, cost, 40.0, groups=groups, blocks=4, extra_s=extra_s)) == [1, 2]
    roomy = design.select(jac, cost, 50.0, groups=groups, blocks=4, extra_s=extra_s)
    assert roomy[0] == 0 and 2 in roomy
    price = lambda i, before: cost[i] + extra_s(i, before)  # noqa: E731
    assert design.cover_s({"A", "B"}, range(3), groups, [], price) == 30.0  # 5 + 10 and 5 + 10
    assert design.cover_s({"A"}, range(3), groups, [2], price) == 15.0
    assert design.cover_s({"A", "B"}, [0, 1], groups, [], price) == float("inf")  # no candidate of B
    assert design.cover_s(set(), range(3), groups, [], price) == 0.0


def test_a_slow_machine_gets_shorter_runs_of_every_regime():
    """``run_scale``: the largest of 1, 0.9, ... whose cover takes at most 85% of the budget, the smallest
    where none does, never asking for a scale below it."""
    asked = []

    def cover(s):
        asked.append(s)
        return 200.0 + 100.0 * s

    assert design.run_scale(cover, 400.0, 0.6) == 1.0 and asked == [1.0]  # 300 s of 340
    assert design.run_scale(cover, 320.0, 0.6) == pytest.approx(0.7)  # 270 s of 272
    asked.clear()
    assert design.run_scale(cover, 300.0, 0.6) == pytest.approx(0.6) and min(asked) > 0.65  # none fits 255 s
    assert design.run_scale(cover, 100.0, 1.0) == 1.0
