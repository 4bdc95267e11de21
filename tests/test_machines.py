"""Tests of jaxsprint.perf.machines: every figure of every preset says where it comes from, figures are
validated, and the cpu preset's fitted figures name the command and the stored file that produce them."""
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
    assert len(fitted) == 9  # the --fit_fields of the command
    args = dict(a[2:].split("=", 1) for a in shlex.split(mc.CPU_CALIBRATION_COMMAND)[2:])
    assert set(args["fit_fields"].split(",")) == set(fitted)
    assert os.path.exists(os.path.join(ROOT, args["measurements"]))
    assert "efficiency_fwd" in sources["efficiency_bwd_data"]  # tied
    for f, v in mc.CPU_CALIBRATION.items():
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
