r"""The demo: large-batch LARS training of ResNet-20 on the built-in digits, data-parallel over 8 devices.

1,500 training images, global batch 512 (a third of the data per update: "large" relative to the data),
LARS with linear scaling and warmup, ghost BN per device. About 2-3 minutes on a 2-core laptop CPU.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/train.py \
      --config=experiments/configs/default.py --workdir=/tmp/jaxsprint_demo
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0

    # Data.
    c.dataset = "digits"            # "digits" (built in) or a TFDS image dataset name read from data_dir
    c.data_dir = ml_collections.config_dict.placeholder(str)  # TFDS data dir (ArrayRecord); unused for digits
    c.train_split = "train"
    c.test_split = "test"
    c.image_size = 16               # digits are resized from 8x8 to this
    c.augment = ml_collections.ConfigDict()
    c.augment.kind = "rrc"          # "rrc" random-resized-crop, "pad_crop", or "none"
    c.augment.area_range = (0.35, 1.0)
    c.augment.aspect_range = (3 / 4, 4 / 3)
    c.augment.pad = 2               # for pad_crop
    c.augment.flip = False          # digits are not mirror-symmetric
    c.augment.eval_crop_fraction = 0.875  # for variable-size TFDS images (ImageNet: 224 from 256)

    # Model.
    c.model = "resnet20"
    c.dtype = "float32"             # compute dtype: float32 or bfloat16
    c.zero_init_last_bn = True
    c.cpu_kernels = "auto"          # "auto", "off" or "require": the CPU acceleration (jaxsprint/cpu)
    c.bn = ml_collections.ConfigDict()
    c.bn.momentum = 0.9
    c.bn.epsilon = 1e-5
    c.bn.reduction = "per_device"   # "global" (sync BN), "per_device" (ghost BN) or "group"
    c.bn.group_size = 0             # examples per group for reduction="group"

    # Parallelism and batch.
    c.num_devices = -1              # -1: every device (8 fake CPU devices in the demo)
    c.batch_size = 512              # global batch, all devices
    c.eval_batch_size = 512
    c.grad_accum_steps = 1          # micro-batches per update (batch_size / grad_accum_steps per pass)

    # Schedule (derived values are computed in jaxsprint.train.optim.derive_hparams).
    c.num_epochs = 40
    c.num_train_steps = -1          # > 0 overrides num_epochs
    c.lr = ml_collections.ConfigDict()
    c.lr.base = 1.0                 # at reference_batch; peak = base * batch_size / reference_batch
    c.lr.scaling = "linear"         # "linear" or "none"
    c.lr.reference_batch = 256
    c.lr.warmup_epochs = 5.0
    c.lr.warmup_init = 0.0          # warmup starts at this fraction of the peak
    c.lr.schedule = "poly"          # "poly", "cosine" or "constant"
    c.lr.poly_power = 2.0
    c.lr.end_lr = 0.0

    # Optimizer.
    c.optimizer = ml_collections.ConfigDict()
    c.optimizer.name = "lars"       # "sgd", "nesterov", "lars" or "lamb"
    c.optimizer.momentum = 0.9
    c.optimizer.weight_decay = 5e-4
    c.optimizer.lars_trust_coefficient = 0.001
    c.optimizer.lars_eps = 0.0
    c.optimizer.lars_nesterov = False
    c.optimizer.lamb_b1 = 0.9
    c.optimizer.lamb_b2 = 0.999
    c.optimizer.lamb_eps = 1e-6
    c.label_smoothing = 0.1

    # Final Polishing (jaxsprint.train.polish): "none", "recompute" (pure BN-statistics pass after training),
    # "no_augment_epochs" (the last k epochs read un-augmented training images, Fujitsu's form) or "both".
    c.polish = ml_collections.ConfigDict()
    c.polish.mode = "none"
    c.polish.num_samples = 10_000   # budget of the recompute pass (-1: the whole training set)
    c.polish.batch_size = 0         # global batch of the pass (0: eval_batch_size)
    c.polish.num_passes = 0         # 0: until converged (exact; see jaxsprint/train/polish.py), k: exactly k
    c.polish.no_augment_epochs = 5.0  # k (epochs; fractions allowed) for "no_augment_epochs" and "both"

    # Asynchronous-SGD emulation (jaxsprint.emulation.staleness): delayed gradients and random mini-batch sizes.
    c.async_emulation = ml_collections.ConfigDict()
    c.async_emulation.enabled = False
    c.async_emulation.max_staleness = 0      # ring-buffer depth - 1
    c.async_emulation.sampler = "constant"   # "constant", "uniform", "geometric", "pmf" or "perf_model"
    c.async_emulation.staleness = 0          # constant tau, or max of uniform
    c.async_emulation.mean_staleness = 1.0   # geometric mean
    c.async_emulation.pmf = ()               # explicit pmf over tau = 0..len-1 for "pmf"
    c.async_emulation.mitigation = "none"    # "none", "staleness_lr", "dc_asgd" or "staleness_lr+dc_asgd"
    c.async_emulation.dc_lambda = 0.04
    c.async_emulation.num_sub_batches = 0    # > 0: each update uses K of this many sub-batches
    c.async_emulation.k_pmf = ()             # pmf over K = 0..num_sub_batches (k_pmf[0] = 0)
    # For sampler="perf_model" (and k_pmf from the model when k_pmf is empty and num_sub_batches > 0): the
    # SPRINT model's predicted distributions for a cluster given by timings (see experiments/predict.py).
    c.async_emulation.workers = 8
    c.async_emulation.t_compute_s = 0.1
    c.async_emulation.t_compute_cv = 0.05
    c.async_emulation.t_update_s = 0.05

    # The gradient noise scale B_simple = tr(Sigma) / |G|^2 (jaxsprint.train.noise; McCandlish et al. 2018) from
    # the per-device gradients of every step; logged as noise_b_simple, summarised by progress in summary.json.
    c.noise_scale = ml_collections.ConfigDict()
    c.noise_scale.enabled = False   # needs devices x grad_accum_steps >= 2 and no synchronised BN across devices
    c.noise_scale.ema_decay = 0.95  # smoothing of |G|^2 and tr(Sigma) for the logged ratio
    c.noise_scale.num_windows = 8   # summary.json: B_simple (+- its standard error) over this many spans of steps

    # Loop.
    c.log_every_steps = 10
    c.stop_at_accuracy = 0.0        # > 0: end once the top-1 (mean of the last stop_evals evaluations) reaches it
    c.stop_evals = 1
    c.eval_every_epochs = 10.0
    c.checkpoint_every_epochs = 20.0
    c.keep_checkpoints = 2
    c.resume = "latest"             # "latest", or "latest_good": skip checkpoints that cannot be read
    # Fields that may differ from the config.json of the run being resumed, e.g. "lr.base,num_epochs" (a
    # group such as "lr" covers its fields); the others must match (jaxsprint/train/run_config.py).
    c.resume_allow_changes = ()
    c.profile_steps = ()            # a,b: jax.profiler trace of the updates a..b-1 (from 0) into WORKDIR/profile
    c.progress_bar = True
    return c
