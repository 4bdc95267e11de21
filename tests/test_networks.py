"""Tests of jaxsprint.perf.networks: the FLOP formula by hand, spec builders, row merging, XLA cost analysis,
and errors that name the field."""
import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsprint.perf import networks as nw
from perf_util import raises_invalid


def _s(net):
    return net.summary()


def test_conv_flops_formula_by_hand():
    # 3x3 conv, 16 -> 16 channels, 32x32, stride 1: 2 * 9 * 16 * 16 * 1024 FLOPs per sample.
    assert nw.conv_flops(32, 32, 16, 16, 3) == 2 * 9 * 16 * 16 * 32 * 32
    net = nw.from_spec([("conv", 16, 3)], (32, 32, 16))
    assert float(net.total_fwd_flops) == 2 * 9 * 16 * 16 * 32 * 32
    assert float(net.total_fwd_macs) == 9 * 16 * 16 * 32 * 32
    assert float(net.total_params) == 9 * 16 * 16


def test_from_spec_equals_builder_and_merging_keeps_totals():
    spec = [("conv", 8, 3), ("bn",), ("relu",), ("maxpool", 2), ("conv", 8, 3), ("relu",),
            ("conv", 8, 3), ("relu",), ("gap",), ("dense", 10)]
    a = nw.from_spec(spec, (16, 16, 3))
    b = nw.Builder((16, 16, 3))
    b.conv(8, 3).bn().relu().pool(2).conv(8, 3).relu().conv(8, 3).relu().global_avg_pool().dense(10)
    unmerged = nw.network_from_layers(b.layers, (16, 16, 3), merge=False)
    assert len(unmerged.layer_names) > len(a.layer_names)  # the two 8->8 convs share a row
    for key in ("params", "fwd_macs", "fwd_flops", "train_flops", "activation_elems"):
        assert _s(a)[key] == pytest.approx(_s(unmerged)[key], rel=1e-6)


def test_bad_specs_name_the_field():
    with raises_invalid("spec[0] kind", "convv", "one of conv, dense"):
        nw.from_spec([("convv", 3, 3)], (8, 8, 3))
    with raises_invalid("spec[1]", (), "a tuple (kind, *args)"):
        nw.from_spec([("relu",), ()], (8, 8, 3))
    with raises_invalid("kernel", 11, "at most the padded input size 8"):
        nw.from_spec([("conv", 4, 11, {"padding": "valid"})], (8, 8, 3))
    with raises_invalid("groups", 2, "a divisor of both channel counts 3 and 4"):
        nw.Builder((8, 8, 3)).conv(4, 3, groups=2)
    with raises_invalid("padding", "full", "'same', 'valid' or an int >= 0"):
        nw.Builder((8, 8, 3)).conv(4, 3, padding="full")
    with raises_invalid("layers[0].kind", "lstm", "one of conv, dense"):
        nw.network_from_layers([nw.LayerCost("x", "lstm", 0, 0, 0, 0, 0, 0, 0, 0)], (1,))
    b = nw.Builder((8, 8, 3))
    other = b.fork().conv(4, 3)
    with raises_invalid("add branch shape", (8, 8, 4), "the main branch's (8, 8, 3)"):
        b.add(other)


class _TinyCNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3), padding="SAME")(x))
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(10)(x)


def test_from_flax_reads_xla_cost_analysis():
    net = nw.from_flax(_TinyCNN(), (16, 16, 3))
    spec = nw.from_spec([("conv", 8, 3, {"bias": True}), ("relu",), ("gap",), ("dense", 10)],
                        (16, 16, 3))
    assert float(net.total_params) == float(spec.total_params) == 3 * 3 * 3 * 8 + 8 + 8 * 10 + 10
    # XLA counts 2 FLOPs per multiply-add: the forward FLOPs per sample agree with the spec.
    assert float(net.total_fwd_flops) == pytest.approx(float(spec.total_fwd_flops), rel=0.15)
    assert float(net.total_bwd_flops) > float(net.total_fwd_flops)
    assert np.all(np.asarray(net.kind) == nw.KINDS.index("xla"))
