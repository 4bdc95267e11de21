"""Mesh, BN group sizes and the multi-process start-up decision."""
import jax
import pytest

from jaxsprint import parallel
from jaxsprint.errors import ConfigError


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
