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
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxsprint import paths
from jaxsprint.emulation import adapter
from jaxsprint.train import checkpoint, cpu, metrics as metrics_lib, models, optim, parallel, pipeline
from jaxsprint.train import data as data_lib
from jaxsprint.train import noise, polish, run_config
from jaxsprint.emulation import staleness
from jaxsprint.errors import CheckpointError, NonFiniteError
from jaxsprint.train.settings import profile_range, validate_config  # validate_config re-exported


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


# The non-finite guard: every floating leaf a step writes, in the order the first offender is reported.
GUARDED = ("loss", "grad_norm", "params", "batch_stats", "opt_state")


def guarded_leaves(quantities: dict[str, Any]) -> list[tuple[str, Any]]:
    """``(name, leaf)`` of every floating leaf of `quantities` (keys from `GUARDED`), names like
    ``batch_stats/BatchNorm_0/var``, in a fixed order (the guard vector's)."""
    out = []
    for group in GUARDED:
        for path, leaf in checkpoint.named_leaves(quantities[group]):
            if jnp.issubdtype(leaf.dtype, jnp.inexact):
                out.append((f"{group}/{path}" if path else group, leaf))
    return out


def guard_names(state: TrainState) -> list[str]:
    """The names of the entries of the step's ``metrics["guard"]`` vector for a state of this structure."""
    scalar = jax.ShapeDtypeStruct((), jnp.float32)
    return [name for name, _ in guarded_leaves({"loss": scalar, "grad_norm": scalar, "params": state.params,
                                                "batch_stats": state.batch_stats,
                                                "opt_state": state.opt_state})]


def _guard_vector(quantities: dict[str, Any]) -> jax.Array:
    """One float32 per guarded leaf: 0 where the leaf is finite, else the sum of its non-finite entries (inf,
    -inf or nan). One fused pass over the state, so the check costs about a read of it."""
    return jnp.stack([jnp.sum(jnp.where(jnp.isfinite(x), 0.0, x.astype(jnp.float32)))
                      for _, x in guarded_leaves(quantities)])


def make_train_step(*, model, num_classes: int, label_smoothing: float = 0.0, accum_steps: int = 1,
                    num_shards: int = 1, mesh: Mesh | None = None,
                    grad_transform: Callable | None = None, unroll_accum: int = 8,
                    measure_noise: bool = False) -> Callable:
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
      measure_noise: compute the gradients per device (`noise.sharded_step_grads`, over `mesh`) and return
        the gradient noise scale's per-step estimates ``noise_g2`` and ``noise_trace`` in the metrics.

    The loss is the weighted mean sum_i w_i CE_i / sum_i w_i over the global batch with per-example weights
    `weights` (default 1; the asynchronous emulator's random mini-batch uses them), so accumulation and
    weighting stay exactly normalised. Metrics: the loss, top-1 accuracy over examples with w > 0, the
    gradient norm and, with the delayed-gradient transform, the realised staleness.

    The non-finite guard: ``metrics["guard"]`` is a float32 vector over every floating leaf the step writes
    (loss, gradient norm, parameters, BN statistics, optimizer state; names from `guard_names`), 0 where the
    leaf is finite. When any entry is not finite, the step returns the input state unchanged (a ``jnp.where``
    per leaf; bit-identical otherwise), so the last good state is never replaced.
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

    def accumulate(params, batch_stats, images, labels, weights, total_weight, *, shards, constrain):
        """Gradients, BN statistics, loss, correct and count summed over the micro-batches of `images`, and
        the sum of the micro-batch gradients' squared norms when noise is measured."""
        xs = tuple(_micro_batches(a, accum_steps, shards) for a in (images, labels, weights))
        if constrain:
            xs = tuple(jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P(None, parallel.DATA_AXIS)))
                       for a in xs)

        def body(carry, micro):
            grads_acc, stats, loss_acc, correct_acc, count_acc, sq_acc = carry
            (loss, (stats, correct, count)), grads = grad_fn(params, stats, *micro, total_weight)
            grads_acc = jax.tree.map(jnp.add, grads_acc, grads)
            if measure_noise:
                sq_acc = sq_acc + optax.tree.norm(grads, squared=True)
            return (grads_acc, stats, loss_acc + loss, correct_acc + correct, count_acc + count, sq_acc), None

        zero = jnp.zeros((), jnp.float32)
        init = (jax.tree.map(jnp.zeros_like, params), batch_stats, zero, zero, zero, zero)
        if accum_steps <= unroll_accum:
            # Unrolled: XLA:CPU runs convolutions inside a loop body several times slower than outside one.
            carry = init
            for i in range(accum_steps):
                carry, _ = body(carry, tuple(a[i] for a in xs))
        else:
            carry, _ = jax.lax.scan(body, init, xs)
        return carry

    if measure_noise:
        if mesh is None:
            raise ValueError("measure_noise needs the mesh")
        sharded = noise.sharded_step_grads(functools.partial(accumulate, shards=1, constrain=False), mesh,
                                           parallel.DATA_AXIS)

    def step(state: TrainState, images, labels, weights=None):
        if weights is None:
            weights = jnp.ones(labels.shape, jnp.float32)
        total_weight = jnp.maximum(jnp.sum(weights), 1e-12)
        args = (state.params, state.batch_stats, images, labels, weights, total_weight)
        if measure_noise:
            grads, new_stats, loss, correct, count, small_sq = sharded(*args)
            noise_metrics = noise.step_metrics(small_sq, grads, num_small=mesh.size * accum_steps,
                                               global_batch=labels.shape[0])
        else:
            grads, new_stats, loss, correct, count, _ = accumulate(*args, shards=num_shards,
                                                                   constrain=mesh is not None)
            noise_metrics = {}
        if grad_transform is not None:
            grads = grad_transform(grads, state)
        new_state = state.apply_gradients(grads=grads, batch_stats=new_stats)
        metrics = {
            "loss": loss,
            "accuracy": correct / jnp.maximum(count, 1.0),
            "grad_norm": optax.tree.norm(grads),
            **noise_metrics,
        }
        guard = _guard_vector({"loss": loss, "grad_norm": metrics["grad_norm"], "params": new_state.params,
                               "batch_stats": new_state.batch_stats, "opt_state": new_state.opt_state})
        metrics["guard"] = guard
        ok = jnp.all(jnp.isfinite(guard))
        new_state = jax.tree.map(lambda new, old: jnp.where(ok, new, old), new_state, state)
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
# What a run builds from its config.


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
    accel: cpu.Acceleration
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

    def evaluate(self, variables, split: str = "test") -> dict[str, float]:
        """Top-1 accuracy and loss over a whole split (exact: the padded tail is masked)."""
        source = self.dataset.test if split == "test" else self.dataset.train
        totals = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
        for batch in pipeline.eval_iterator(source, global_batch=self.config.eval_batch_size):
            arrays = parallel.shard_batch(batch, self.mesh)
            out = self.eval_step(variables, self.eval_preprocess(arrays["image"]), arrays["label"], arrays["mask"])
            for k, v in jax.device_get(out).items():
                totals[k] += float(v)
        n = max(totals["count"], 1.0)
        return {"accuracy": totals["correct"] / n, "loss": totals["loss_sum"] / n}

    def polish_batches(self, num_samples: int) -> list[dict[str, np.ndarray]]:
        """Un-augmented training batches for the recompute pass: a fixed random subset, padded and masked."""
        order = pipeline.polish_indices(self.config.seed, self.dataset.num_train, num_samples)
        bsz = self.config.polish.batch_size or self.config.eval_batch_size
        return [{"image": b["image"], "mask": b["mask"]}
                for b in pipeline.eval_iterator(self.dataset.train, global_batch=bsz, indices=order)]

    def train_iterator(self):
        """This host's training batches from step 0 (a grain iterator; its position is checkpointed)."""
        return pipeline.train_iterator(self.dataset.train, seed=self.config.seed,
                                       global_batch=self.hp.global_batch)

    def polish(self, state: TrainState, info: dict | None = None) -> dict:
        """Final Polishing of `state`'s weights on un-augmented training images (``config.polish``)."""
        p = self.config.polish
        moments_fn = polish.jit_moments_fn(self.model, self.mesh, self.eval_preprocess,
                                           self.accel.compiler_options)
        return polish.recompute_batch_stats(
            self.model, {"params": state.params, "batch_stats": state.batch_stats},
            self.polish_batches(p.num_samples), mesh=self.mesh, num_samples=None, num_passes=p.num_passes,
            moments_fn=moments_fn, info=info)


def measures_noise(config) -> bool:
    """Whether the run measures the gradient noise scale (``config.noise_scale.enabled``)."""
    return "noise_scale" in config and bool(config.noise_scale.enabled)


def build_experiment(config) -> Experiment:
    """Validates `config`, opens the data, builds mesh, model, optimizer and the jitted functions."""
    mesh = parallel.make_mesh(config.num_devices)
    validate_config(config, mesh.size)
    checkpoint.validate_config(config)
    accel = cpu.acceleration(config.cpu_kernels)
    dataset = data_lib.load_dataset(config)
    hp = optim.derive_hparams(config, dataset.num_train)
    profile_range(config, hp.total_steps)
    schedule = optim.make_schedule(config, hp)
    tx = optim.make_optimizer(config, schedule)
    delayed, minibatch = adapter.from_config(config)
    if delayed is not None:
        tx = optax.chain(delayed, tx)  # SPRINT's updater applies momentum to the gradients that arrive
    group = parallel.bn_group_size(config.bn.reduction, micro_batch=hp.micro_batch, num_devices=mesh.size,
                                   group_size=config.bn.group_size)
    model = models.create_model(config.model, num_classes=dataset.num_classes, dtype=config.dtype,
                                bn_momentum=config.bn.momentum, bn_epsilon=config.bn.epsilon,
                                bn_group_size=group, zero_init_last_bn=config.zero_init_last_bn,
                                **accel.model_kwargs())
    rep, dat = parallel.replicated(mesh), parallel.data_sharding(mesh)
    step = make_train_step(model=model, num_classes=dataset.num_classes, label_smoothing=config.label_smoothing,
                           accum_steps=hp.accum_steps, num_shards=mesh.size, mesh=mesh,
                           measure_noise=measures_noise(config))
    copts = accel.compiler_options
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
                      accel=accel, train_step=train_step, eval_step=eval_step, weights_fn=weights_fn,
                      train_preprocess=jax.jit(train_pre, in_shardings=(rep, dat), out_shardings=dat),
                      eval_preprocess=jax.jit(eval_pre, in_shardings=dat, out_shardings=dat))


# ----------------------------------------------------------------------------------------------------------
# The loop.


def _checkpoint_extras(exp: Experiment, state: TrainState, polished_stats=None) -> dict:
    """What a checkpoint holds beside the state: the polished statistics (the EMA ones until polished).

    Global arrays, replicated over the mesh (a multi-process checkpoint cannot hold host-local arrays).
    """
    rep = parallel.replicated(exp.mesh)
    flag = np.asarray(int(polished_stats is not None), np.int32)
    stats = state.batch_stats if polished_stats is None else polished_stats
    return {"polished_batch_stats": jax.jit(lambda t: t, out_shardings=rep)(stats),
            "polished": jax.make_array_from_callback((), rep, lambda index: flag[index])}


def _say(msg: str) -> None:
    if jax.process_index() == 0:
        print(msg, flush=True)


def train_and_evaluate(config, workdir: str, *, stop_after_steps: int | None = None) -> dict[str, Any]:
    """Trains and evaluates as `config` says, writing metrics and checkpoints to `workdir`.

    Resumes from the latest checkpoint in `workdir` when the workdir's config.json matches `config` in every
    field that changes the trajectory (`jaxsprint.train.run_config`; else a ConfigError before anything is
    written), and writes `config` as the run's config.json. `stop_after_steps` ends the loop early (at that
    many total updates, after checkpointing) to emulate an interruption; schedules are unaffected.

    With ``config.stop_at_accuracy`` > 0 the loop ends at the first evaluation where the mean accuracy of the
    last ``config.stop_evals`` evaluations reaches it (the summary's ``steps`` is then the updates to that
    accuracy, at the evaluation interval's resolution).

    With ``config.polish.mode`` "no_augment_epochs" or "both", the last k epochs train on un-augmented
    images; with "recompute" or "both" the BatchNorm statistics are recomputed after the last step, and
    evaluation reports the EMA and the polished statistics side by side. The last checkpoint holds both
    (``polished_batch_stats`` equals ``batch_stats`` when nothing was polished).

    Returns:
      The final summary: accuracies, losses, steps, wall and step times, and the final state.
    """
    t_start = time.time()
    exp = build_experiment(config)
    mgr = checkpoint.manager(workdir, config.keep_checkpoints)
    writer = None
    try:
        # Before anything is written: a config that differs from the resumed run's (beyond what
        # config.resume_allow_changes allows) or a checkpoint that does not match or cannot be read stops here.
        changes = run_config.resume_check(config, workdir) if mgr.latest_step() is not None else []
        state, batches = exp.init_state(), exp.train_iterator()
        state, start_step, polished_stats = _resume(exp, mgr, state, batches)
        if jax.process_index() == 0:
            run_config.remember(workdir, config, start_step, changes)
        writer = metrics_lib.MetricWriter(workdir)
        writer.write_hparams(metrics_lib.hparams(run_config.flatten(run_config.as_json(config))))
        summary, state, polished_stats = _loop(exp, workdir, mgr, writer, state, batches, start_step,
                                               polished_stats, stop_after_steps, t_start)
    finally:
        # Also on an error (a non-finite step): let a pending asynchronous save finish and close orbax's
        # threads first, so that the last good checkpoint is complete and no temporary folder is left.
        mgr.wait_until_finished()
        mgr.close()
        if writer is not None:
            writer.close()
    return dict(summary, state=state, polished_batch_stats=polished_stats, experiment=exp)


def _loop(exp: Experiment, workdir: str, mgr, writer, state: TrainState, batches, start_step: int,
          polished_stats, stop_after_steps: int | None, t_start: float):
    config, hp = exp.config, exp.hp
    a = config.async_emulation
    window = metrics_lib.Window(writer, guard_names(state), schedule=exp.schedule, global_batch=hp.global_batch,
                                hist_sizes={"staleness": ("staleness_hist", a.max_staleness + 1),
                                            "minibatch_k": ("minibatch_hist", a.num_sub_batches + 1)},
                                noise=noise.Tracker(config.noise_scale.ema_decay) if measures_noise(config) else None)
    trace = metrics_lib.Trace(profile_range(config), workdir)
    eval_every = every_steps(config.eval_every_epochs, hp.steps_per_epoch)
    ckpt_every = every_steps(config.checkpoint_every_epochs, hp.steps_per_epoch)
    end_step = hp.total_steps if stop_after_steps is None else min(stop_after_steps, hp.total_steps)
    progress = metrics_lib.Progress(config.progress_bar, hp.total_steps, start_step)
    last_eval: dict[str, float] = {}
    recent: list[float] = []  # this process's evaluation accuracies, for config.stop_at_accuracy
    step = start_step
    try:
        for step, images, labels, weights, k in _step_inputs(exp, batches, start_step, end_step):
            trace.before(step - 1, state)
            state, m = exp.train_step(state, images, labels, weights)
            trace.after(step, state)
            window.pending.append((step, m if k is None else dict(m, minibatch_k=k)))
            if is_time(step, config.log_every_steps, end_step) or is_time(step, eval_every, end_step):
                window.flush()
            if is_time(step, eval_every, end_step):
                last_eval = _evaluate(exp, step, {"params": state.params, "batch_stats": state.batch_stats})
                writer.write(step, {f"eval_{k}": v for k, v in last_eval.items()})
                progress.say(f"step {step}/{hp.total_steps} (epoch {step / hp.steps_per_epoch:.1f}): eval "
                             f"accuracy {100 * last_eval['accuracy']:.2f}% loss {last_eval['loss']:.4f}")
                window.pause()
                recent.append(last_eval["accuracy"])
                if reached_target(config, recent):
                    progress.say(f"stopped at step {step}: eval accuracy (mean of the last "
                                 f"{config.stop_evals}) reached config.stop_at_accuracy={config.stop_at_accuracy}")
                    break
            if step < end_step and is_time(step, ckpt_every, end_step):
                window.check()  # never a checkpoint of a state after a non-finite step
                checkpoint.save(mgr, step, state, _checkpoint_extras(exp, state), batches)
            progress.update(window.last)
    finally:
        trace.stop(state)
        progress.close()
    if not last_eval:
        last_eval = _evaluate(exp, step, {"params": state.params, "batch_stats": state.batch_stats})
    polished_eval, polish_time, polished_stats = _final_polish(exp, state, step, polished_stats, last_eval, writer)
    if mgr.latest_step() != step:
        checkpoint.save(mgr, step, state, _checkpoint_extras(exp, state, polished_stats), batches)
    mgr.wait_until_finished()
    summary = _summary(exp, step, window, last_eval, polished_eval, polish_time, time.time() - t_start)
    if jax.process_index() == 0:
        (paths.as_path(workdir) / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary, state, polished_stats


def reached_target(config, accuracies: list[float]) -> bool:
    """Whether the mean of the last ``config.stop_evals`` evaluations' accuracy reaches
    ``config.stop_at_accuracy`` (> 0; the mean steadies the stop where the test set is small)."""
    target, k = config.get("stop_at_accuracy", 0.0), config.get("stop_evals", 1)
    return 0 < target and len(accuracies) >= k and float(np.mean(accuracies[-k:])) >= target


def _evaluate(exp: Experiment, step: int, variables, name: str = "eval_loss") -> dict[str, float]:
    """`Experiment.evaluate`, stopping the run when the loss is not finite (the state is not saved)."""
    result = exp.evaluate(variables)
    if not np.isfinite(result["loss"]):
        raise NonFiniteError(step, name, result["loss"])
    return result


def load_checkpoint(exp: Experiment, workdir: str) -> tuple[TrainState, int, Any] | None:
    """The latest checkpoint of a run of `exp` in `workdir`: ``(state, step, polished statistics or None)``,
    or None when there is none."""
    mgr = checkpoint.manager(workdir, exp.config.keep_checkpoints)
    try:
        state = exp.init_state()
        if mgr.latest_step() is None:
            return None
        return _resume(exp, mgr, state, exp.train_iterator())
    finally:
        mgr.close()


def _resume(exp: Experiment, mgr, state: TrainState, batches) -> tuple[TrainState, int, Any]:
    """(state, step, polished statistics or None) of the latest checkpoint (``config.resume``: "latest" or
    "latest_good"), with `batches` set to where that run's data iterator stood; the fresh state at step 0
    when there is none.

    Raises:
      CheckpointError: the checkpoint does not match this config (what differs) or cannot be read (step).
    """
    restored = checkpoint.restore(mgr, state, _checkpoint_extras(exp, state), batches,
                                  resume=exp.config.get("resume", "latest"))
    if restored is None:
        return state, 0, None
    state, extra, step = restored
    if pipeline.position(batches) != step:
        raise CheckpointError("checkpoint step", step, f"its data iterator stands at batch "
                              f"{pipeline.position(batches)}; the checkpoint is inconsistent")
    _say(f"resumed from the checkpoint at step {step}")
    return state, step, extra["polished_batch_stats"] if int(extra["polished"]) else None


def _step_inputs(exp: Experiment, batches, start_step: int, end_step: int):
    """Yields ``(step number after the update, images, labels, example weights, K or None)`` per update.

    Images are augmented with a key folded from the step, except in the last ``polish.no_augment_epochs``
    epochs of the "no_augment_epochs" and "both" polish modes (un-augmented training images).
    """
    config, hp = exp.config, exp.hp
    no_aug_from = hp.total_steps + 1
    if config.polish.mode in ("no_augment_epochs", "both"):
        no_aug_from = max(0, hp.total_steps - int(round(config.polish.no_augment_epochs * hp.steps_per_epoch)))
    base_key = jax.random.key(config.seed + 1)
    # Unit example weights, placed on the devices once (not every step) when the mini-batch is not emulated.
    ones = parallel.shard_batch({"w": np.ones(hp.global_batch // jax.process_count(), np.float32)}, exp.mesh)["w"]

    for step in range(start_step, end_step):
        arrays = parallel.shard_batch(next(batches), exp.mesh)
        key = jax.random.fold_in(base_key, step)
        if step >= no_aug_from:
            images = exp.eval_preprocess(arrays["image"])
        else:
            images = exp.train_preprocess(key, arrays["image"])
        weights, k = exp.weights_fn(jax.random.fold_in(key, 1)) if exp.weights_fn is not None else (ones, None)
        yield step + 1, images, arrays["label"], weights, k


def _final_polish(exp: Experiment, state: TrainState, step: int, polished_stats, last_eval: dict,
                  writer: metrics_lib.MetricWriter) -> tuple[dict, float, Any]:
    """Final Polishing after the last update (``polish.mode`` "recompute" or "both"); evaluates with it."""
    if exp.config.polish.mode not in ("recompute", "both") or step != exp.hp.total_steps:
        return {}, float("nan"), polished_stats
    t0 = time.time()
    info: dict = {}
    if polished_stats is None:
        polished_stats = exp.polish(state, info)
    seconds = time.time() - t0
    _check_finite(step, "polished_batch_stats", polished_stats)
    polished_eval = _evaluate(exp, step, {"params": state.params, "batch_stats": polished_stats},
                              "eval_polished_loss")
    writer.write(step, {f"eval_polished_{k}": v for k, v in polished_eval.items()})
    _say(f"final polishing: eval accuracy {100 * last_eval['accuracy']:.2f}% (EMA statistics) -> "
         f"{100 * polished_eval['accuracy']:.2f}% (recomputed statistics; {info.get('passes', 0)} passes "
         f"in {seconds:.1f} s)")
    return polished_eval, seconds, polished_stats


def _check_finite(step: int, name: str, tree) -> None:
    for path, leaf in checkpoint.named_leaves(jax.device_get(tree)):
        bad = ~np.isfinite(np.asarray(leaf))
        if bad.any():
            raise NonFiniteError(step, f"{name}/{path}", float(np.asarray(leaf)[bad].ravel()[0]))


def _summary(exp: Experiment, step: int, window: metrics_lib.Window, last_eval: dict, polished_eval: dict,
             polish_time: float, wall_time: float) -> dict[str, Any]:
    config, hp = exp.config, exp.hp
    step_time = window.seconds / window.timed if window.timed else float("nan")
    summary = {
        "dataset": config.dataset, "model": config.model, "devices": exp.mesh.size,
        "global_batch": hp.global_batch, "steps": step, "epochs": step / hp.steps_per_epoch,
        "peak_lr": hp.peak_lr, "final_train_loss": window.last.get("train_loss", float("nan")),
        "eval_accuracy": last_eval["accuracy"], "eval_loss": last_eval["loss"],
        "polish_mode": config.polish.mode,
        "eval_polished_accuracy": polished_eval.get("accuracy", float("nan")),
        "eval_polished_loss": polished_eval.get("loss", float("nan")),
        "polish_time_s": polish_time,
        "step_time_s": step_time, "images_per_s": hp.global_batch / step_time if window.timed else float("nan"),
        "wall_time_s": wall_time,
    }
    summary.update({k: v.tolist() for k, v in window.hists.items()})
    if window.noise is not None:
        summary["noise_scale"] = noise.report(
            window.noise, config.noise_scale.num_windows, model=config.model, dataset=config.dataset,
            image_size=config.image_size, global_batch=hp.global_batch, num_small=exp.mesh.size * hp.accum_steps,
            steps_per_epoch=hp.steps_per_epoch)
    return summary
