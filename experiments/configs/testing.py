r"""A few seconds: the tiny model on digits at 8x8, 8 devices, 6 steps with eval and a checkpoint.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/train.py \
      --config=experiments/configs/testing.py --workdir=/tmp/jaxsprint_testing
"""
from experiments.configs import default


def get_config():
    c = default.get_config()
    c.image_size = 8
    c.model = "tiny"
    c.batch_size = 64
    c.eval_batch_size = 64
    c.num_train_steps = 6
    c.lr.warmup_epochs = 0.0
    c.lr.base = 0.5
    c.log_every_steps = 2
    c.eval_every_epochs = 0.1   # every 2 steps at 23 steps per epoch
    c.checkpoint_every_epochs = 0.2
    c.progress_bar = False
    return c
