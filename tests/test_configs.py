"""Every shipped config is valid, loads and locks, and the recipes derive the numbers their docstrings state."""
import importlib
import json
import os

import ml_collections
import pytest
from absl import flags
from ml_collections import config_flags

from experiments.configs import cifar10_resnet20, default, imagenet_resnet50_lars, plan, testing, validate_model
from jaxsprint.train import optim, trainer


@pytest.mark.parametrize("module", [default, testing, cifar10_resnet20, imagenet_resnet50_lars])
def test_configs_validate(module):
    c = module.get_config()
    if c.dataset != "digits":
        c.data_dir = "/some/tfds/dir"
    trainer.validate_config(c, c.num_devices if c.num_devices > 0 else 8)


def test_imagenet_recipe_numbers():
    c = imagenet_resnet50_lars.get_config("8")
    hp = optim.derive_hparams(c, 1_281_167)
    assert hp.global_batch == 81_920 and hp.steps_per_epoch == 15  # 15 updates per epoch, as in the record
    assert hp.accum_steps == 256 and hp.micro_batch // 8 == 40    # ghost BN of 40 images per device
    c2048 = imagenet_resnet50_lars.get_config("2048")
    assert optim.derive_hparams(c2048, 1_281_167).accum_steps == 1
    assert hp.warmup_steps == 36 * 15 and hp.total_steps == 90 * 15


def test_demo_is_large_batch_relative_to_data():
    c = default.get_config()
    hp = optim.derive_hparams(c, 1500)
    assert hp.global_batch >= 1500 / 4 and hp.steps_per_epoch <= 4


_CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "configs")
ALL = sorted(f[:-3] for f in os.listdir(_CONFIG_DIR) if f.endswith(".py") and f != "__init__.py")


@pytest.mark.parametrize("name", ALL)
def test_every_config_file_loads_locks_and_says_how_to_run_it(name):
    """Each file loads as its launcher loads it (ml_collections' config flag, locked), refuses a field it does
    not have, and its docstring shows the command that runs it."""
    module = importlib.import_module(f"experiments.configs.{name}")
    assert f"experiments/configs/{name}.py" in module.__doc__ and "python experiments/" in module.__doc__
    holder = flags.FlagValues()
    config_flags.DEFINE_config_file("config", os.path.join(_CONFIG_DIR, f"{name}.py"), "", flag_values=holder,
                                    lock_config=True)
    holder(["test"])
    c = holder.config
    assert isinstance(c, ml_collections.ConfigDict) and c.is_locked and len(c) > 0
    with pytest.raises(AttributeError):
        c.no_such_field = 1
    assert set(json.loads(c.to_json_best_effort())) == set(c.keys())  # what a run writes as its config.json


@pytest.mark.parametrize("module", [plan, validate_model])
def test_the_experiment_configs_lock_themselves(module):
    """The configs built without a base (the launchers' defaults) are locked as get_config returns them."""
    c = module.get_config()
    assert c.is_locked
    with pytest.raises(AttributeError):
        c.no_such_field = 1
