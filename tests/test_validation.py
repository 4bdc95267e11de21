"""Tests of jaxsprint.plan.validation's bookkeeping (the runtime runs themselves are the launcher's slow mode)."""
import math

import numpy as np
import pytest

from jaxsprint.plan import emulator, validation
from jaxsprint.errors import ConfigError
from jaxsprint.plan import law

TRUE = np.array([math.log(60.0), math.log(1.0), math.log(0.02), math.log(2.0), 1.0])


def test_parse_configs():
    assert validation.parse_configs(["4:16:0.01", "1:8:0"]) == [(4, 16, 0.01), (1, 8, 0.0)]
    for bad in (["4:16"], ["0:16:0", "1:1:0"], ["4:16:-1", "1:1:0"], ["4:16:0"]):
        with pytest.raises(ConfigError, match="config.runtime_configs"):
            validation.parse_configs(bad)


def test_runtime_config_trains_what_the_emulator_trains():
    from experiments.configs import sprint as sprint_config

    c = validation.runtime_config(sprint_config.get_config(), learners=4, sub_batch=16, network_time_s=0.002,
                                    num_updates=300, eval_every_updates=10, learning_rate=0.1)
    # The emulator's proxy: tiny_nobn on the un-augmented 8x8 digits at one constant rate.
    assert (c.model, c.image_size, c.dataset, c.augment.kind) == ("tiny_nobn", 8, "digits", "none")
    assert (c.lr.scaling, c.lr.schedule, c.lr.base) == ("none", "constant", 0.1)
    s = c.sprint
    assert (s.learners_per_host, s.sub_batch, s.network_time_s, s.num_updates) == (4, 16, 0.002, 300)
    assert s.warmup_s == 0.0 and s.duration_s == 0.0
    assert s.eval_every_updates == 10 and s.eval_deferred  # evaluated after the run, not beside it


def test_measure_reuses_a_finished_run_of_the_same_config_only(tmp_path, monkeypatch):
    import json

    from experiments.configs import sprint as sprint_config
    from jaxsprint import runtime
    from jaxsprint.runtime import events

    def cfg(lr):
        return validation.runtime_config(sprint_config.get_config(), learners=2, sub_batch=8, network_time_s=0.0,
                                           num_updates=100, eval_every_updates=10, learning_rate=lr)

    wd = tmp_path / "run"
    wd.mkdir()
    ev = events.simulate_log(2, 0.02, 0.01, 0.2, duration_s=2.0, sub_batch=8, seed=0)
    np.savez(wd / "events.npz", **ev)
    (wd / "summary.json").write_text(json.dumps({"eval": {"accuracy": 0.9}, "eval_history": [
        {"version": 10, "accuracy": 0.5}, {"version": 30, "accuracy": 0.9}]}))
    (wd / validation.RUN_RECORD).write_text(cfg(0.1).to_json(sort_keys=True))

    class Ran(Exception):
        pass

    def fake_run(config, workdir):
        raise Ran(config.lr.base)

    monkeypatch.setattr(runtime, "run", fake_run)
    m = validation.measure(cfg(0.1), str(wd), 0.7, reuse=True)
    assert m["reused"] and m["updates_to_target"] == pytest.approx(20.0) and m["final_accuracy"] == 0.9
    assert m["time_to_accuracy_s"] == pytest.approx(float(ev["update_t_end"][19]))
    assert m["mean_staleness"] == pytest.approx(events.statistics(ev)["mean_staleness"])
    with pytest.raises(Ran):  # another learning rate: run again
        validation.measure(cfg(0.2), str(wd), 0.7, reuse=True)
    with pytest.raises(Ran):  # without reuse: always run
        validation.measure(cfg(0.1), str(wd), 0.7)


def test_updates_from_history():
    hist = [(10, {"accuracy": 0.5}), (20, {"accuracy": 0.9})]
    assert validation.updates_from_history(hist, 0.7) == pytest.approx(15.0)
    assert validation.updates_from_history(hist, 0.95) is None
    assert validation.updates_from_history([], 0.5) is None


def test_emulated_spec_reads_the_measured_pmfs():
    m = {"staleness_pmf": {1: 0.25, 2: 0.75}, "minibatch_pmf": {16: 0.5, 32: 0.5}, "mean_minibatch": 24.0,
         "mean_staleness": 1.75}
    s = validation.emulated_spec(m, 0.1)
    assert s.staleness_pmf.size == emulator.MAX_STALENESS + 1 and s.staleness_pmf[2] == pytest.approx(0.75)
    assert s.max_minibatch == 32 and s.minibatch_pmf[16] == pytest.approx(0.5) and s.sub_batch == 0
    assert validation.emulated_spec(dict(m, sub_batch=16), 0.1).sub_batch == 16  # BN per sub-batch in a network
    # With the staleness in non-empty updates measured, the emulator draws that (its ring counts those),
    # while the spec keeps the version staleness as the law's coordinate.
    m.update(effective_staleness_pmf={0: 0.5, 1: 0.5}, mean_effective_staleness=0.5)
    s = validation.emulated_spec(m, 0.1)
    assert s.staleness_pmf[0] == pytest.approx(0.5) and s.staleness_pmf[1] == pytest.approx(0.5)
    assert s.staleness_pmf[2] == 0.0 and s.mean_staleness == 1.75


def test_compare_leave_one_out_on_a_known_law():
    rng = np.random.default_rng(0)
    measured, cells = [], []
    for b, tau in [(16, 1.2), (32, 2.0), (64, 1.5), (32, 4.0), (16, 6.0), (64, 3.0)]:
        u = math.exp(float(law.law_log_updates(TRUE, b, tau, 64.0)))
        t_u = 0.01 * rng.uniform(0.5, 2.0)
        measured.append(dict(learners=1, sub_batch=b, network_time_s=0.0, t_update_s=t_u, mean_minibatch=b,
                             mean_staleness=tau, updates_to_target=u, time_to_accuracy_s=u * t_u))
        upd = np.arange(1, 201, dtype=np.float64) * 20
        acc = np.minimum(0.9 * upd / u, 1.0)
        cells.append(emulator.RunResult(upd, np.stack([acc, acc])))
    out = validation.compare(measured, cells, 0.9, 4000)
    assert len(out["rows"]) == 6
    for suffix in ("", "_loo"):  # fitted to every cell, and to the others only
        assert out[f"median_abs_error{suffix}"] is not None and out[f"median_abs_error{suffix}"] < 0.15
        assert out[f"choice_slower_than_fastest_by{suffix}"] is not None
        assert out[f"choice_slower_than_fastest_by{suffix}"] < 0.10
    # With its own cell the law is near that cell; without, it extrapolates (no better on average).
    assert out["median_abs_error"] <= out["median_abs_error_loo"] + 1e-9


def test_compare_never_chooses_beyond_the_staleness_of_a_reached_cell():
    # Four configurations reach the target; the stalest never does but updates 1000x faster, so any finite
    # prediction of the law would make it the fastest. Its staleness is beyond every reached cell's: the law is
    # extrapolated there, the row says so, and neither choice takes it.
    measured, cells = [], []
    upd = np.arange(1, 201, dtype=np.float64) * 20
    for b, tau, t_u in [(16, 1.2, 0.01), (32, 2.0, 0.01), (64, 1.5, 0.01), (32, 4.0, 0.01), (8, 12.0, 1e-5)]:
        u = math.exp(float(law.law_log_updates(TRUE, b, tau, 64.0)))
        reached = tau < 10
        measured.append(dict(learners=1, sub_batch=b, network_time_s=0.0, t_update_s=t_u, mean_minibatch=b,
                             mean_staleness=tau, updates_to_target=u if reached else None,
                             time_to_accuracy_s=u * t_u if reached else None))
        acc = np.minimum(0.9 * upd / u, 1.0) if reached else np.full(upd.size, 0.3)
        cells.append(emulator.RunResult(upd, np.stack([acc, acc])))
    out = validation.compare(measured, cells, 0.9, 4000)
    stale = out["rows"][-1]
    assert stale["extrapolated"] and stale["extrapolated_loo"]
    assert stale["predicted_time_to_accuracy_s"] < min(r["predicted_time_to_accuracy_s"] for r in out["rows"][:-1])
    assert not any(r["extrapolated"] for r in out["rows"][:-1])
    assert out["choice"] != 4 and out["choice_loo"] != 4
    assert out["choice_slower_than_fastest_by"] is not None and out["choice_slower_than_fastest_by"] < 0.10
    # The emulated runs' updates against the runtime's, where both reached.
    assert out["emulator_median_abs_error"] is not None and out["emulator_median_abs_error"] < 0.05


def test_pool_seeds_of_one_configuration():
    def seed(stale, mb, t_u, u, t):
        return {"t_compute_s": 0.1, "t_update_s": t_u, "mean_minibatch": mb, "mean_staleness": stale,
                "mean_effective_staleness": stale, "staleness_pmf": {1: 0.5, int(stale * 2) - 1: 0.5},
                "effective_staleness_pmf": {"1": 1.0}, "minibatch_pmf": {mb: 1.0}, "updates_to_target": u,
                "time_to_accuracy_s": t, "time_to_accuracy_from_updates_s": None if u is None else u * t_u,
                "final_accuracy": 0.9, "updates": 100, "reused": False, "learners": 2, "sub_batch": 16,
                "network_time_s": 0.0}

    one = seed(2.0, 32, 0.01, 300.0, 3.0)
    assert validation.pool([one])["updates_to_target"] == 300.0 and len(validation.pool([one])["per_seed"]) == 1
    p = validation.pool([seed(2.0, 32, 0.01, 300.0, 3.0), seed(3.0, 48, 0.02, None, None),
                         seed(2.5, 16, 0.03, 500.0, 5.5)])
    # Medians with a seed that never reached the target counted as infinitely late.
    assert p["updates_to_target"] == 500.0 and p["time_to_accuracy_s"] == 5.5
    assert p["mean_staleness"] == pytest.approx(2.5) and p["t_update_s"] == pytest.approx(0.02)
    assert p["mean_minibatch"] == pytest.approx(32.0) and p["updates"] == 300
    assert sum(p["staleness_pmf"].values()) == pytest.approx(1.0) and p["staleness_pmf"][1] == pytest.approx(0.5)
    assert p["minibatch_pmf"] == pytest.approx({16: 1 / 3, 32: 1 / 3, 48: 1 / 3})
    assert [r["updates_to_target"] for r in p["per_seed"]] == [300.0, None, 500.0]
    late = validation.pool([seed(2.0, 32, 0.01, None, None), seed(2.0, 32, 0.01, None, None),
                            seed(2.0, 32, 0.01, 400.0, 4.0)])
    assert late["updates_to_target"] is None and late["time_to_accuracy_s"] is None  # most seeds never reached it
    with pytest.raises(ConfigError, match="config.runtime_seeds"):
        validation.pool([])
