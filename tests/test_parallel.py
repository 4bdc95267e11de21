"""Mesh, BN group sizes and the checks of the parallel layout (several processes: tests/test_multihost.py)."""

import jax
import pytest
from jax.sharding import AxisType

from config_util import CONFIG_MODULES, default_with
from jaxsprint.train import parallel
from jaxsprint.errors import ConfigError


@pytest.mark.devices(8)
def test_mesh_uses_all_devices_or_a_prefix():
    mesh = parallel.make_mesh(-1)
    assert mesh.size == jax.device_count() == 8 and list(mesh.devices) == jax.devices()
    assert mesh.axis_types == (AxisType.Auto,)  # sharding propagation as with Mesh(devices, axes)
    assert list(parallel.make_mesh(2).devices) == jax.devices()[:2]
    for bad in (0, 9, 2.0, -2):
        with pytest.raises(ConfigError, match=r"config.num_devices.*multiple of the process count \(1\) in 1..8"):
            parallel.make_mesh(bad)


def test_bn_group_sizes():
    assert parallel.bn_group_size("global", micro_batch=256, num_devices=8) is None
    assert parallel.bn_group_size("per_device", micro_batch=256, num_devices=8) == 32
    assert parallel.bn_group_size("group", micro_batch=256, num_devices=8, group_size=16) == 16
    with pytest.raises(ConfigError, match="config.bn.group_size"):
        parallel.bn_group_size("group", micro_batch=256, num_devices=8, group_size=24)
    with pytest.raises(ConfigError, match="config.bn.reduction"):
        parallel.bn_group_size("sync", micro_batch=256, num_devices=8)


_with = default_with


@pytest.mark.parametrize("module", CONFIG_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_shipped_config_passes(module):
    c = module.get_config()
    parallel.validate_config(c, c.num_devices if c.num_devices > 0 else 8, num_hosts=1)


@pytest.mark.parametrize("overrides, devices, hosts, field", [
    ({"num_devices": 0}, 8, 1, "num_devices"),
    ({"num_devices": -2}, 8, 1, "num_devices"),
    ({"num_devices": 4}, 8, 1, "num_devices"),          # not the mesh the run uses
    ({"num_devices": 2.0}, 2, 1, "num_devices"),
    ({"batch_size": 0}, 8, 1, "batch_size"),
    ({"batch_size": -512}, 8, 1, "batch_size"),
    ({"batch_size": 512.0}, 8, 1, "batch_size"),
    ({"batch_size": 60}, 8, 1, "batch_size"),           # not divisible by the devices
    ({"grad_accum_steps": 3}, 8, 1, "batch_size"),      # 512 % (8 x 3)
    ({"grad_accum_steps": 0}, 8, 1, "grad_accum_steps"),
    ({"grad_accum_steps": -1}, 8, 1, "grad_accum_steps"),
    ({"batch_size": 6, "eval_batch_size": 6}, 2, 4, "batch_size"),  # not divisible by the hosts
    ({"eval_batch_size": 0}, 8, 1, "eval_batch_size"),
    ({"eval_batch_size": 100}, 8, 1, "eval_batch_size"),
    ({"eval_batch_size": 6}, 2, 4, "eval_batch_size"),
    ({"bn.reduction": "sync"}, 8, 1, "bn.reduction"),
    ({"bn.reduction": "group", "bn.group_size": 0}, 8, 1, "bn.group_size"),
    ({"bn.reduction": "group", "bn.group_size": 24}, 8, 1, "bn.group_size"),  # per-device micro-batch 64
    ({"bn.reduction": "group", "bn.group_size": 32, "grad_accum_steps": 4}, 8, 1, "bn.group_size"),  # 16
    ({"bn.group_size": -1}, 8, 1, "bn.group_size"),
    ({"bn.group_size": 1.5}, 8, 1, "bn.group_size"),
])
def test_each_bad_value_names_its_field(overrides, devices, hosts, field):
    with pytest.raises(ConfigError, match=rf"^invalid config\.{field}=") as e:
        parallel.validate_config(_with(**overrides), devices, num_hosts=hosts)
    assert e.value.field == f"config.{field}"


def test_layouts_that_are_allowed():
    parallel.validate_config(_with(), 8)  # the host count defaults to this process's
    parallel.validate_config(_with(**{"num_devices": 2}), 2, num_hosts=2)
    parallel.validate_config(_with(**{"bn.reduction": "group", "bn.group_size": 16, "grad_accum_steps": 4}), 8,
                             num_hosts=1)
    parallel.validate_config(_with(**{"bn.reduction": "global", "bn.group_size": 7}), 8, num_hosts=1)
