"""Tests of jaxsprint.perf.zoo: published parameter and MAC counts, the families by hand, the calibration
family against its flax model, lookup errors."""
import flax.linen as nn
import jax.numpy as jnp
import pytest

from jaxsprint.perf import networks as nw
from jaxsprint.perf import zoo
from perf_util import raises_invalid


def _s(net):
    return net.summary()


def test_resnet50_matches_published_counts():
    s = _s(zoo.resnet50())
    assert s["params"] == 25_557_032
    # "about 4.1 G multiply-accumulates, i.e. about 8.2 GFLOP" (torchvision / v1.5 count).
    assert s["fwd_macs"] == pytest.approx(4.1e9, rel=0.01)
    assert s["fwd_flops"] == pytest.approx(8.2e9, rel=0.02)
    # A MAC is two FLOPs; the remainder is element-wise work (BN, ReLU, pooling, adds).
    conv_dense_flops = 2 * s["fwd_macs"]
    assert conv_dense_flops <= s["fwd_flops"] <= 1.02 * conv_dense_flops + 1e8
    # The original v1 puts the stride on the first 1x1 convolution: fewer MACs, same parameters.
    s1 = _s(zoo.resnet50(v1_5=False))
    assert s1["params"] == 25_557_032
    assert s1["fwd_macs"] == pytest.approx(3.86e9, rel=0.01)


@pytest.mark.parametrize("name,params,macs,tol", [
    ("alexnet", 60_965_224, 0.724e9, 0.01),
    ("vgg16", 138_357_544, 15.47e9, 0.01),
    ("googlenet", 6.998e6, 1.58e9, 0.02),
])
def test_zoo_matches_published_counts(name, params, macs, tol):
    s = _s(zoo.get(name))
    assert s["params"] == pytest.approx(params, rel=1e-3)
    assert s["fwd_macs"] == pytest.approx(macs, rel=tol)


def test_resnet20_both_shortcuts():
    assert _s(zoo.resnet20())["params"] == 272_474          # projection shortcuts (+BN)
    assert _s(zoo.resnet20(shortcut="identity"))["params"] == 269_722  # option A: "0.27 M"
    assert _s(zoo.resnet20(shortcut="identity"))["fwd_macs"] == pytest.approx(40.55e6, rel=0.01)


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_training_costs_about_three_forwards(name):
    s = _s(zoo.get(name))
    assert 2.6 < s["train_flops"] / s["fwd_flops"] < 3.2


def test_vgg_like_family_by_hand():
    # x0 = 8, channels 3 -> 4 -> 6 (conv, pool 2 each) -> 5 (dense).
    net = zoo.vgg_like((3, 4, 6, 5), 2, 8, (2, 2))
    params = (27 * 4 + 4) + (36 * 6 + 6) + (2 * 2 * 6 * 5 + 5)
    macs = 27 * 4 * 64 + 36 * 6 * 16 + 24 * 5
    assert float(net.total_params) == params
    assert float(net.total_fwd_macs) == macs


def test_unknown_names_and_bad_families_name_the_field():
    with raises_invalid("network", "resnet51", "one of alexnet"):
        zoo.get("resnet51")
    with raises_invalid("pooling", (3,), "1 entries (num_conv), each 1 or 2"):
        zoo.vgg_like((3, 4, 5), 1, 8, (3,))
    with raises_invalid("num_conv", 3, "1..2"):
        zoo.vgg_like((3, 4, 5), 3, 8, (2, 2, 2))
    with raises_invalid("shortcut", "dense", "one of projection, identity"):
        zoo.resnet_cifar(1, shortcut="dense")
    with raises_invalid("pools", (True,), "2 entries, one per width"):
        zoo.small_cnn(16, (8, 16), (True,), False)


class _SmallCNN(nn.Module):
    """The flax model the small-CNN calibration set was measured on (conv3x3 [+BN] + ReLU [+ max pool])."""

    widths: tuple
    pools: tuple
    bn: bool

    @nn.compact
    def __call__(self, x):
        for w, p in zip(self.widths, self.pools):
            x = nn.Conv(w, (3, 3), padding="SAME", use_bias=not self.bn)(x)
            if self.bn:
                x = nn.BatchNorm(use_running_average=False)(x)
            x = nn.relu(x)
            if p:
                x = nn.max_pool(x, (2, 2), (2, 2))
        return nn.Dense(10)(jnp.mean(x, axis=(1, 2)))


@pytest.mark.parametrize("bn", [False, True])
def test_small_cnn_matches_its_flax_model(bn):
    import jax

    widths, pools = (8, 8, 16), (False, True, False)
    net = zoo.small_cnn(24, widths, pools, bn)
    variables = _SmallCNN(widths, pools, bn).init(jax.random.PRNGKey(0), jnp.zeros((1, 24, 24, 3)))
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(variables["params"]))
    assert float(net.total_params) == n_params
    # Forward MACs by hand: 3x3 convs at 24, 24 and 12 pixels, and the classifier.
    macs = 9 * 3 * 8 * 24 * 24 + 9 * 8 * 8 * 24 * 24 + 9 * 8 * 16 * 12 * 12 + 16 * 10
    assert float(net.total_fwd_macs) == macs
    assert (nw.KINDS.index("norm") in set(net.kind.tolist())) == bn
