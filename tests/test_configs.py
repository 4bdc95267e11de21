"""Every shipped config is valid, and the recipes derive the numbers their docstrings state."""
import pytest

from experiments.configs import cifar10_resnet20, default, imagenet_resnet50_lars, testing
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
