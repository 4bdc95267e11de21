"""`run(config, workdir)`: a SPRINT run on this host (and, under ``jax.distributed``, across hosts).

What a run does, in order:
  1. `validate_config` (nothing is read or written before it passes);
  2. builds the data, the model (learners' copy with BN momentum 0, see `jaxsprint.runtime.learner`), the
     optimizer and schedule (`jaxsprint.runtime.updater.nominal_hparams`), the flat initial weights
     (``model.init(key(sprint.seed))``, as ``trainer.create_train_state`` does), and compiles the gradient
     program on every learner device and the update program, before the clock starts;
  3. with several processes, a barrier; then every host's clock starts (t = 0);
  4. starts the learner threads and the updater thread; the calling thread evaluates the published weights
     every ``eval_every_updates`` updates (a snapshot, while the learners go on) and watches for errors.
     With ``sprint.eval_deferred`` the updater only keeps the weights of every version that is a multiple
     of ``eval_every_updates`` and they are evaluated after the run: the evaluation then takes no core from
     the learners and the updater (on a small host it otherwise lengthens the updater's cycle several
     times over, and with it changes the staleness being measured), and each is at exactly that version;
  5. after the updater's last cycle: stops and joins the learners (each finishes the gradient it is
     computing and adds it), then swaps the buffer a last time: those gradients are IN FLIGHT (applied
     version -1), so gradients computed = applied + in flight, exactly;
  6. gathers every host's gradient records and host 0's update times (bit-exact), evaluates the final
     weights (optionally after Final Polishing, ``polish.mode = "recompute"``), and process 0 writes
     ``events.npz``, ``summary.json`` and an orbax checkpoint of the last state (``checkpoints/<updates>``,
     the trainer's layout: see `jaxsprint.train.checkpoint`, and docs/sprint-runtime.md, "Checkpoints").
A thread that raises stops the run: the other threads are joined (bounded by ``sprint.join_timeout_s``) and
the error is re-raised here.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from jaxsprint import paths
from jaxsprint.train import checkpoint, cpu, models, optim, pipeline, polish, trainer
from jaxsprint.train import data as data_lib
from jaxsprint.errors import check, is_int, is_real
from jaxsprint.runtime import bounds, collective as collective_lib
from jaxsprint.runtime.buffer import Control, NodeBuffer, Published
from jaxsprint.runtime.learner import POLL_S, Learner, SubBatches, make_gradient_fn
from jaxsprint.runtime.updater import StopRule, Updater, make_apply_fn, nominal_hparams

POLISH_MODES = ("none", "recompute")
UPDATER_DEVICES = ("shared", "own")  # config.sprint.updater_device
# The most the weights kept for deferred evaluation (``sprint.eval_deferred``) may take in host memory.
DEFERRED_EVAL_MAX_BYTES = 4 * 2**30


@dataclasses.dataclass
class RunResult:
    """What `run` returns (the same on every host, except `process_index`)."""

    events: dict[str, np.ndarray]       # what was written to workdir/events.npz
    eval: dict[str, float]              # last evaluation of the published weights (accuracy, loss)
    params_flat: np.ndarray             # final published weights, one float32 vector
    updates: int                        # published versions
    gradients: int                      # gradients computed, all hosts
    in_flight: int                      # of those, not applied at the stop
    wall_s: float                       # from the common start to the last publish
    process_index: int
    num_processes: int
    batch_stats_flat: np.ndarray | None = None          # final running statistics (EMA), flat
    eval_polished: dict[str, float] = dataclasses.field(default_factory=dict)  # after Final Polishing
    eval_history: list[tuple[int, dict[str, float]]] = dataclasses.field(default_factory=list)  # (version, eval)
    updater_device_id: int = -1          # id of the device the updater's programs ran on (this host)
    learner_device_ids: tuple[int, ...] = ()  # ids of the devices this host's learners ran on


def validate_config(config, num_local_devices: int) -> None:
    """Checks a SPRINT config (``experiments/configs/sprint.py``); reads and writes nothing.

    Checks the data, model, CPU-switch and optimizer fields as training does, ``polish.mode`` (``none`` or
    ``recompute``), and ``config.sprint``: ``learners_per_host`` (None or an integer >= 1), ``devices`` (None or
    1..local devices), ``updater_device`` (``shared``, or ``own`` with ``devices`` below the local devices),
    ``sub_batch`` (an integer >= 1, at most the training-set share of a host for the built-in datasets), ``network_time_s``
    and ``warmup_s`` (finite, >= 0), ``lockstep`` (bool), ``duration_s`` / ``num_updates`` / ``num_epochs``
    (each >= 0, at least one > 0), ``eval_every_updates`` and ``schedule_updates`` (integers >= 0 / >= 1),
    ``eval_deferred`` (bool; True needs ``num_updates`` > 0, so that the kept weights are bounded),
    ``seed`` (an integer in [0, 2^31)), ``join_timeout_s`` (> 0), ``init_timeout_s`` (an integer >= 1); then
    what the host can start (`jaxsprint.runtime.bounds`: learner threads, memory, times).

    Raises:
      ConfigError: naming the first bad field.
    """
    check(is_int(num_local_devices) and num_local_devices >= 1, "num_local_devices", num_local_devices,
          "an integer >= 1")
    check("sprint" in config, "config.sprint", None, "a SPRINT config (see experiments/configs/sprint.py)")
    data_lib.validate_config(config)
    models.validate_config(config)
    cpu.validate_config(config)
    optim.validate_config(config)
    check(config.polish.mode in POLISH_MODES, "config.polish.mode", config.polish.mode,
          f"allowed in a SPRINT run: {', '.join(POLISH_MODES)}")
    if config.polish.mode == "recompute":
        polish.validate_config(config, 1)
    s = config.sprint
    lph = s.learners_per_host
    check(lph is None or (is_int(lph) and lph >= 1), "config.sprint.learners_per_host", lph,
          "None (one per local device) or an integer >= 1")
    nd = s.get("devices")
    check(nd is None or (is_int(nd) and 1 <= nd <= num_local_devices), "config.sprint.devices", nd,
          f"None (every local device) or an integer in [1, {num_local_devices}]")
    where = s.get("updater_device", "shared")
    check(where in UPDATER_DEVICES, "config.sprint.updater_device", where, f"one of {', '.join(UPDATER_DEVICES)}")
    if where == "own":
        check(nd is not None and nd < num_local_devices, "config.sprint.devices", nd,
              f"an integer in [1, {num_local_devices - 1}] with updater_device='own' (the last of the "
              f"{num_local_devices} local devices is the updater's, no learner may use it)")
    check(is_int(s.sub_batch) and s.sub_batch >= 1, "config.sprint.sub_batch", s.sub_batch, "an integer >= 1")
    for name in ("network_time_s", "warmup_s"):
        check(is_real(s[name]) and s[name] >= 0, f"config.sprint.{name}", s[name], "a finite number >= 0")
    check(isinstance(s.lockstep, bool), "config.sprint.lockstep", s.lockstep, "True or False")
    check(is_real(s.duration_s) and s.duration_s >= 0, "config.sprint.duration_s", s.duration_s,
          "a finite number of seconds > 0 (0: not used)")
    check(is_int(s.num_updates) and s.num_updates >= 0, "config.sprint.num_updates", s.num_updates,
          "an integer >= 0 (0: not used)")
    check(is_real(s.num_epochs) and s.num_epochs >= 0, "config.sprint.num_epochs", s.num_epochs,
          "a finite number >= 0 (0: not used)")
    if s.num_updates == 0 and s.num_epochs == 0:
        check(s.duration_s > 0, "config.sprint.duration_s", s.duration_s,
              "a number of seconds > 0 (it is the only stop: num_updates and num_epochs are 0)")
    check(is_int(s.eval_every_updates) and s.eval_every_updates >= 0, "config.sprint.eval_every_updates",
          s.eval_every_updates, "an integer >= 0 (0: only at the end)")
    deferred = s.get("eval_deferred", False)
    check(isinstance(deferred, bool), "config.sprint.eval_deferred", deferred, "True or False")
    if deferred:
        check(s.num_updates > 0, "config.sprint.num_updates", s.num_updates,
              "an integer >= 1 with eval_deferred=True (the weights kept for evaluation must be bounded)")
    check(is_int(s.schedule_updates) and s.schedule_updates >= 1, "config.sprint.schedule_updates",
          s.schedule_updates, "an integer >= 1")
    check(is_int(s.seed) and 0 <= s.seed < 2**31, "config.sprint.seed", s.seed, "an integer in [0, 2^31)")
    check(isinstance(s.checkpoint, bool), "config.sprint.checkpoint", s.checkpoint, "True or False")
    check(is_real(s.join_timeout_s) and s.join_timeout_s > 0, "config.sprint.join_timeout_s", s.join_timeout_s,
          "a finite number of seconds > 0")
    check(is_int(s.init_timeout_s) and s.init_timeout_s >= 1, "config.sprint.init_timeout_s", s.init_timeout_s,
          "an integer number of seconds >= 1")
    eb = config.eval_batch_size
    check(is_int(eb) and eb >= 1, "config.eval_batch_size", eb, "an integer >= 1")
    bounds.check_host(config, num_local_devices)  # threads, memory and times this host can hold


@dataclasses.dataclass
class _Built:
    dataset: Any
    model: Any
    tx: Any
    grad_fn: Callable
    apply_fn: Callable
    params: Any            # flat, on the updater's device
    opt_state: Any
    stats: Any             # flat, on the updater's device
    unravel_params: Callable
    unravel_stats: Callable
    eval_step: Callable
    eval_preprocess: Callable
    accel: Any


def _build(config, device) -> _Built:
    s = config.sprint
    accel = cpu.acceleration(config.cpu_kernels)
    dataset = data_lib.load_dataset(config)
    check(s.sub_batch * jax.process_count() <= dataset.num_train, "config.sprint.sub_batch", s.sub_batch,
          f"at most the training-set size {dataset.num_train} / the host count {jax.process_count()}")
    learners = (s.learners_per_host or len(jax.local_devices())) * jax.process_count()
    hp = nominal_hparams(config, dataset.num_train, learners)
    tx = optim.make_optimizer(config, optim.make_schedule(config, hp))
    kwargs = dict(num_classes=dataset.num_classes, dtype=config.dtype, bn_epsilon=config.bn.epsilon,
                  bn_group_size=None, zero_init_last_bn=config.zero_init_last_bn, **accel.model_kwargs())
    model = models.create_model(config.model, bn_momentum=0.0, **kwargs)
    shape = (1, config.image_size, config.image_size, dataset.channels)
    with jax.default_device(device):
        variables = jax.jit(lambda k: model.init(k, jnp.zeros(shape, jnp.float32), train=False))(
            jax.random.key(s.seed))
        params_flat, unravel_params = ravel_pytree(variables["params"])
        stats_tree = variables.get("batch_stats", {})
        stats_flat, unravel_stats = ravel_pytree(stats_tree)
        stats_flat = jnp.asarray(stats_flat, jnp.float32)
        opt_state = jax.jit(tx.init)(variables["params"])
    train_pre, eval_pre = data_lib.make_preprocess_fns(config, dataset)
    grad_fn = jax.jit(make_gradient_fn(model=model, num_classes=dataset.num_classes,
                                       label_smoothing=config.label_smoothing, unravel_params=unravel_params,
                                       batch_stats=jax.device_get(stats_tree), preprocess=train_pre,
                                       seed=s.seed), compiler_options=accel.compiler_options)
    apply_fn = jax.jit(make_apply_fn(tx=tx, unravel_params=unravel_params, num_params=params_flat.size,
                                     num_stats=stats_flat.size, bn_momentum=float(config.bn.momentum)))
    eval_step = jax.jit(trainer.make_eval_step(model=model, num_classes=dataset.num_classes),
                        compiler_options=accel.compiler_options)
    return _Built(dataset=dataset, model=model, tx=tx, grad_fn=grad_fn, apply_fn=apply_fn, params=params_flat,
                  opt_state=opt_state, stats=stats_flat, unravel_params=unravel_params,
                  unravel_stats=unravel_stats, eval_step=eval_step, eval_preprocess=jax.jit(eval_pre),
                  accel=accel)


def _variables(b: _Built, params_flat, stats_flat) -> dict:
    return {"params": b.unravel_params(jnp.asarray(params_flat)),
            "batch_stats": b.unravel_stats(jnp.asarray(stats_flat, jnp.float32))}


def _evaluate(config, b: _Built, variables, device) -> dict[str, float]:
    """Top-1 accuracy and loss of `variables` over the whole test split, on one device (every host alike)."""
    totals = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
    variables = jax.device_put(variables, device)
    for batch in pipeline.eval_iterator(b.dataset.test, global_batch=config.eval_batch_size, process_index=0,
                                        process_count=1):
        x = b.eval_preprocess(jax.device_put(batch["image"], device))
        out = b.eval_step(variables, x, jax.device_put(batch["label"], device), jax.device_put(batch["mask"], device))
        for k, v in jax.device_get(out).items():
            totals[k] += float(v)
    n = max(totals["count"], 1.0)
    return {"accuracy": totals["correct"] / n, "loss": totals["loss_sum"] / n}


def _polish(config, b: _Built, variables) -> dict:
    p = config.polish
    order = pipeline.polish_indices(config.sprint.seed, b.dataset.num_train, p.num_samples)
    bsz = p.batch_size or config.eval_batch_size
    batches = [{"image": x["image"], "mask": x["mask"]}
               for x in pipeline.eval_iterator(b.dataset.train, global_batch=bsz, indices=order, process_index=0,
                                               process_count=1)]
    return polish.recompute_batch_stats(b.model, variables, batches, num_samples=None, num_passes=p.num_passes,
                                        preprocess=b.eval_preprocess)


def _events(config, updater: Updater, in_flight: list, col, num_hosts: int, dataset_size: int,
            lph: int) -> dict[str, np.ndarray]:
    """The event log (schema: docs of `jaxsprint.runtime.events`), merged over hosts."""
    rows = [(r.learner, r.host, r.read_version, v, r.t_start, r.t_end)
            for v, recs in updater.applied for r in recs]
    rows += [(r.learner, r.host, r.read_version, -1, r.t_start, r.t_end) for r in in_flight]
    grads = np.asarray(rows, np.float64).reshape(-1, 6)
    ups = np.asarray(updater.updates, np.float64).reshape(-1, 4)
    if col is not None:
        parts = col.gather(grads)
        grads = np.concatenate(parts)
        ups = col.gather(ups)[0]  # host 0's clock
        applied = grads[:, 3]
        # in order of application (then the in-flight ones), hosts in turn within an update
        key = np.where(applied < 0, np.inf, applied)
        grads = grads[np.argsort(key, kind="stable")]
    s = config.sprint
    return {
        "grad_learner": grads[:, 0].astype(np.int32), "grad_host": grads[:, 1].astype(np.int32),
        "grad_read_version": grads[:, 2].astype(np.int64), "grad_applied_version": grads[:, 3].astype(np.int64),
        "grad_t_start": grads[:, 4].copy(), "grad_t_end": grads[:, 5].copy(),
        "update_version": ups[:, 0].astype(np.int64), "update_count": ups[:, 1].astype(np.int64),
        "update_t_start": ups[:, 2].copy(), "update_t_end": ups[:, 3].copy(),
        "warmup_until_s": np.float64(s.warmup_s), "t_stop_s": np.float64(ups[-1, 3] if len(ups) else updater.t_stop),  # host 0's last publish
        "learners_per_host": np.int64(lph), "num_hosts": np.int64(num_hosts), "sub_batch": np.int64(s.sub_batch),
        "dataset_size": np.int64(dataset_size), "network_time_s": np.float64(s.network_time_s),
        "lockstep": np.int64(int(s.lockstep)),
    }


def _save_checkpoint(workdir, b: _Built, step: int, variables: dict, opt_state, polished) -> None:
    """The last state as the trainer checkpoints it (`jaxsprint.train.checkpoint`): item ``train_state`` =
    ``{"state": TrainState (step = updates, params, the updater's optimizer state, its running statistics),
    "polished_batch_stats", "polished"}``, no iterator item; written by this process alone (every host holds
    the same weights)."""
    state = trainer.TrainState(step=np.asarray(step, np.int32), apply_fn=b.model.apply, params=variables["params"],
                               tx=b.tx, opt_state=opt_state, batch_stats=variables["batch_stats"])
    extra = {"polished_batch_stats": polished if polished is not None else variables["batch_stats"],
             "polished": np.asarray(int(polished is not None), np.int32)}
    checkpoint.save_from_this_process(workdir, step, state, extra)


def run(config, workdir: str, *, learner_time_fn: Callable[[int, int], float] | None = None) -> RunResult:
    """Runs SPRINT as `config` says and writes the event log, a summary and the last weights to `workdir`.

    Under ``jax.distributed`` (one process per host; `jaxsprint.cluster.initialize`) every
    process calls it with the same config; their updaters all-reduce each cycle and end with identical
    weights. See the module docstring for the steps and `RunResult` for what comes back.

    Args:
      config: a SPRINT config (``experiments/configs/sprint.py``).
      workdir: output directory, a local path or a URI (created; process 0 writes).
      learner_time_fn: test hook ``(global learner index, gradient index) -> seconds``: each learner's cycle
        lasts exactly that long (used with tiny models whose compute is far below it).

    Raises:
      ConfigError: a bad config (before anything is read or written).
      Exception: the first error a learner or the updater raised (the other threads are joined first).
    """
    local = jax.local_devices()
    validate_config(config, len(local))
    s = config.sprint
    num_hosts, host = jax.process_count(), jax.process_index()
    lph = s.learners_per_host or len(local)
    learner_devices = local[:s.get("devices") or len(local)]
    placed = [learner_devices[j % len(learner_devices)] for j in range(lph)]  # learner j's device (round-robin)
    own = s.get("updater_device", "shared") == "own"
    col = collective_lib.HostCollective(last_device=own) if num_hosts > 1 else None
    device = col.device if col is not None else local[-1 if own else 0]
    b = _build(config, device)
    control, published = Control(), Published(b.params, np.asarray(b.stats))
    width = b.params.size + b.stats.size + 2
    every = int(s.eval_every_updates)
    snapshot_every = every if s.get("eval_deferred", False) else 0
    if snapshot_every:
        kept = (int(s.num_updates) // every) * (b.params.size + b.stats.size) * 4
        check(kept <= DEFERRED_EVAL_MAX_BYTES, "config.sprint.eval_every_updates", every,
              f"with eval_deferred=True the kept weights, {kept / 2**30:.2f} GiB for num_updates="
              f"{s.num_updates}, must fit in {DEFERRED_EVAL_MAX_BYTES / 2**30:.0f} GiB: a larger interval, "
              "fewer updates or eval_deferred=False")
    buffer = NodeBuffer(width)
    data = SubBatches(b.dataset.train, seed=s.seed, sub_batch=s.sub_batch, host=host, num_hosts=num_hosts)
    t0 = [0.0]
    clock = lambda: time.perf_counter() - t0[0]  # noqa: E731
    learners = [Learner(index=host * lph + j, host=host, device=placed[j],
                        gradient_fn=b.grad_fn, data=data, buffer=buffer, published=published, control=control, clock=clock,
                        lockstep=s.lockstep, time_fn=learner_time_fn) for j in range(lph)]
    example = b.dataset.train.get_batch(data.indices(0))
    example = {"image": np.asarray(example["image"], np.uint8), "label": np.asarray(example["label"], np.int32)}
    for lr in learners[:len(learner_devices)]:
        lr.warm_up(b.params, example)
    dummy = np.zeros(width, np.float32)
    jax.block_until_ready(b.apply_fn(b.params, b.opt_state, b.stats, dummy, 1))  # compile; result dropped
    stop_rule = StopRule(duration_s=float(s.duration_s), num_updates=int(s.num_updates),
                         max_examples=float(s.num_epochs) * b.dataset.num_train)
    updater = Updater(apply_fn=b.apply_fn, params=b.params, opt_state=b.opt_state, stats=b.stats, buffer=buffer,
                      published=published, control=control, collective=col, clock=clock, stop_rule=stop_rule,
                      sub_batch=s.sub_batch, network_time_s=float(s.network_time_s), lockstep=s.lockstep,
                      local_learners=lph, snapshot_every=snapshot_every)
    if col is not None:
        col.allreduce(np.zeros(width + 3, np.float32))  # compiles the cycle's all-reduce
        col.barrier()
    threads = [threading.Thread(target=lr.run, name=f"sprint-learner-{lr.index}", daemon=True) for lr in learners]
    upd_thread = threading.Thread(target=updater.run, name="sprint-updater", daemon=True)
    t0[0] = time.perf_counter()
    for t in threads:
        t.start()
    upd_thread.start()

    history: list[tuple[int, dict[str, float]]] = []
    next_eval = every
    while upd_thread.is_alive():
        upd_thread.join(POLL_S)
        version, params, stats = published.current
        if every and not snapshot_every and version >= next_eval and control.error is None and upd_thread.is_alive():
            history.append((version, _evaluate(config, b, _variables(b, params, stats), device)))
            next_eval = (version // every + 1) * every
    control.stop.set()
    published.wake()
    deadline = time.perf_counter() + float(s.join_timeout_s)
    for t in threads:
        t.join(max(0.0, deadline - time.perf_counter()))
    stuck = [t.name for t in threads if t.is_alive()]
    if control.error is not None:
        raise control.error
    if updater.remote_failure:
        raise RuntimeError("a thread on another host failed; this host stopped with it")
    if stuck:
        raise RuntimeError(f"learner threads {stuck} did not stop within sprint.join_timeout_s="
                           f"{s.join_timeout_s} s")
    in_flight = buffer.swap().records
    events = _events(config, updater, in_flight, col, num_hosts, b.dataset.num_train, lph)

    params_flat = np.asarray(updater.params)
    stats_flat = np.asarray(updater.stats)
    variables = _variables(b, params_flat, stats_flat)
    for version, params, stats in updater.snapshots:
        if version < updater.version:  # the last version is the final evaluation's
            history.append((version, _evaluate(config, b, _variables(b, params, stats), device)))
    updater.snapshots.clear()
    final_eval = _evaluate(config, b, variables, device)
    history.append((updater.version, final_eval))
    polished, polished_stats = {}, None
    if config.polish.mode == "recompute" and stats_flat.size:
        polished_stats = _polish(config, b, variables)
        polished = _evaluate(config, b, {"params": variables["params"], "batch_stats": polished_stats}, device)
    gradients = int(events["grad_learner"].size)
    n_flight = int(np.sum(events["grad_applied_version"] < 0))
    result = RunResult(events=events, eval=final_eval, params_flat=params_flat, updates=updater.version,
                       gradients=gradients, in_flight=n_flight, wall_s=float(updater.t_stop),
                       process_index=host, num_processes=num_hosts, batch_stats_flat=stats_flat,
                       eval_polished=polished, eval_history=history, updater_device_id=int(device.id),
                       learner_device_ids=tuple(int(d.id) for d in placed))
    if host == 0:
        out = paths.as_path(workdir)
        out.mkdir(parents=True, exist_ok=True)
        with (out / "events.npz").open("wb") as f:
            np.savez(f, **events)
        summary = {"updates": result.updates, "gradients": gradients, "in_flight": n_flight,
                   "wall_s": result.wall_s, "eval": final_eval, "eval_polished": polished,
                   "eval_history": [{"version": v, **e} for v, e in history],
                   "learners_per_host": lph, "num_hosts": num_hosts, "sub_batch": int(s.sub_batch),
                   "updater_device_id": result.updater_device_id,
                   "learner_device_ids": list(result.learner_device_ids),
                   "model": config.model, "dataset": config.dataset}
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        if s.checkpoint:
            _save_checkpoint(workdir, b, updater.version, variables, updater.opt_state, polished_stats)
    return result
