r"""The asynchronous-SGD study on the built-in digits: mean staleness x distribution x mitigation x seed.

Each cell trains ResNet-8 at 8x8 on one device with SGD + momentum (the staleness-aware learning rate is
only a learning-rate change for optimizers linear in the gradient, so not LARS) through the delayed-gradient
emulator. A run that diverges (NaN/Inf) is recorded as diverged at its step. About 20-30 minutes on 2 cores.

  python experiments/study_async.py --config=experiments/configs/async_study.py --out=docs/async-study
"""
import ml_collections

from experiments.configs import default


def get_config():
    c = default.get_config()
    c.num_devices = 1
    c.model = "resnet8"
    c.image_size = 8
    c.augment.kind = "pad_crop"
    c.augment.pad = 1
    c.bn.reduction = "global"
    c.batch_size = 64
    c.eval_batch_size = 297
    c.num_train_steps = 160           # ~7 epochs of 23 updates
    c.lr.base = 0.8                   # peak 0.2 at batch 64: well tuned for synchronous SGD here
    c.lr.warmup_epochs = 0.0
    c.lr.schedule = "cosine"
    c.optimizer.name = "sgd"
    c.optimizer.momentum = 0.9
    c.optimizer.weight_decay = 5e-4
    c.label_smoothing = 0.0
    c.eval_every_epochs = 0.0
    c.checkpoint_every_epochs = 0.0
    c.keep_checkpoints = 1
    c.progress_bar = False
    c.log_every_steps = 10
    c.async_emulation.enabled = True
    c.async_emulation.dc_lambda = 0.04
    c.study = ml_collections.ConfigDict()
    c.study.mean_staleness = (0, 1, 2, 4, 8, 16)
    c.study.kinds = ("constant", "geometric")
    c.study.mitigations = ("none", "staleness_lr", "dc_asgd")
    c.study.seeds = (0, 1, 2)
    return c
