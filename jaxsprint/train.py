"""Training: TrainState, pure step factories, and `train_and_evaluate(config, workdir)`.

A step is one optimizer update on one global batch, sharded along ``data``. With ``grad_accum_steps = k`` the
step scans over k micro-batches (each device contributes its own i-th slice to micro-batch i, so no data
moves), sums their gradients and applies one update: the same update as one pass over the k-times larger
batch when BatchNorm statistics are global per micro-batch or absent.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any, Callable, Iterator

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxsprint import data as data_lib
from jaxsprint import models, optim, parallel, polish, staleness
from jaxsprint.errors import ConfigError, NonFiniteError


class TrainState(train_state.TrainState):
    """flax's TrainState plus the BatchNorm running statistics."""

    batch_stats: Any = None


def create_train_state(key: jax.Array, model, tx: optax.GradientTransformation,
                       input_shape: tuple[int, ...]) -> TrainState:
    variables = model.init(key, jnp.zeros(input_shape, jnp.float32), train=False)
    return TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx,
                             batch_stats=variables.get("batch_stats", {}))


def _micro_batches(x: jax.Array, k: int, num_shards: int) -> jax.Array:
    """[B, ...] -> [k, B/k, ...] where micro-batch i takes the i-th local chunk of every shard."""
    if k == 1:
        return x[None]
    b = x.shape[0]
    m = b // (num_shards * k)
    y = x.reshape((num_shards, k, m) + x.shape[1:])
    return jnp.swapaxes(y, 0, 1).reshape((k, num_shards * m) + x.shape[1:])


def make_train_step(*, model, num_classes: int, label_smoothing: float = 0.0, accum_steps: int = 1,
                    num_shards: int = 1, mesh: Mesh | None = None,
                    grad_transform: Callable | None = None, unroll_accum: int = 8) -> Callable:
    """Builds ``step(state, images, labels, weights=None) -> (state, metrics)``; pure, jit it once.

    Args:
      model: flax module taking ``(x, train=..., mask=...)``.
      num_classes: number of logits.
      label_smoothing: s in (1 - s) * onehot + s / num_classes.
      accum_steps: micro-batches per update (k); gradients are averaged over them.
      num_shards: devices along ``data`` (for the locality-preserving micro-batch split).
      mesh: if given, micro-batches are constrained to stay sharded along ``data``.
      grad_transform: optional ``(grads, state) -> grads`` applied before the optimizer (for experiments).
      unroll_accum: up to this many micro-batches are unrolled in the program (longer compile, but XLA:CPU
        runs convolutions in a loop body 6-40x slower); more are a ``lax.scan`` (constant program size).

    The loss is the weighted mean sum_i w_i CE_i / sum_i w_i over the global batch with per-example weights
    `weights` (default 1; the asynchronous emulator's random mini-batch uses them), so accumulation and
    weighting stay exactly normalised. Metrics: the loss, top-1 accuracy over examples with w > 0, the
    gradient norm and, with the delayed-gradient transform, the realised staleness.
    """

    def loss_fn(params, batch_stats, images, labels, weights, total_weight):
        logits, new_vars = model.apply({"params": params, "batch_stats": batch_stats}, images, train=True,
                                       mutable=["batch_stats"])
        ce = optim.smoothed_cross_entropy(logits, labels, num_classes, label_smoothing)
        # This micro-batch's share of the weighted mean over the whole global batch.
        loss = jnp.sum(ce * weights) / total_weight
        correct = jnp.sum((jnp.argmax(logits, -1) == labels) * (weights > 0))
        return loss, (new_vars.get("batch_stats", batch_stats), correct, jnp.sum(weights > 0))

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def step(state: TrainState, images, labels, weights=None):
        if weights is None:
            weights = jnp.ones(labels.shape, jnp.float32)
        total_weight = jnp.maximum(jnp.sum(weights), 1e-12)
        xs = tuple(_micro_batches(a, accum_steps, num_shards) for a in (images, labels, weights))
        if mesh is not None:
            xs = tuple(jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P(None, parallel.DATA_AXIS)))
                       for a in xs)

        def body(carry, micro):
            grads_acc, stats, loss_acc, correct_acc, count_acc = carry
            (loss, (stats, correct, count)), grads = grad_fn(state.params, stats, *micro, total_weight)
            grads_acc = jax.tree.map(jnp.add, grads_acc, grads)
            return (grads_acc, stats, loss_acc + loss, correct_acc + correct, count_acc + count), None

        zeros = jax.tree.map(jnp.zeros_like, state.params)
        init = (zeros, state.batch_stats, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32),
                jnp.zeros((), jnp.float32))
        if accum_steps <= unroll_accum:
            # Unrolled: XLA:CPU runs convolutions inside a loop body several times slower than outside one.
            carry = init
            for i in range(accum_steps):
                carry, _ = body(carry, tuple(a[i] for a in xs))
        else:
            carry, _ = jax.lax.scan(body, init, xs)
        grads, new_stats, loss, correct, count = carry
        if grad_transform is not None:
            grads = grad_transform(grads, state)
        new_state = state.apply_gradients(grads=grads, batch_stats=new_stats)
        metrics = {
            "loss": loss,
            "accuracy": correct / jnp.maximum(count, 1.0),
            "grad_norm": optax.tree.norm(grads),
        }
        delayed = staleness.staleness_metrics(new_state.opt_state)
        if delayed:
            metrics["staleness"] = delayed["staleness/last"]
        return new_state, metrics

    return step


def make_eval_step(*, model, num_classes: int) -> Callable:
    """Builds ``eval_step(variables, images, labels, mask) -> sums`` (masked sums, so padding never counts)."""

    def eval_step(variables, images, labels, mask):
        logits = model.apply(variables, images, train=False)
        ce = optim.smoothed_cross_entropy(logits, labels, num_classes, 0.0)
        return {"loss_sum": jnp.sum(ce * mask), "correct": jnp.sum((jnp.argmax(logits, -1) == labels) * mask),
                "count": jnp.sum(mask)}

    return eval_step


def is_time(step: int, every_steps: int, total_steps: int) -> bool:
    """Whether the periodic action (eval, checkpoint, log) falls after `step` updates (1-based count).

    True every `every_steps` updates and always at the last one; never when `every_steps` <= 0, except last.
    """
    if step == total_steps:
        return True
    return every_steps > 0 and step % every_steps == 0


def every_steps(epochs: float, steps_per_epoch: int) -> int:
    """Converts an interval in epochs to updates (at least 1; 0 or negative disables)."""
    if epochs <= 0:
        return 0
    return max(1, int(round(epochs * steps_per_epoch)))


# ----------------------------------------------------------------------------------------------------------
# Validation: every check that needs no data, so a bad flag fails before anything is read or written.


def validate_config(config, num_devices: int) -> None:
    """Raises ConfigError naming the first bad field."""
    if config.dataset != data_lib.DIGITS and not config.data_dir:
        raise ConfigError("config.data_dir", config.data_dir,
                          f"a directory holding the prepared TFDS dataset {config.dataset!r} is required")
    if config.model not in models.MODELS:
        raise ConfigError("config.model", config.model, f"allowed: {', '.join(sorted(models.MODELS))}")
    if config.dtype not in models.DTYPES:
        raise ConfigError("config.dtype", config.dtype, f"allowed: {', '.join(models.DTYPES)}")
    if config.optimizer.name not in optim.OPTIMIZERS:
        raise ConfigError("config.optimizer.name", config.optimizer.name,
                          f"allowed: {', '.join(optim.OPTIMIZERS)}")
    if not (config.lr.base >= 0 and math.isfinite(config.lr.base)):
        raise ConfigError("config.lr.base", config.lr.base, "the learning rate must be a finite number >= 0")
    if config.lr.schedule not in optim.SCHEDULES:
        raise ConfigError("config.lr.schedule", config.lr.schedule, f"allowed: {', '.join(optim.SCHEDULES)}")
    if config.image_size < 4:
        raise ConfigError("config.image_size", config.image_size, "must be >= 4")
    b, k = config.batch_size, config.grad_accum_steps
    if b < 1:
        raise ConfigError("config.batch_size", b, "must be >= 1")
    if k < 1:
        raise ConfigError("config.grad_accum_steps", k, "must be >= 1")
    if b % (num_devices * k):
        raise ConfigError("config.batch_size", b, f"must be divisible by the device count ({num_devices}) "
                          f"x config.grad_accum_steps ({k}) = {num_devices * k}")
    if config.eval_batch_size < 1 or config.eval_batch_size % num_devices:
        raise ConfigError("config.eval_batch_size", config.eval_batch_size,
                          f"must be a positive multiple of the device count ({num_devices})")
    if b % jax.process_count():
        raise ConfigError("config.batch_size", b, f"must be divisible by the host count {jax.process_count()}")
    parallel.bn_group_size(config.bn.reduction, micro_batch=b // k, num_devices=num_devices,
                           group_size=config.bn.group_size)
    if not 0.0 <= config.label_smoothing < 1.0:
        raise ConfigError("config.label_smoothing", config.label_smoothing, "allowed: 0 <= s < 1")
    if config.conv_impl not in CONV_IMPLS:
        raise ConfigError("config.conv_impl", config.conv_impl, f"allowed: {', '.join(CONV_IMPLS)}")
    if config.polish.mode not in polish.POLISH_MODES:
        raise ConfigError("config.polish.mode", config.polish.mode, f"allowed: {', '.join(polish.POLISH_MODES)}")
    if config.polish.num_passes < 0:
        raise ConfigError("config.polish.num_passes", config.polish.num_passes,
                          "0 (until converged) or a positive number of passes")
    if config.polish.num_samples == 0 or config.polish.num_samples < -1:
        raise ConfigError("config.polish.num_samples", config.polish.num_samples, "-1 (all) or a positive count")
    pb = config.polish.batch_size or config.eval_batch_size
    if pb < 1 or pb % num_devices:
        raise ConfigError("config.polish.batch_size", config.polish.batch_size,
                          f"0 (eval_batch_size) or a positive multiple of the device count ({num_devices})")
    if config.polish.no_augment_epochs < 0:
        raise ConfigError("config.polish.no_augment_epochs", config.polish.no_augment_epochs, "must be >= 0")
    a = config.async_emulation
    if a.enabled:
        if a.mitigation not in MITIGATIONS:
            raise ConfigError("config.async_emulation.mitigation", a.mitigation,
                              f"allowed: {', '.join(MITIGATIONS)}")
        if a.sampler not in SAMPLERS:
            raise ConfigError("config.async_emulation.sampler", a.sampler, f"allowed: {', '.join(SAMPLERS)}")
        if a.num_sub_batches < 0 or (a.num_sub_batches and (b % a.num_sub_batches or k > 1)):
            raise ConfigError("config.async_emulation.num_sub_batches", a.num_sub_batches,
                              f"0 (off) or a divisor of config.batch_size={b} (without gradient accumulation)")


CONV_IMPLS = ("xla", "fast", "auto")
MITIGATIONS = ("none", "staleness_lr", "dc_asgd", "staleness_lr+dc_asgd")
SAMPLERS = ("constant", "uniform", "geometric", "pmf", "perf_model")


def _perf_model_pmfs(a, max_staleness: int, max_count: int):
    from jaxsprint.perf import sprint as sprint_model

    return sprint_model.delay_pmfs(a.workers, a.t_compute_s, a.t_update_s, a.t_compute_cv,
                                   max_staleness=max_staleness, max_count=max_count)


def make_async_emulation(config) -> tuple[optax.GradientTransformation | None, tuple[int, Any] | None]:
    """The delayed-gradient transform and the (num_sub_batches, K distribution) of ``config.async_emulation``.

    Both are None when the emulation is off. The staleness sampler is one of: a constant, uniform on
    {0..staleness}, geometric with ``mean_staleness`` (truncated at max_staleness), an explicit pmf, or the
    SPRINT model's predicted pmf for the cluster given by (workers, t_compute_s, t_compute_cv, t_update_s).
    The mini-batch emulation draws K of ``num_sub_batches`` sub-batches per update from ``k_pmf`` (or, when it
    is empty, from the model's predicted count pmf conditioned on K >= 1: an update with no gradient changes
    nothing in SPRINT, so the emulator skips none and draws again).
    """
    a = config.async_emulation
    if not a.enabled:
        return None, None
    m = int(a.max_staleness)
    field = "config.async_emulation"
    try:
        if a.sampler == "constant":
            sampler = staleness.constant(a.staleness)
        elif a.sampler == "uniform":
            sampler = staleness.uniform(a.staleness)
        elif a.sampler == "geometric":
            sampler = staleness.geometric(a.mean_staleness, m)
        elif a.sampler == "pmf":
            sampler = staleness.from_pmf(np.asarray(a.pmf, np.float64))
        else:
            pmf, _ = _perf_model_pmfs(a, m, 1)
            sampler = staleness.sampler_from_perf_model(np.asarray(pmf, np.float64), max_staleness=m,
                                                        tail="renormalize")
        mitigation = a.mitigation.split("+") if a.mitigation != "none" else "none"
        tx = staleness.delayed_gradients(m, sampler, mitigation=mitigation, dc_lambda=a.dc_lambda,
                                         seed=config.seed + 7)
        minibatch = None
        if a.num_sub_batches:
            n_sub = int(a.num_sub_batches)
            if len(a.k_pmf):
                k_pmf = np.asarray(a.k_pmf, np.float64)
            else:
                _, count = _perf_model_pmfs(a, max(m, 1), n_sub)
                k_pmf = np.asarray(count, np.float64)
                k_pmf[0] = 0.0
                k_pmf = k_pmf / k_pmf.sum()
            staleness.minibatch_weights(jax.random.key(0), n_sub, k_pmf)  # validates now, not inside jit
            minibatch = (n_sub, k_pmf)
    except (ValueError, TypeError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(field, {k: a[k] for k in ("sampler", "max_staleness", "staleness", "mean_staleness",
                                                    "pmf", "num_sub_batches", "k_pmf")}, str(e)) from None
    return tx, minibatch


def conv_fn(impl: str) -> Callable | None:
    """The convolution primitive for ``config.conv_impl``: "xla", "fast" or "auto" (fast on CPU only)."""
    if impl == "xla":
        return None
    from jaxsprint import conv as conv_lib

    return conv_lib.make_conv(impl)


def native_stats(impl: str) -> bool:
    """Whether a model built for ``config.conv_impl`` runs BatchNorm's sums natively (``models.BatchNorm``):
    for "fast" and "auto", which then do so on the CPU backend only; never for "xla", XLA's plain step."""
    return impl != "xla"


def compiler_options(impl: str) -> dict[str, str] | None:
    """XLA options for the jitted functions that run a model built with ``conv_fn(impl)``.

    See :func:`jaxsprint.conv.compiler_options` (on a single CPU device the convolutions go to XLA's
    multi-threaded Eigen kernels; None elsewhere).
    """
    from jaxsprint import conv as conv_lib

    return conv_lib.compiler_options(impl)


# ----------------------------------------------------------------------------------------------------------
# The loop.


@dataclasses.dataclass
class Experiment:
    """Everything `train_and_evaluate` builds from a config; handy for tests, polishing and benchmarks."""

    config: Any
    dataset: data_lib.Dataset
    mesh: Mesh
    hp: optim.HParams
    model: Any
    tx: optax.GradientTransformation
    schedule: Callable
    train_step: Callable          # jitted
    eval_step: Callable           # jitted
    train_preprocess: Callable    # jitted (key, uint8 images) -> float images
    eval_preprocess: Callable     # jitted (uint8 images) -> float images
    weights_fn: Callable | None = None  # jitted key -> (per-example weights, K) for the random mini-batch

    def init_state(self) -> TrainState:
        shape = (1, self.config.image_size, self.config.image_size, self.dataset.channels)
        rep = parallel.replicated(self.mesh)
        init = jax.jit(lambda key: create_train_state(key, self.model, self.tx, shape), out_shardings=rep)
        return init(jax.random.key(self.config.seed))

    def host_batch(self, source, indices: np.ndarray) -> dict[str, np.ndarray]:
        local = data_lib.host_slice(indices, jax.process_index(), jax.process_count())
        return source.get_batch(local)

    def evaluate(self, variables, split: str = "test") -> dict[str, float]:
        """Top-1 accuracy and loss over a whole split (exact: the padded tail is masked)."""
        source = self.dataset.test if split == "test" else self.dataset.train
        totals = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
        eb = self.config.eval_batch_size
        for idx, mask in data_lib.eval_batches(len(source), eb):
            batch = self.host_batch(source, idx)
            local_mask = data_lib.host_slice(mask, jax.process_index(), jax.process_count())
            arrays = parallel.shard_batch({"image": batch["image"], "label": batch["label"], "mask": local_mask},
                                          self.mesh)
            out = self.eval_step(variables, self.eval_preprocess(arrays["image"]), arrays["label"], arrays["mask"])
            for k, v in jax.device_get(out).items():
                totals[k] += float(v)
        n = max(totals["count"], 1.0)
        return {"accuracy": totals["correct"] / n, "loss": totals["loss_sum"] / n}


def build_experiment(config) -> Experiment:
    """Validates `config`, opens the data, builds mesh, model, optimizer and the jitted functions."""
    mesh = parallel.make_mesh(config.num_devices)
    validate_config(config, mesh.size)
    dataset = data_lib.load_dataset(config)
    hp = optim.derive_hparams(config, dataset.num_train)
    schedule = optim.make_schedule(config, hp)
    tx = optim.make_optimizer(config, schedule)
    delayed, minibatch = make_async_emulation(config)
    if delayed is not None:
        tx = optax.chain(delayed, tx)  # SPRINT's updater applies momentum to the gradients that arrive
    group = parallel.bn_group_size(config.bn.reduction, micro_batch=hp.micro_batch, num_devices=mesh.size,
                                   group_size=config.bn.group_size)
    model = models.create_model(config.model, num_classes=dataset.num_classes, dtype=config.dtype,
                                bn_momentum=config.bn.momentum, bn_epsilon=config.bn.epsilon,
                                bn_group_size=group, zero_init_last_bn=config.zero_init_last_bn,
                                conv_general_dilated=conv_fn(config.conv_impl),
                                native_stats=native_stats(config.conv_impl))
    rep, dat = parallel.replicated(mesh), parallel.data_sharding(mesh)
    step = make_train_step(model=model, num_classes=dataset.num_classes, label_smoothing=config.label_smoothing,
                           accum_steps=hp.accum_steps, num_shards=mesh.size, mesh=mesh)
    copts = compiler_options(config.conv_impl)
    train_step = jax.jit(step, in_shardings=(rep, dat, dat, dat), out_shardings=(rep, rep), donate_argnums=0,
                         compiler_options=copts)
    weights_fn = None
    if minibatch is not None:
        n_sub, k_pmf = minibatch

        def draw(key):
            d = staleness.minibatch_weights(key, n_sub, k_pmf)
            return staleness.example_weights(d.weights, hp.global_batch) * hp.global_batch, d.k

        weights_fn = jax.jit(draw, out_shardings=(dat, rep))
    eval_step = jax.jit(make_eval_step(model=model, num_classes=dataset.num_classes),
                        in_shardings=(rep, dat, dat, dat), out_shardings=rep, compiler_options=copts)
    train_pre, eval_pre = data_lib.make_preprocess_fns(config, dataset)
    return Experiment(config=config, dataset=dataset, mesh=mesh, hp=hp, model=model, tx=tx, schedule=schedule,
                      train_step=train_step, eval_step=eval_step, weights_fn=weights_fn,
                      train_preprocess=jax.jit(train_pre, in_shardings=(rep, dat), out_shardings=dat),
                      eval_preprocess=jax.jit(eval_pre, in_shardings=dat, out_shardings=dat))


class MetricWriter:
    """Metrics as JSON lines (``metrics.jsonl``) and TensorBoard event files (tensorboardX, no TensorFlow)."""

    def __init__(self, workdir: str, enabled: bool = True):
        self.enabled = enabled and jax.process_index() == 0
        self._tb = None
        if self.enabled:
            os.makedirs(workdir, exist_ok=True)
            self._path = os.path.join(workdir, "metrics.jsonl")
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        with open(self._path, "a") as f:
            f.write(json.dumps({"step": step, **{k: float(v) for k, v in scalars.items()}}) + "\n")
        for k, v in scalars.items():
            self._tb.add_scalar(k, float(v), step)

    def write_histograms(self, step: int, hists: dict[str, np.ndarray]) -> None:
        """Counts per value (index = value) as JSON lists, and TensorBoard histograms."""
        if not self.enabled:
            return
        with open(self._path, "a") as f:
            f.write(json.dumps({"step": step, **{k: np.asarray(v).tolist() for k, v in hists.items()}}) + "\n")
        for k, counts in hists.items():
            counts = np.asarray(counts)
            values = np.repeat(np.arange(len(counts)), counts.astype(np.int64))
            if len(values):
                self._tb.add_histogram(k, values, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def _checkpoint_manager(workdir: str, keep: int):
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=max(keep, 1), create=True)
    return ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, "checkpoints")), options=options)


def save_checkpoint(manager, step: int, state: TrainState, extra: dict | None = None) -> None:
    import orbax.checkpoint as ocp

    tree = {"state": flax.serialization.to_state_dict(state)}
    if extra:
        tree.update(extra)
    manager.save(step, args=ocp.args.StandardSave(tree))


def restore_checkpoint(manager, state: TrainState, extra_template: dict | None = None):
    """Restores the latest checkpoint into `state`'s structure and shardings; (state, extra, step) or None."""
    import orbax.checkpoint as ocp

    step = manager.latest_step()
    if step is None:
        return None
    template = {"state": flax.serialization.to_state_dict(state)}
    if extra_template:
        template.update(extra_template)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), template)
    restored = manager.restore(step, args=ocp.args.StandardRestore(abstract))
    new_state = flax.serialization.from_state_dict(state, restored.pop("state"))
    return new_state, restored, step


def _summary_table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    vwidth = max(len(v) for _, v in rows)
    line = "+" + "-" * (width + 2) + "+" + "-" * (vwidth + 2) + "+"
    out = [line] + [f"| {k.ljust(width)} | {v.rjust(vwidth)} |" for k, v in rows] + [line]
    return "\n".join(out)


def polish_batches(exp: Experiment, num_samples: int) -> list[dict[str, np.ndarray]]:
    """Un-augmented training batches for the recompute pass: a fixed random subset, padded and masked."""
    n = exp.dataset.num_train
    count = n if num_samples < 0 else min(num_samples, n)
    order = data_lib.epoch_permutation(exp.config.seed, 10**6, n)[:count]  # a fixed subset, every class
    bsz = exp.config.polish.batch_size or exp.config.eval_batch_size
    out = []
    for idx, mask in data_lib.eval_batches(count, bsz):
        batch = exp.host_batch(exp.dataset.train, order[idx])
        out.append({"image": batch["image"],
                    "mask": data_lib.host_slice(mask, jax.process_index(), jax.process_count())})
    return out


def run_polish(exp: Experiment, state: TrainState, info: dict | None = None) -> dict:
    """Final Polishing of `state`'s weights on un-augmented training images (``config.polish``)."""
    p = exp.config.polish
    moments_fn = polish.jit_moments_fn(exp.model, exp.mesh, exp.eval_preprocess,
                                       compiler_options(exp.config.conv_impl))
    return polish.recompute_batch_stats(
        exp.model, {"params": state.params, "batch_stats": state.batch_stats}, polish_batches(exp, p.num_samples),
        mesh=exp.mesh, num_samples=None, num_passes=p.num_passes, moments_fn=moments_fn, info=info)


def _histogram_add(counts: np.ndarray | None, values: np.ndarray, size: int) -> np.ndarray:
    h = np.bincount(np.asarray(values, np.int64).ravel(), minlength=size)
    return h if counts is None else counts + h[:len(counts)]


def train_and_evaluate(config, workdir: str, *, stop_after_steps: int | None = None) -> dict[str, Any]:
    """Trains and evaluates as `config` says, writing metrics and checkpoints to `workdir`.

    Resumes from the latest checkpoint in `workdir`. `stop_after_steps` ends the loop early (at that many
    total updates, after checkpointing) to emulate an interruption; schedules are unaffected.

    With ``config.polish.mode`` "no_augment_epochs" or "both", the last k epochs train on un-augmented
    images; with "recompute" or "both" the BatchNorm statistics are recomputed after the last step, and
    evaluation reports the EMA and the polished statistics side by side. The last checkpoint holds both
    (``polished_batch_stats`` equals ``batch_stats`` when nothing was polished).

    Returns:
      The final summary: accuracies, losses, steps, wall and step times, and the final state.
    """
    t_start = time.time()
    exp = build_experiment(config)
    hp = exp.hp
    state = exp.init_state()
    manager = _checkpoint_manager(workdir, config.keep_checkpoints)
    start_step = 0
    extra_template = {"polished_batch_stats": state.batch_stats, "polished": jnp.zeros((), jnp.int32)}
    restored = restore_checkpoint(manager, state, extra_template)
    polished_stats = None
    if restored is not None:
        state, extra, start_step = restored
        if int(extra["polished"]):
            polished_stats = extra["polished_batch_stats"]
        if jax.process_index() == 0:
            print(f"resumed from the checkpoint at step {start_step}")
    writer = MetricWriter(workdir)
    eval_every = every_steps(config.eval_every_epochs, hp.steps_per_epoch)
    ckpt_every = every_steps(config.checkpoint_every_epochs, hp.steps_per_epoch)
    end_step = hp.total_steps if stop_after_steps is None else min(stop_after_steps, hp.total_steps)
    base_key = jax.random.key(config.seed + 1)
    mode = config.polish.mode
    no_aug_from = hp.total_steps + 1
    if mode in ("no_augment_epochs", "both"):
        no_aug_from = max(0, hp.total_steps - int(round(config.polish.no_augment_epochs * hp.steps_per_epoch)))
    # Unit example weights, placed on the devices once (not every step) when the mini-batch is not emulated.
    ones = parallel.shard_batch({"w": np.ones(hp.global_batch // jax.process_count(), np.float32)}, exp.mesh)["w"]

    def host_batches() -> Iterator[dict[str, np.ndarray]]:
        for s in range(start_step, end_step):
            idx = data_lib.train_batch_indices(config.seed, s, exp.dataset.num_train, hp.global_batch)
            yield exp.host_batch(exp.dataset.train, idx)

    progress = None
    if config.progress_bar and jax.process_index() == 0:
        from tqdm import tqdm

        progress = tqdm(total=hp.total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True)

    def say(msg: str) -> None:
        if jax.process_index() == 0:
            (progress.write if progress is not None else print)(msg)

    def ema_variables(st):
        return {"params": st.params, "batch_stats": st.batch_stats}

    pending: list[tuple[int, dict]] = []
    last_eval: dict[str, float] = {}
    last_train: dict[str, float] = {}
    tau_hist = k_hist = None
    t_steps, n_timed = 0.0, 0
    t_prev = None
    step = start_step
    for batch in data_lib.prefetch(host_batches()):
        arrays = parallel.shard_batch(batch, exp.mesh)
        key = jax.random.fold_in(base_key, step)
        if step >= no_aug_from:
            images = exp.eval_preprocess(arrays["image"])
        else:
            images = exp.train_preprocess(key, arrays["image"])
        if exp.weights_fn is not None:
            weights, k = exp.weights_fn(jax.random.fold_in(key, 1))
        else:
            weights, k = ones, None
        state, metrics = exp.train_step(state, images, arrays["label"], weights)
        if k is not None:
            metrics = dict(metrics, minibatch_k=k)
        step += 1
        pending.append((step, metrics))
        if is_time(step, config.log_every_steps, end_step) or is_time(step, eval_every, end_step):
            fetched = jax.device_get(pending)
            pending = []
            for s, m in fetched:
                for name, value in m.items():
                    if not np.isfinite(value):
                        raise NonFiniteError(s, name, float(value))
            if "staleness" in fetched[0][1]:
                tau_hist = _histogram_add(tau_hist, [m["staleness"] for _, m in fetched],
                                          config.async_emulation.max_staleness + 1)
            if "minibatch_k" in fetched[0][1]:
                k_hist = _histogram_add(k_hist, [m["minibatch_k"] for _, m in fetched],
                                        config.async_emulation.num_sub_batches + 1)
            now = time.time()
            if t_prev is not None:
                t_steps += now - t_prev
                n_timed += len(fetched)
            t_prev = now
            s, m = fetched[-1]
            last_train = {f"train_{k}": float(v) for k, v in m.items()}
            last_train["lr"] = float(exp.schedule(s - 1))
            writer.write(s, last_train)
            hists = {}
            if tau_hist is not None:
                hists["staleness_hist"] = tau_hist
            if k_hist is not None:
                hists["minibatch_hist"] = k_hist
            if hists:
                writer.write_histograms(s, hists)
            if progress is not None:
                progress.set_postfix(loss=f"{last_train['train_loss']:.3f}",
                                     acc=f"{last_train['train_accuracy']:.3f}")
        if is_time(step, eval_every, end_step):
            last_eval = exp.evaluate(ema_variables(state))
            writer.write(step, {f"eval_{k}": v for k, v in last_eval.items()})
            say(f"step {step}/{hp.total_steps} (epoch {step / hp.steps_per_epoch:.1f}): eval accuracy "
                f"{100 * last_eval['accuracy']:.2f}% loss {last_eval['loss']:.4f}")
            t_prev = time.time()  # evaluation is not step time
        if step < end_step and is_time(step, ckpt_every, end_step):
            save_checkpoint(manager, step, state, {"polished_batch_stats": state.batch_stats,
                                                   "polished": jnp.zeros((), jnp.int32)})
        if progress is not None:
            progress.update(1)
    if progress is not None:
        progress.close()
    if not last_eval:
        last_eval = exp.evaluate(ema_variables(state))
    polished_eval: dict[str, float] = {}
    polish_time = float("nan")
    if mode in ("recompute", "both") and step == hp.total_steps:
        t0 = time.time()
        polish_info: dict = {}
        if polished_stats is None:
            polished_stats = run_polish(exp, state, polish_info)
        polish_time = time.time() - t0
        polished_eval = exp.evaluate({"params": state.params, "batch_stats": polished_stats})
        writer.write(step, {f"eval_polished_{k}": v for k, v in polished_eval.items()})
        say(f"final polishing: eval accuracy {100 * last_eval['accuracy']:.2f}% (EMA statistics) -> "
            f"{100 * polished_eval['accuracy']:.2f}% (recomputed statistics; {polish_info.get('passes', 0)} passes "
            f"in {polish_time:.1f} s)")
    if manager.latest_step() != step:
        save_checkpoint(manager, step, state, {
            "polished_batch_stats": polished_stats if polished_stats is not None else state.batch_stats,
            "polished": jnp.asarray(int(polished_stats is not None), jnp.int32)})
    manager.wait_until_finished()
    writer.close()
    step_time = t_steps / n_timed if n_timed else float("nan")
    summary = {
        "dataset": config.dataset, "model": config.model, "devices": exp.mesh.size,
        "global_batch": hp.global_batch, "steps": step, "epochs": step / hp.steps_per_epoch,
        "peak_lr": hp.peak_lr, "final_train_loss": last_train.get("train_loss", float("nan")),
        "eval_accuracy": last_eval["accuracy"], "eval_loss": last_eval["loss"],
        "polish_mode": mode,
        "eval_polished_accuracy": polished_eval.get("accuracy", float("nan")),
        "eval_polished_loss": polished_eval.get("loss", float("nan")),
        "polish_time_s": polish_time,
        "step_time_s": step_time, "images_per_s": hp.global_batch / step_time if n_timed else float("nan"),
        "wall_time_s": time.time() - t_start,
    }
    if tau_hist is not None:
        summary["staleness_hist"] = tau_hist.tolist()
    if k_hist is not None:
        summary["minibatch_hist"] = k_hist.tolist()
    if jax.process_index() == 0:
        with open(os.path.join(workdir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
    summary["state"] = state
    summary["polished_batch_stats"] = polished_stats
    summary["experiment"] = exp
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """The final summary table printed by the launcher."""
    rows = [
        ("dataset / model", f"{summary['dataset']} / {summary['model']}"),
        ("devices", str(summary["devices"])),
        ("global batch", str(summary["global_batch"])),
        ("steps (epochs)", f"{summary['steps']} ({summary['epochs']:.1f})"),
        ("peak learning rate", f"{summary['peak_lr']:.4g}"),
        ("final train loss", f"{summary['final_train_loss']:.4f}"),
        ("eval top-1 accuracy", f"{100 * summary['eval_accuracy']:.2f}%"),
        ("eval loss", f"{summary['eval_loss']:.4f}"),
    ]
    if summary["polish_mode"] != "none":
        rows.append(("polish mode", summary["polish_mode"]))
    if not math.isnan(summary["eval_polished_accuracy"]):
        rows += [("eval top-1, polished BN", f"{100 * summary['eval_polished_accuracy']:.2f}%"),
                 ("eval loss, polished BN", f"{summary['eval_polished_loss']:.4f}"),
                 ("polishing pass time", f"{summary['polish_time_s']:.1f} s")]
    if "staleness_hist" in summary:
        h = np.asarray(summary["staleness_hist"], np.float64)
        rows.append(("mean realised staleness", f"{(h * np.arange(len(h))).sum() / max(h.sum(), 1):.2f}"))
    if "minibatch_hist" in summary:
        h = np.asarray(summary["minibatch_hist"], np.float64)
        rows.append(("mean sub-batches / update", f"{(h * np.arange(len(h))).sum() / max(h.sum(), 1):.2f}"))
    rows += [
        ("train step time", f"{1000 * summary['step_time_s']:.1f} ms"),
        ("throughput", f"{summary['images_per_s']:.1f} img/s"),
        ("wall time", f"{summary['wall_time_s']:.1f} s"),
    ]
    return _summary_table(rows)
