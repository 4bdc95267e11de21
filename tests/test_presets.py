"""Tests of jaxsprint.perf.presets: preset round trip and errors, old presets, --machine / --machine_file,
and both measurement layouts turned into the fit's inputs."""
import json
import os

import pytest

from jaxsprint.errors import DataError
from jaxsprint.calibration import host, host_fit, measurements, model_fit
from jaxsprint.perf import presets, zoo
from jaxsprint.perf import machines as mc
from perf_util import raises_invalid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_preset_roundtrip_and_errors(tmp_path):
    m = mc.with_figures(mc.get("cpu"), network_latency_s=7e-5)
    path = tmp_path / "sub" / "machine.json"
    presets.save_preset(str(path), m, compute_cv=0.03, measurements={"steps": []})
    back, data = presets.load_preset(str(path))
    for f in mc.FIELDS:
        assert float(getattr(back, f)) == pytest.approx(float(getattr(m, f)), rel=1e-6)
    assert back.name == "cpu" and data["compute_cv"] == 0.03 and back.sources == m.sources
    missing = str(tmp_path / "missing.json")
    with raises_invalid("machine_file", missing, "(no such file)", DataError):
        presets.load_preset(missing)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "other"}))
    with raises_invalid("machine_file", str(bad), "format 'jaxsprint-machine-1'", DataError):
        presets.load_preset(str(bad))
    data["figures"]["peak_flops_per_s"] = -1.0
    bad.write_text(json.dumps(data))
    with raises_invalid("machine_file", str(bad), "invalid peak_flops_per_s=-1.0", DataError):
        presets.load_preset(str(bad))
    bad.write_text("{not json")
    with raises_invalid("machine_file", str(bad), "a readable JSON machine preset", DataError):
        presets.load_preset(str(bad))


def test_a_runtime_preset_file_is_a_machine_file(tmp_path):
    """experiments/calibrate_runtime.py's --out (every figure of the fitted machine and, in its host section, of its
    host) loads as a --machine_file: the shipped one is the cpu_runtime preset; its measurements are no preset."""
    path = os.path.join(mc.DATA_DIR, "cpu_runtime.json")
    m = presets.load_machine(path=path)
    want = mc.get("cpu_runtime")
    assert m.name == "cpu_runtime"
    for f in mc.FIELDS:
        assert float(getattr(m, f)) == pytest.approx(float(getattr(want, f)), rel=1e-6), f
    h, want_h = host.load_host(m, path=path), host.load_host(m, "cpu_runtime")
    assert float(h.cores_per_node) == 2.0 and h.sources == want_h.sources
    for f in host.FIELDS:
        assert float(getattr(h, f)) == pytest.approx(float(getattr(want_h, f)), rel=1e-6), f
    assert float(host.load_host(mc.get("abci"), "abci").cores_per_node) == 4.0  # no host section: neutral
    bad = tmp_path / "measured_only.json"
    bad.write_text(json.dumps({"format": presets.RUNTIME_CALIBRATION_FORMAT, "measurements": {}}))
    with raises_invalid("machine_file", str(bad), "format 'jaxsprint-machine-1'", DataError):
        presets.load_preset(str(bad))


def test_no_shipped_fitted_figure_sits_on_a_bound():
    """Every figure the shipped runtime calibration fitted has a finite relative standard error and ended inside
    its bounds; the figures its data cannot determine are held (the file's ``fixed``), with the reason as source."""
    with open(os.path.join(mc.DATA_DIR, "cpu_runtime.json")) as fh:
        data = json.load(fh)
    m, h = mc.get("cpu_runtime"), host.load_host(mc.get("cpu_runtime"), "cpu_runtime")
    sources = {**dict(m.sources), **dict(h.sources)}
    value = {**{f: float(getattr(m, f)) for f in mc.FIELDS}, **{f: float(getattr(h, f)) for f in host.FIELDS}}
    assert data["fit"]["at_bound"] == [] and data["fixed"]
    held = data["fit"]["stages"]["fixed"]
    assert set(held) == set(data["fixed"])
    for f, v in data["fixed"].items():
        assert value[f] == pytest.approx(v) and sources[f] == held[f]["reason"] and f not in data["rel_std_error"], f
        assert "not fitted" in sources[f], f
    assert set(data["rel_std_error"]) == set(data["fitted"]) - {"learner_cv", "updater_cv"}
    for f, se in data["rel_std_error"].items():
        assert se is not None and 0 < se < 1e3, f
        # The input's cost per sample is measured (the slope of its draws), the others fitted.
        how = "measured by" if f == host_fit.INPUT_FIELD else "fitted by"
        assert sources[f].startswith(how) and data["command"] in sources[f], f
        lo, hi = host_fit.RUNTIME_BOUNDS.get(f, (0.0, float("inf")))
        assert lo * 1.03 < value[f] < hi / 1.03, f


def test_no_fitted_figure_of_the_shipped_cpu_preset_sits_on_a_bound():
    """The same for the cpu preset (the fit of experiments/calibrate.py's command in its file): every fitted figure
    ended strictly inside the bounds of that command, with a relative standard error below 100% (determined to
    within a factor of 2); the figures its small-CNN set cannot determine are fixed (config.fixed), reason as source."""
    import shlex

    with open(os.path.join(mc.DATA_DIR, "cpu.json")) as fh:
        data = json.load(fh)
    m = mc.get("cpu")
    sources = dict(m.sources)
    args = dict(a.removeprefix("--config.").removeprefix("--").split("=", 1) for a in shlex.split(data["command"])[2:])
    bounds = {f: tuple(map(float, r.split(":"))) for f, r in (b.split("=") for b in args["bounds"].split(","))}
    assert data["calibration"]["compute_fit"]["at_bound"] == [] and data["fitted"]
    assert set(data["rel_std_error"]) == set(data["fitted"]) == set(bounds)  # each fitted figure bounded
    for f in data["fitted"]:
        se, value = data["rel_std_error"][f], float(getattr(m, f))
        assert se is not None and 0 < se < 1, f
        assert data["calibration"]["compute_fit"]["rel_std_error"][f] == pytest.approx(se), f
        # The input's cost per sample is measured (the slope of its draws), the others fitted.
        how = "measured by" if f == host_fit.INPUT_FIELD else "fitted by"
        assert sources[f].startswith(how) and data["command"] in sources[f], f
        lo, hi = bounds[f]
        assert lo * 1.03 < value < hi / 1.03, f
    for f, v in data["fixed"].items():
        assert float(getattr(m, f)) == v and sources[f].startswith("fixed at") and f not in data["rel_std_error"], f


def test_a_preset_missing_a_figure_is_refused_naming_the_figure(tmp_path):
    path = tmp_path / "old.json"
    presets.save_preset(str(path), mc.get("cpu"))
    data = json.loads(path.read_text())
    del data["figures"]["half_efficiency_batch"]
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match="half_efficiency_batch") as e:
        presets.load_preset(str(path))
    assert e.value.field == "machine_file"


def test_load_machine_takes_exactly_one_of_name_and_file(tmp_path):
    path = str(tmp_path / "m.json")
    presets.save_preset(path, mc.with_figures(mc.get("abci"), network_latency_s=3e-5))
    assert float(presets.load_machine(None, path).network_latency_s) == pytest.approx(3e-5)
    assert presets.load_machine("abci").name == "abci"
    with raises_invalid("machine_file", path, "not given together with machine='abci'"):
        presets.load_machine("abci", path)
    with raises_invalid("machine", None, "a preset (tsubame25"):
        presets.load_machine(None, None)
    with raises_invalid("machine", "tsubame3", "one of tsubame25"):
        presets.load_machine("tsubame3")


def test_both_measurement_layouts_become_fit_inputs(tmp_path):
    # The small-CNN calibration set of the cpu preset: 40 plain-SGD steps, no all-reduces.
    small = measurements.load_measurements(os.path.join(ROOT, "docs", "perf-calibration.json"))
    assert len(small["steps"]) == 40 and small["allreduces"] == []
    steps = measurements.step_timings(small["steps"])
    assert all(s.update_passes == 3.0 and s.measured_s > 0 for s in steps)
    first = small["steps"][0]["shape"]
    assert float(steps[0].network.total_params) == float(zoo.small_cnn(
        first["size"], first["widths"], first["pools"], first["bn"]).total_params)
    assert steps[0].sub_batch == first["batch"]
    # A launcher measurement file: momentum-SGD steps of the CIFAR ResNets, and all-reduces; steps of one
    # network share its cost table (one vmapped evaluation in the fit).
    raw = measurements.load_measurements(os.path.join(ROOT, "docs", "perf-search-calibration_measurements.json"))
    steps = measurements.step_timings(raw["steps"])
    assert {s.update_passes for s in steps} == {5.0}
    by_model = {}
    for r, s in zip(raw["steps"], steps):
        by_model.setdefault(r["model"], set()).add(id(s.network))
    assert all(len(ids) == 1 for ids in by_model.values()) and len(by_model) == 4
    ars = measurements.allreduce_timings(raw["allreduces"])
    assert ars and all(isinstance(a, model_fit.AllreduceTiming) and a.ranks >= 2 for a in ars)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"steps": []}))
    with raises_invalid("measurements", str(empty), "holds no measurements", DataError):
        measurements.load_measurements(str(empty))


def test_host_figures_are_validated_and_a_bad_host_section_names_the_file(tmp_path):
    h = host.load_host(mc.get("cpu_runtime"), "cpu_runtime")
    figures = {f: float(getattr(h, f)) for f in host.FIELDS}
    with raises_invalid("cores_per_node", 0.0, "a finite number > 0"):
        host.make_host("h", {}, **{**figures, "cores_per_node": 0.0})
    with raises_invalid("updater_queue", -1.0, "a finite number >= 0"):
        host.make_host("h", {}, **{**figures, "updater_queue": -1.0})
    with raises_invalid("field", "speed", "a host figure: one of cores_per_node"):
        host.with_figures(h, speed=1.0)
    path = tmp_path / "p.json"
    presets.save_preset(str(path), mc.get("cpu"), host=host.host_json(h))
    assert host.load_host(mc.get("cpu"), path=str(path)).sources == h.sources
    data = json.loads(path.read_text())
    del data["host"]["figures"]["learner_cv"]
    path.write_text(json.dumps(data))
    with raises_invalid("machine_file", str(path), "every figure of HostFigures", DataError):
        host.load_host(mc.get("cpu"), path=str(path))


@pytest.mark.parametrize("old", sorted(host.OLD_FORMATS))
def test_a_host_section_of_an_older_form_is_refused_with_the_command_that_refits_it(tmp_path, old):
    """A preset whose host section was fitted under an older cost form is refused (its figures mean something
    else now), naming its format and the command that fits it again; nothing is guessed."""
    with open(os.path.join(ROOT, "jaxsprint", "perf", "data", "cpu_runtime.json")) as f:
        data = json.load(f)
    data["host"]["format"] = old
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    with raises_invalid("machine_file", str(path), f"this one is {old!r}", DataError) as info:
        host.load_host(mc.get("cpu_runtime"), path=str(path))
    assert "--config.calibration.fit_only=True" in info.value.allowed and host.HOST_FORMAT in info.value.allowed


@pytest.mark.parametrize("compatible", host.COMPATIBLE_FORMATS)
def test_a_host_section_of_a_compatible_form_loads_with_the_newer_terms_off(tmp_path, compatible):
    """A host section of a form that the current one extends (its figures mean the same) loads, each figure it
    lacks at its neutral value (the term off) with that source; its own figures are kept."""
    with open(os.path.join(ROOT, "jaxsprint", "perf", "data", "cpu_runtime.json")) as f:
        data = json.load(f)
    data["host"]["format"] = compatible
    del data["host"]["figures"]["learner_shared_wait"]
    path = tmp_path / "compatible.json"
    path.write_text(json.dumps(data))
    h = host.load_host(mc.get("cpu_runtime"), path=str(path))
    assert float(h.learner_shared_wait) == 0.0 and "absent" in dict(h.sources)["learner_shared_wait"]
    assert float(h.updater_apply_core_wait_s) == pytest.approx(data["host"]["figures"]["updater_apply_core_wait_s"])


def test_a_section_without_the_wait_after_a_sleep_keeps_the_wait_it_applied_there(tmp_path):
    """Form 7 applied ``updater_shared_wait`` after the network's sleep too: a section without
    ``updater_shared_sleep_wait`` takes that value (its predictions unchanged where a host has 2+ learners)."""
    with open(os.path.join(ROOT, "jaxsprint", "perf", "data", "cpu_runtime.json")) as f:
        data = json.load(f)
    data["host"]["format"] = "jaxsprint-host-7"
    data["host"]["figures"]["updater_shared_wait"] = 0.123
    del data["host"]["figures"]["updater_shared_sleep_wait"]
    path = tmp_path / "form7.json"
    path.write_text(json.dumps(data))
    h = host.load_host(mc.get("cpu_runtime"), path=str(path))
    assert float(h.updater_shared_sleep_wait) == pytest.approx(0.123)
    assert "updater_shared_wait" in dict(h.sources)["updater_shared_sleep_wait"]
