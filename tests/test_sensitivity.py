"""Tests of jaxsprint.perf.sensitivity: signs and central finite differences of the elasticities, the exact
2x columns, the table, and the error for an unknown figure."""
import math

import pytest

from jaxsprint.perf import machines as mc
from jaxsprint.perf import sensitivity
from jaxsprint.perf import space as sp_lib
from jaxsprint.perf import sprint, zoo
from perf_util import raises_invalid


def test_sensitivities_signs_and_finite_differences():
    sp = sp_lib.make_space(zoo.get("resnet8"), mc.get("tsubame_kfc_dl"))
    fields = ["peak_flops_per_s", "network_bandwidth_bytes_per_s", "network_latency_s",
              "host_memory_bandwidth_bytes_per_s", "efficiency_fwd"]
    n, g, b = 16, 8, 32
    rows = {r.field: r for r in sensitivity.sensitivities(sp, n, g, b, fields)}
    # Signs: faster compute shortens the epoch at a fixed configuration; the network cannot
    # (epoch = N_file T_c / (N b)), but it does at a fixed mini-batch (epoch = N_file T_u / E[B]).
    assert rows["peak_flops_per_s"].fixed_config < -0.1
    assert rows["efficiency_fwd"].fixed_config < 0
    assert abs(rows["network_bandwidth_bytes_per_s"].fixed_config) < 1e-6
    assert rows["network_bandwidth_bytes_per_s"].at_minibatch < -0.01
    assert rows["network_latency_s"].at_minibatch > 0
    assert rows["host_memory_bandwidth_bytes_per_s"].at_minibatch < -0.1
    assert abs(rows["peak_flops_per_s"].at_minibatch) < abs(rows["peak_flops_per_s"].fixed_config)
    # Central finite differences of the model in log space.
    h = 1e-2

    def epoch(machine, nodes):
        return float(sprint.predict(sp.network, machine, nodes, g, b).epoch_time_s)

    def minibatch(machine, nodes):
        return float(sprint.predict(sp.network, machine, nodes, g, b).mean_minibatch)

    m0 = sp.machine
    for f in fields:
        v = float(getattr(m0, f))
        up, dn = mc.with_figures(m0, **{f: v * math.exp(h)}), mc.with_figures(m0, **{f: v * math.exp(-h)})
        fd = (math.log(epoch(up, n)) - math.log(epoch(dn, n))) / (2 * h)
        assert rows[f].fixed_config == pytest.approx(fd, rel=2e-2, abs=2e-3), f
        # Mini-batch kept: move n (continuous) so that E[B] is unchanged (B is linear in n up to
        # the slow growth of T_u, so one secant step per side is exact enough).
        target_b = minibatch(m0, n)

        def n_at(machine):
            nn = float(n)
            for _ in range(6):
                nn *= target_b / minibatch(machine, nn)
            return nn

        fd_at = (math.log(epoch(up, n_at(up))) - math.log(epoch(dn, n_at(dn)))) / (2 * h)
        assert rows[f].at_minibatch == pytest.approx(fd_at, rel=3e-2, abs=2e-3), f
    # The 2x columns are exact recomputations.
    r = rows["peak_flops_per_s"]
    two = mc.with_figures(m0, peak_flops_per_s=2 * float(m0.peak_flops_per_s))
    assert r.double_fixed == pytest.approx(epoch(two, n) / epoch(m0, n) - 1, rel=1e-3)
    assert "peak_flops_per_s" in sensitivity.sensitivity_table(list(rows.values()))


def test_unknown_figure_names_the_field():
    sp = sp_lib.make_space(zoo.get("resnet8"), mc.get("abci"))
    with raises_invalid("field", "speed", "a machine figure: one of peak_flops_per_s"):
        sensitivity.sensitivities(sp, 1, 1, 8, ["speed"])
