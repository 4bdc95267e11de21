r"""The Final Polishing study on the built-in digits: global batch x polish mode x seed.

Every cell trains ResNet-8 (ghost BN per device, LARS, linear scaling, 5 warmup epochs) for the same number
of epochs. Modes "none" and "recompute" share one training run (recompute only changes the statistics after
training, and "none" reproduces the unpolished run exactly, as tested), and so do "no_augment_epochs" and
"both". About 15-25 minutes on a 2-core CPU.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/study_polish.py \
      --config=experiments/configs/polish_study.py --out=docs/polish-study
"""
import ml_collections

from experiments.configs import default


def get_config():
    c = default.get_config()
    c.model = "resnet8"
    c.image_size = 16
    c.num_epochs = 20
    c.lr.warmup_epochs = 5.0
    c.augment.kind = "rrc"
    c.augment.area_range = (0.25, 1.0)
    c.polish.num_samples = -1           # the whole (small) training set
    c.polish.no_augment_epochs = 2.0    # 10% of training (Fujitsu: 5 of 90 epochs)
    c.eval_every_epochs = 0.0           # evaluate at the end only
    c.checkpoint_every_epochs = 0.0
    c.keep_checkpoints = 1
    c.progress_bar = False
    c.log_every_steps = 50
    c.study = ml_collections.ConfigDict()
    c.study.batch_sizes = (64, 128, 256, 512, 1024)
    c.study.seeds = (0, 1, 2)
    return c
