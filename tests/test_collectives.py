"""Tests of jaxsprint.perf.collectives: alpha-beta all-reduce forms against hand computation."""
import jax
import pytest

from jaxsprint.perf import collectives as col
from perf_util import raises_invalid

M = 100e6        # bytes
ALPHA = 1e-5     # s
BW = 10e9        # bytes/s


def test_ring_by_hand():
    # n = 4: 2 * 3 * 1e-5 + 2 * 3/4 * 1e8 / 1e10 = 6e-5 + 0.015
    assert float(col.ring_allreduce_time_s(M, 4, ALPHA, BW)) == pytest.approx(0.01506, rel=1e-6)
    assert float(col.allreduce_time_s(M, 4, ALPHA, BW, algorithm="ring")) == pytest.approx(0.01506, rel=1e-6)


def test_tree_and_rabenseifner_by_hand():
    # n = 8: log2 = 3 rounds each way.
    assert float(col.tree_allreduce_time_s(M, 8, ALPHA, BW)) == pytest.approx(6 * (1e-5 + 0.01), rel=1e-6)
    assert float(col.rabenseifner_allreduce_time_s(M, 8, ALPHA, BW)) == pytest.approx(
        6e-5 + 2 * 7 / 8 * 0.01, rel=1e-6)
    # n = 5: continuous log2 by default, ceil(log2 5) = 3 rounds when exact.
    assert float(col.tree_allreduce_time_s(M, 5, ALPHA, BW, exact_rounds=True)) == pytest.approx(
        6 * (1e-5 + 0.01), rel=1e-6)


def test_hierarchical_by_hand():
    # 4 nodes x 8 GPUs; intra 1e-6 s and 100 GB/s; inter 2e-6 s and 40 GB/s per node.
    intra = 7 * 1e-6 + 7 / 8 * M / 100e9
    inter = 2 * 3 * 2e-6 + 2 * 3 / 4 * (M / 8) / (40e9 / 8)
    got = col.hierarchical_allreduce_time_s(M, 4, 8, intra_latency_s=1e-6, intra_bandwidth_bytes_per_s=100e9,
                                            inter_latency_s=2e-6, inter_bandwidth_bytes_per_s=40e9)
    assert float(got) == pytest.approx(2 * intra + inter, rel=1e-6)


@pytest.mark.parametrize("algorithm", col.ALGORITHMS)
def test_single_rank_costs_nothing_and_gradients_have_signs(algorithm):
    assert float(col.allreduce_time_s(M, 1, ALPHA, BW, algorithm=algorithm)) == 0.0
    f = lambda n, bw: col.allreduce_time_s(M, n, ALPHA, bw, algorithm=algorithm)  # noqa: E731
    d_n, d_bw = jax.grad(f, argnums=(0, 1))(8.0, BW)
    assert d_n > 0 and d_bw < 0


def test_bus_bandwidth_factor_and_unknown_algorithm():
    assert float(col.bus_bandwidth_factor(8)) == pytest.approx(1.75)
    with raises_invalid("algorithm", "butterfly", "one of ring, tree, rabenseifner"):
        col.allreduce_time_s(M, 4, ALPHA, BW, algorithm="butterfly")
