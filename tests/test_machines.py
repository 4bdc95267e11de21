"""Tests of jaxsprint.perf.machines: every figure of every preset says where it comes from, figures are
validated, and the cpu preset's fitted figures (a shipped data file) name the command and the stored file that
produce them."""
import json
import os
import shlex

import pytest

from jaxsprint.perf import machines as mc
from perf_util import raises_invalid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", sorted(mc.PRESETS))
def test_machine_presets_cite_every_figure(name):
    m = mc.get(name)
    sources = dict(m.sources)
    assert set(sources) == set(mc.FIELDS)  # one source per figure, nothing else
    for field in mc.FIELDS:
        assert sources[field].strip(), field
        assert float(getattr(m, field)) >= 0
    assert "fp32" in sources["peak_flops_per_s"]
    table = mc.describe(m)
    assert all(field in table for field in mc.FIELDS)


def test_cpu_preset_fitted_figures_name_their_command_and_file():
    m = mc.get("cpu")
    sources = dict(m.sources)
    fitted = [f for f, s in sources.items() if s.startswith("fitted by")]
    with open(os.path.join(mc.DATA_DIR, "cpu.json")) as fh:
        data = json.load(fh)
    assert sorted(data["fitted"]) == sorted(fitted) and len(fitted) == 4
    args = dict(a.removeprefix("--config.").removeprefix("--").split("=", 1) for a in shlex.split(data["command"])[2:])
    assert set(args["fit_fields"].split(",")) == set(fitted)  # the config.fit_fields of the command
    # The command writes this very file, as this preset (name and description kept).
    assert args["out"] == "jaxsprint/perf/data/cpu.json" and args["name"] == args["base"] == m.name == data["name"]
    assert os.path.exists(os.path.join(ROOT, args["measurements"]))
    for f in fitted:
        assert f"`{data['command']}` on {args['measurements']}" in sources[f], f
    # The figures its data cannot determine are held at their --fixed values, each with the reason as source.
    assert set(args["fixed"].split(",")) == set(data["fixed"]) and not set(data["fixed"]) & set(fitted)
    for f, v in data["fixed"].items():
        assert float(getattr(m, f)) == pytest.approx(v, rel=1e-6) and sources[f].startswith("fixed at"), f
        assert "not fitted" in sources[f], f
    assert "efficiency_fwd" in sources["efficiency_bwd_data"]  # held with it
    for f, v in data["figures"].items():
        assert float(getattr(m, f)) == pytest.approx(v, rel=1e-6), f
    for s in sources.values():  # cites only files that exist
        for word in s.replace("(", " ").replace(")", " ").replace(",", " ").split():
            if word.startswith("docs/"):
                assert os.path.exists(os.path.join(ROOT, word.rstrip(".;:"))), word


def test_unknown_machine_lists_presets():
    with raises_invalid("machine", "tsubame3", "one of tsubame25, tsubame_kfc_dl"):
        mc.get("tsubame3")


def test_figures_are_validated():
    figures = {f: float(getattr(mc.get("abci"), f)) for f in mc.FIELDS}
    with raises_invalid("peak_flops_per_s", -1.0, "a finite number > 0"):
        mc.make_machine("m", "", {}, **{**figures, "peak_flops_per_s": -1.0})
    with raises_invalid("step_overhead_s", float("inf"), "a finite number >= 0"):
        mc.make_machine("m", "", {}, **{**figures, "step_overhead_s": float("inf")})
    assert float(mc.make_machine("m", "", {}, **{**figures, "step_overhead_s": 0.0}).step_overhead_s) == 0.0
    del figures["max_nodes"]
    with raises_invalid("machine 'm' figures", ("max_nodes",), "every figure"):
        mc.make_machine("m", "", {}, **figures)
    with raises_invalid("field", "speed", "a machine figure: one of peak_flops_per_s"):
        mc.with_figures(mc.get("abci"), speed=1.0)


def test_with_figures_replaces_only_what_it_names():
    m = mc.with_figures(mc.get("abci"), network_latency_s=7e-5)
    assert float(m.network_latency_s) == pytest.approx(7e-5)
    assert float(m.peak_flops_per_s) == float(mc.get("abci").peak_flops_per_s)
    assert m.sources == mc.get("abci").sources


def test_cpu_preset_is_the_fit_of_its_stored_measurements():
    # The split, loss and data of the command in cpu.json: the preset predicts both halves of the small-CNN set
    # as the command reported when it wrote the file (held-out median 6.0%), and it is a minimum of the fit's loss
    # on the fitting half in every fitted figure.
    import numpy as np

    from jaxsprint.calibration import model_fit
    from jaxsprint.calibration import measurements

    with open(os.path.join(mc.DATA_DIR, "cpu.json")) as fh:
        data = json.load(fh)
    args = dict(a.removeprefix("--config.").removeprefix("--").split("=", 1) for a in shlex.split(data["command"])[2:])
    assert args["holdout_batches"] == "" and args["loss"] == "soft_l1" and set(args) <= {
        "measurements", "base", "name", "out", "holdout_batches", "holdout_fraction", "holdout_seed", "loss",
        "loss_scale", "fit_fields", "fixed", "bounds"}  # nothing else moves the fit (seed, starts: defaults)
    steps = measurements.step_timings(measurements.load_measurements(os.path.join(ROOT, args["measurements"]))
                                      ["steps"])
    held = model_fit.holdout_split(len(steps), float(args["holdout_fraction"]), seed=int(args["holdout_seed"]))
    fit = [s for s, h in zip(steps, held) if not h]
    test = [s for s, h in zip(steps, held) if h]
    m = mc.get("cpu")
    measured = np.asarray([s.measured_s for s in fit])
    scale = float(args["loss_scale"])

    def loss(predicted):
        r = np.log(predicted / measured)
        return np.mean(2 * scale ** 2 * (np.sqrt(1 + (r / scale) ** 2) - 1))  # soft_l1

    import jax

    groups = model_fit._group(fit)  # one compilation for the preset and every moved figure below
    predict_fit = jax.jit(lambda machine: model_fit._predict(machine, groups, (), "ring")[0])
    on_fit = np.asarray(predict_fit(m))
    np.testing.assert_allclose(on_fit, model_fit.predict_timings(m, fit)[0], rtol=1e-6)
    pred = model_fit.predict_timings(m, test)[0]
    for split, errors in (("steps_fit", on_fit / measured - 1),
                          ("steps_held_out", pred / np.asarray([s.measured_s for s in test]) - 1)):
        stats, reported = model_fit.error_stats(errors), data["calibration"][split]
        assert stats["n"] == reported["n"] == 20 and stats["median_abs_error"] < 0.061, split
        for k in ("median_abs_error", "mean_abs_error", "max_abs_error"):
            assert stats[k] == pytest.approx(reported[k], rel=1e-3, abs=1e-5), (split, k)
    base = loss(on_fit)
    assert base == pytest.approx(data["calibration"]["compute_fit"]["loss"], rel=1e-3)
    for f in data["fitted"]:  # every fitted figure, both ways
        for k in (0.9, 1.1):
            moved = mc.with_figures(m, **{f: float(getattr(m, f)) * k})
            assert loss(np.asarray(predict_fit(moved))) > base, (f, k)


def test_the_fitted_presets_are_data_and_the_runtime_figures_are_not_a_machines():
    """cpu and cpu_runtime are shipped JSON files (every figure with its source); a Machine holds none of the
    runtime's host figures (jaxsprint.calibration.host.HostFigures)."""
    shipped = sorted(f[:-5] for f in os.listdir(mc.DATA_DIR) if f.endswith(".json"))
    assert {"cpu", "cpu_runtime"} <= set(shipped) <= set(mc.PRESETS)
    assert not {"cores_per_node", "learner_overhead_s", "updater_queue", "learner_cv", "updater_cv"} & set(mc.FIELDS)
    for name in shipped:
        with open(os.path.join(mc.DATA_DIR, f"{name}.json")) as fh:
            data = json.load(fh)
        assert set(data["figures"]) == set(mc.FIELDS) == set(data["sources"]), name
        m = mc.get(name)
        for f, v in data["figures"].items():
            assert float(getattr(m, f)) == pytest.approx(v, rel=1e-6), (name, f)
