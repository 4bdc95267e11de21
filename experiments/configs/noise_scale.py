r"""The gradient noise scale of ResNet-8 on the built-in digits: 8 devices, global batch 128, 30 epochs.

Each device's gradient (16 examples) is a small batch, the all-reduced one (128) the big one
(jaxsprint.train.noise). Momentum SGD with linear scaling and one warmup epoch; ghost BN per device (the
measurement needs devices that do not share BN statistics). About 1-2 minutes on a 2-core CPU.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/noise_scale.py \
      --config=experiments/configs/noise_scale.py --workdir=/tmp/jaxsprint_noise

For MNIST at 28x28 (5,000 images): --config.dataset=mnist5k --config.image_size=28.
"""
from experiments.configs import default


def get_config():
    c = default.get_config()
    c.model = "resnet8"
    c.image_size = 16
    c.batch_size = 128
    c.eval_batch_size = 512
    c.num_epochs = 30
    c.optimizer.name = "sgd"
    c.optimizer.momentum = 0.9
    c.optimizer.weight_decay = 5e-4
    c.lr.base = 0.2                 # at reference_batch 256: 0.1 at batch 128
    c.lr.warmup_epochs = 1.0
    c.lr.schedule = "cosine"
    c.augment.kind = "pad_crop"
    c.bn.reduction = "per_device"
    c.noise_scale.enabled = True
    c.noise_scale.num_windows = 6
    c.eval_every_epochs = 5.0
    c.checkpoint_every_epochs = 0.0
    c.keep_checkpoints = 1
    c.log_every_steps = 20
    c.progress_bar = False
    return c
