"""Tests of jaxsprint.perf.networks: published counts, spec builders, XLA cost analysis."""
import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsprint.perf import networks as nw


def _s(net):
    return net.summary()


def test_resnet50_matches_published_counts():
    s = _s(nw.resnet50())
    assert s["params"] == 25_557_032
    # "about 4.1 G multiply-accumulates, i.e. about 8.2 GFLOP" (torchvision / v1.5 count).
    assert s["fwd_macs"] == pytest.approx(4.1e9, rel=0.01)
    assert s["fwd_flops"] == pytest.approx(8.2e9, rel=0.02)
    # A MAC is two FLOPs; the remainder is element-wise work (BN, ReLU, pooling, adds).
    conv_dense_flops = 2 * s["fwd_macs"]
    assert conv_dense_flops <= s["fwd_flops"] <= 1.02 * conv_dense_flops + 1e8
    # The original v1 puts the stride on the first 1x1 convolution: fewer MACs, same parameters.
    s1 = _s(nw.resnet50(v1_5=False))
    assert s1["params"] == 25_557_032
    assert s1["fwd_macs"] == pytest.approx(3.86e9, rel=0.01)


@pytest.mark.parametrize("name,params,macs,tol", [
    ("alexnet", 60_965_224, 0.724e9, 0.01),
    ("vgg16", 138_357_544, 15.47e9, 0.01),
    ("googlenet", 6.998e6, 1.58e9, 0.02),
])
def test_zoo_matches_published_counts(name, params, macs, tol):
    s = _s(nw.get(name))
    assert s["params"] == pytest.approx(params, rel=1e-3)
    assert s["fwd_macs"] == pytest.approx(macs, rel=tol)


def test_resnet20_both_shortcuts():
    assert _s(nw.resnet20())["params"] == 272_474          # projection shortcuts (+BN)
    assert _s(nw.resnet20(shortcut="identity"))["params"] == 269_722  # option A: "0.27 M"
    assert _s(nw.resnet20(shortcut="identity"))["fwd_macs"] == pytest.approx(40.55e6, rel=0.01)


@pytest.mark.parametrize("name", sorted(nw.ZOO))
def test_training_costs_about_three_forwards(name):
    s = _s(nw.get(name))
    assert 2.6 < s["train_flops"] / s["fwd_flops"] < 3.2


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


def test_vgg_like_family_by_hand():
    # x0 = 8, channels 3 -> 4 -> 6 (conv, pool 2 each) -> 5 (dense).
    net = nw.vgg_like((3, 4, 6, 5), 2, 8, (2, 2))
    params = (27 * 4 + 4) + (36 * 6 + 6) + (2 * 2 * 6 * 5 + 5)
    macs = 27 * 4 * 64 + 36 * 6 * 16 + 24 * 5
    assert float(net.total_params) == params
    assert float(net.total_fwd_macs) == macs


def test_bad_specs_name_the_field():
    with pytest.raises(nw.NetworkError, match="network='resnet51'.*allowed:.*resnet50"):
        nw.get("resnet51")
    with pytest.raises(nw.NetworkError, match="kind='convv'"):
        nw.from_spec([("convv", 3, 3)], (8, 8, 3))
    with pytest.raises(nw.NetworkError, match="pooling"):
        nw.vgg_like((3, 4, 5), 1, 8, (3,))


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
