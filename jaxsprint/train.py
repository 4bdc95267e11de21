"""Training: TrainState, pure step factories, and `train_and_evaluate(config, workdir)`.

A step is one optimizer update on one global batch, sharded along ``data``. With ``grad_accum_steps = k`` the
step scans over k micro-batches (each device contributes its own i-th slice to micro-batch i, so no data
moves), sums their gradients and applies one update: the same update as one pass over the k-times larger
batch when BatchNorm statistics are global per micro-batch or absent.
"""
from __future__ import annotations

import dataclasses
import functools
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
from absl import logging
from flax.training import train_state
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxsprint import data as data_lib
from jaxsprint import models, optim, parallel
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
                    grad_transform: Callable | None = None) -> Callable:
    """Builds ``step(state, images, labels, weights=None) -> (state, metrics)``; pure, jit it once.

    Args:
      model: flax module taking ``(x, train=..., mask=...)``.
      num_classes: number of logits.
      label_smoothing: s in (1 - s) * onehot + s / num_classes.
      accum_steps: micro-batches per update (k); gradients are averaged over them.
      num_shards: devices along ``data`` (for the locality-preserving micro-batch split).
      mesh: if given, micro-batches are constrained to stay sharded along ``data``.
      grad_transform: optional ``(grads, state) -> grads`` applied before the optimizer (for experiments).

    The loss of a micro-batch is sum_i w_i * CE_i / sum_i w_i with per-example weights `weights` (default 1);
    a micro-batch whose weights are all zero contributes nothing.
    """

    def loss_fn(params, batch_stats, images, labels, weights):
        logits, new_vars = model.apply({"params": params, "batch_stats": batch_stats}, images, train=True,
                                       mutable=["batch_stats"])
        ce = optim.smoothed_cross_entropy(logits, labels, num_classes, label_smoothing)
        wsum = jnp.sum(weights)
        loss = jnp.sum(ce * weights) / jnp.maximum(wsum, 1e-12)
        correct = jnp.sum((jnp.argmax(logits, -1) == labels) * weights)
        return loss, (new_vars.get("batch_stats", batch_stats), correct, wsum)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def step(state: TrainState, images, labels, weights=None):
        if weights is None:
            weights = jnp.ones(labels.shape, jnp.float32)
        xs = tuple(_micro_batches(a, accum_steps, num_shards) for a in (images, labels, weights))
        if mesh is not None:
            xs = tuple(jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P(None, parallel.DATA_AXIS)))
                       for a in xs)

        def body(carry, micro):
            grads_acc, stats, loss_acc, correct_acc, count_acc = carry
            (loss, (stats, correct, count)), grads = grad_fn(state.params, stats, *micro)
            grads_acc = jax.tree.map(jnp.add, grads_acc, grads)
            return (grads_acc, stats, loss_acc + loss, correct_acc + correct, count_acc + count), None

        zeros = jax.tree.map(jnp.zeros_like, state.params)
        init = (zeros, state.batch_stats, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32),
                jnp.zeros((), jnp.float32))
        if accum_steps == 1:
            carry, _ = body(init, tuple(a[0] for a in xs))
        else:
            carry, _ = jax.lax.scan(body, init, xs)
        grads, new_stats, loss_sum, correct, count = carry
        grads = jax.tree.map(lambda g: g / accum_steps, grads)
        if grad_transform is not None:
            grads = grad_transform(grads, state)
        new_state = state.apply_gradients(grads=grads, batch_stats=new_stats)
        metrics = {
            "loss": loss_sum / accum_steps,
            "accuracy": correct / jnp.maximum(count, 1.0),
            "grad_norm": optax.global_norm(grads),
        }
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


CONV_IMPLS = ("xla", "fast", "auto")


def conv_fn(impl: str) -> Callable | None:
    """The convolution primitive for ``config.conv_impl`` (None: XLA's own)."""
    if impl == "xla":
        return None
    try:
        from jaxsprint import conv as conv_lib
    except ImportError:  # the fast convolution is optional
        return None
    return conv_lib.select_conv(impl)


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
    group = parallel.bn_group_size(config.bn.reduction, micro_batch=hp.micro_batch, num_devices=mesh.size,
                                   group_size=config.bn.group_size)
    model = models.create_model(config.model, num_classes=dataset.num_classes, dtype=config.dtype,
                                bn_momentum=config.bn.momentum, bn_epsilon=config.bn.epsilon,
                                bn_group_size=group, zero_init_last_bn=config.zero_init_last_bn,
                                conv_general_dilated=conv_fn(config.conv_impl))
    rep, dat = parallel.replicated(mesh), parallel.data_sharding(mesh)
    step = make_train_step(model=model, num_classes=dataset.num_classes, label_smoothing=config.label_smoothing,
                           accum_steps=hp.accum_steps, num_shards=mesh.size, mesh=mesh)
    train_step = jax.jit(step, in_shardings=(rep, dat, dat), out_shardings=(rep, rep), donate_argnums=0)
    eval_step = jax.jit(make_eval_step(model=model, num_classes=dataset.num_classes),
                        in_shardings=(rep, dat, dat, dat), out_shardings=rep)
    train_pre, eval_pre = data_lib.make_preprocess_fns(config, dataset)
    return Experiment(config=config, dataset=dataset, mesh=mesh, hp=hp, model=model, tx=tx, schedule=schedule,
                      train_step=train_step, eval_step=eval_step,
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


def train_and_evaluate(config, workdir: str, *, stop_after_steps: int | None = None) -> dict[str, Any]:
    """Trains and evaluates as `config` says, writing metrics and checkpoints to `workdir`.

    Resumes from the latest checkpoint in `workdir`. `stop_after_steps` ends the loop early (at that many
    total updates, after checkpointing) to emulate an interruption; schedules are unaffected.

    Returns:
      The final summary: accuracies, losses, steps, wall and step times.
    """
    t_start = time.time()
    exp = build_experiment(config)
    hp = exp.hp
    state = exp.init_state()
    manager = _checkpoint_manager(workdir, config.keep_checkpoints)
    start_step = 0
    restored = restore_checkpoint(manager, state)
    if restored is not None:
        state, _, start_step = restored
        logging.info("Resumed from checkpoint at step %d", start_step)
    writer = MetricWriter(workdir)
    eval_every = every_steps(config.eval_every_epochs, hp.steps_per_epoch)
    ckpt_every = every_steps(config.checkpoint_every_epochs, hp.steps_per_epoch)
    end_step = hp.total_steps if stop_after_steps is None else min(stop_after_steps, hp.total_steps)
    base_key = jax.random.key(config.seed + 1)

    def host_batches() -> Iterator[dict[str, np.ndarray]]:
        for s in range(start_step, end_step):
            idx = data_lib.train_batch_indices(config.seed, s, exp.dataset.num_train, hp.global_batch)
            yield exp.host_batch(exp.dataset.train, idx)

    progress = None
    if config.progress_bar and jax.process_index() == 0:
        from tqdm import tqdm

        progress = tqdm(total=hp.total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True)

    pending: list[tuple[int, dict]] = []
    last_eval: dict[str, float] = {}
    last_train: dict[str, float] = {}
    t_steps, n_timed = 0.0, 0
    t_prev = None
    step = start_step
    for batch in data_lib.prefetch(host_batches()):
        arrays = parallel.shard_batch(batch, exp.mesh)
        key = jax.random.fold_in(base_key, step)
        images = exp.train_preprocess(key, arrays["image"])
        state, metrics = exp.train_step(state, images, arrays["label"])
        step += 1
        pending.append((step, metrics))
        if is_time(step, config.log_every_steps, end_step) or is_time(step, eval_every, end_step):
            fetched = jax.device_get(pending)
            pending = []
            for s, m in fetched:
                for name, value in m.items():
                    if not np.isfinite(value):
                        raise NonFiniteError(s, name, float(value))
            now = time.time()
            if t_prev is not None:
                t_steps += now - t_prev
                n_timed += len(fetched)
            t_prev = now
            s, m = fetched[-1]
            last_train = {f"train_{k}": float(v) for k, v in m.items()}
            last_train["lr"] = float(exp.schedule(s - 1))
            writer.write(s, last_train)
            if progress is not None:
                progress.set_postfix(loss=f"{last_train['train_loss']:.3f}",
                                     acc=f"{last_train['train_accuracy']:.3f}")
        if is_time(step, eval_every, end_step):
            last_eval = exp.evaluate({"params": state.params, "batch_stats": state.batch_stats})
            writer.write(step, {f"eval_{k}": v for k, v in last_eval.items()})
            msg = (f"step {step}/{hp.total_steps} (epoch {step / hp.steps_per_epoch:.1f}): eval accuracy "
                   f"{100 * last_eval['accuracy']:.2f}% loss {last_eval['loss']:.4f}")
            if jax.process_index() == 0:
                (progress.write if progress is not None else print)(msg)
            t_prev = time.time()  # evaluation is not step time
        if is_time(step, ckpt_every, end_step):
            save_checkpoint(manager, step, state)
        if progress is not None:
            progress.update(1)
    manager.wait_until_finished()
    if progress is not None:
        progress.close()
    writer.close()
    if not last_eval:
        last_eval = exp.evaluate({"params": state.params, "batch_stats": state.batch_stats})
    step_time = t_steps / n_timed if n_timed else float("nan")
    summary = {
        "dataset": config.dataset, "model": config.model, "devices": exp.mesh.size,
        "global_batch": hp.global_batch, "steps": step, "epochs": step / hp.steps_per_epoch,
        "peak_lr": hp.peak_lr, "final_train_loss": last_train.get("train_loss", float("nan")),
        "eval_accuracy": last_eval["accuracy"], "eval_loss": last_eval["loss"],
        "step_time_s": step_time, "images_per_s": hp.global_batch / step_time if n_timed else float("nan"),
        "wall_time_s": time.time() - t_start,
    }
    if jax.process_index() == 0:
        with open(os.path.join(workdir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
    summary["state"] = state
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
        ("train step time", f"{1000 * summary['step_time_s']:.1f} ms"),
        ("throughput", f"{summary['images_per_s']:.1f} img/s"),
        ("wall time", f"{summary['wall_time_s']:.1f} s"),
    ]
    return _summary_table(rows)
