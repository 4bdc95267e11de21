"""Mesh, BN group sizes, the checks of the parallel layout and the multi-process start-up decision."""

import jax
import pytest

from config_util import CONFIG_MODULES, default_with
from jaxsprint.train import parallel
from jaxsprint.errors import ConfigError


@pytest.mark.devices(8)
def test_mesh_uses_all_devices_or_a_prefix():
    assert parallel.make_mesh(-1).size == jax.device_count() == 8
    assert parallel.make_mesh(2).size == 2
    with pytest.raises(ConfigError, match="config.num_devices"):
        parallel.make_mesh(9)


def test_bn_group_sizes():
    assert parallel.bn_group_size("global", micro_batch=256, num_devices=8) is None
    assert parallel.bn_group_size("per_device", micro_batch=256, num_devices=8) == 32
    assert parallel.bn_group_size("group", micro_batch=256, num_devices=8, group_size=16) == 16
    with pytest.raises(ConfigError, match="config.bn.group_size"):
        parallel.bn_group_size("group", micro_batch=256, num_devices=8, group_size=24)
    with pytest.raises(ConfigError, match="config.bn.reduction"):
        parallel.bn_group_size("sync", micro_batch=256, num_devices=8)


def test_distributed_init_decision():
    assert parallel.distributed_init_kwargs({}) is None
    assert parallel.distributed_init_kwargs({"SLURM_NTASKS": "1"}) is None
    assert parallel.distributed_init_kwargs({"SLURM_NTASKS": "4"}) == {}
    assert parallel.distributed_init_kwargs({"JAX_COORDINATOR_ADDRESS": "h:1234"}) == {}
    assert parallel.distributed_init_kwargs({}, coordinator_address="h:1", num_processes=2, process_id=1) == dict(
        coordinator_address="h:1", num_processes=2, process_id=1)
    with pytest.raises(ConfigError, match="process_id"):
        parallel.distributed_init_kwargs({}, coordinator_address="h:1", num_processes=2, process_id=2)
    with pytest.raises(ConfigError):
        parallel.distributed_init_kwargs({}, coordinator_address="h:1")




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
