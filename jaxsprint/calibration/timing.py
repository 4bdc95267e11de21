"""Timing this machine for the performance model: real train steps and real all-reduces.

The measurements that :func:`jaxsprint.calibration.model_fit.fit` turns into machine figures. This module sits
outside :mod:`jaxsprint.perf` on purpose: the model stays pure jnp and imports nothing of the training
stack, while timing a step needs the project's models and train step (:mod:`jaxsprint.train.models`,
:mod:`jaxsprint.train.trainer`, the CPU switch of :mod:`jaxsprint.train.cpu`).

* :func:`measure_train_steps`: process CPU seconds of the project's jitted train step (momentum SGD) for
  ``(model, batch)`` pairs, interleaved rounds, best round's median.
* :func:`runtime_network`: the cost table of a SPRINT config's network (what the ``cpu_runtime`` preset is
  calibrated on and predicts with).
* :func:`measure_gradient_steps`: wall seconds of one runtime learner's gradient (the runtime's own jitted
  gradient function, result copied to the host) at several sub-batches; :func:`measure_gradient_cores`: the
  cores that gradient keeps busy (process CPU time over wall time).
* :func:`gradient_function`: that gradient, its parameters and dataset, as the runtime builds them;
  :func:`measure_input_draws`: wall seconds of one runtime learner's input draw (its host work per sample);
  :func:`lone_step_probe`: that gradient compiled once and timed again whenever asked (the machine's speed now).
* :func:`measure_allreduce`: wall seconds of a ``psum`` over 2 or more local JAX processes joined by
  :func:`jax.distributed.initialize` (gloo CPU collectives, localhost ports only, bounded timeouts).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsprint import subprocs
from jaxsprint.errors import ConfigError, check
from jaxsprint.calibration.measurements import gradient_step_seconds
from jaxsprint.calibration.model_fit import AllreduceTiming

__all__ = ["gradient_function", "lone_step_probe", "measure_allreduce", "measure_gradient_cores",
           "measure_gradient_steps", "measure_input_draws", "measure_train_steps", "merge_lone_steps",
           "runtime_network"]


def _interleaved_rounds(runners, *, rounds: int, min_time_s: float, min_reps: int, log
                        ) -> list[tuple[float, list[float]]]:
    """Times every runner in each of ``rounds`` interleaved rounds (so drift hits all alike): per round at
    least ``min_reps`` calls and ``min_time_s`` seconds; returns (best per-round median, all samples)."""
    best = [math.inf] * len(runners)
    samples: list[list[float]] = [[] for _ in runners]
    for r in range(rounds):
        for i, once in enumerate(runners):
            times, start = [], time.perf_counter()
            while time.perf_counter() - start < min_time_s or len(times) < min_reps:
                times.append(once())
            samples[i] += times
            best[i] = min(best[i], float(np.median(times)))
        if log:
            log(f"round {r + 1}/{rounds} done")
    return list(zip(best, samples))


def measure_train_steps(configs: Sequence[tuple[str, int]], *, rounds: int = 4, min_time_s: float = 0.2,
                        min_reps: int = 3, image_size: int = 32, cpu_kernels: str = "auto",
                        log: Callable[[str], object] | None = None) -> list[tuple[float, list[float]]]:
    """Process CPU seconds of train steps of this project's models.

    Each ``(model name, batch)`` is :func:`jaxsprint.train.trainer.make_train_step` with momentum SGD (5 passes over
    the parameters in the update), jitted, on one device. All steps are compiled first; then ``rounds``
    rounds go over all of them in turn (interleaved, so that a burst of other work on a shared machine hits
    every configuration in some rounds only), each timing a step until ``min_time_s`` and ``min_reps`` are
    reached and keeping the median. The result of a configuration is its best round (other work only ever
    adds time).

    Args:
      configs: ``(model name of jaxsprint.train.models, batch size)`` pairs.
      rounds: Interleaved rounds.
      min_time_s: Time each configuration at least this long per round.
      min_reps: Steps timed per configuration and round, at least.
      image_size: Input height and width (CIFAR: 32).
      cpu_kernels: The CPU switch of training (:func:`jaxsprint.train.cpu.acceleration`): "auto" and "require"
        time the custom-VJP convolution and native kernels that training runs on CPU, "off" XLA's own.
      log: Optional ``print``-like callable for progress lines.

    Returns:
      ``[(seconds, all samples)]`` in the order of ``configs``.

    Raises:
      ConfigError: ``rounds`` or ``min_reps`` below 1, an unknown ``cpu_kernels`` mode.
    """
    check(int(rounds) >= 1, "rounds", rounds, "an integer >= 1")
    check(int(min_reps) >= 1, "min_reps", min_reps, "an integer >= 1")
    # Imported here, not at the top: refits and all-reduce timings do not need the training stack.
    import optax

    from jaxsprint.train import cpu, models, trainer

    accel = cpu.acceleration(cpu_kernels, field="cpu_kernels")
    if log:
        log(accel.describe())
    runners = []
    for name, batch in configs:
        model = models.create_model(name, num_classes=10, **accel.model_kwargs())
        step = jax.jit(trainer.make_train_step(model=model, num_classes=10),
                       compiler_options=accel.compiler_options)
        state = trainer.create_train_state(jax.random.PRNGKey(0), model, optax.sgd(0.1, momentum=0.9),
                                         (1, image_size, image_size, 3))
        x = jnp.ones((batch, image_size, image_size, 3), jnp.float32)
        y = jnp.zeros((batch,), jnp.int32)

        def once(holder=[state], step=step, x=x, y=y) -> float:  # noqa: B006 (per-step state)
            t = time.process_time()
            holder[0], metrics = step(holder[0], x, y)
            jax.block_until_ready(metrics)
            return time.process_time() - t

        once(), once()  # compile, warm up
        runners.append(once)
        if log:
            log(f"compiled {name} batch {batch}")
    return _interleaved_rounds(runners, rounds=rounds, min_time_s=min_time_s, min_reps=min_reps, log=log)


def runtime_network(config):
    """The :class:`~jaxsprint.perf.networks.NetworkCost` of a SPRINT config's network.

    The two-row XLA table (:func:`jaxsprint.perf.networks.from_flax`) of ``config.model`` at
    ``config.image_size`` with the dataset's channels and classes, BatchNorm in training mode: the table the
    ``cpu_runtime`` preset's compute figures are fitted on, so that calibration and prediction share it.
    """
    from jaxsprint.train import data, models
    from jaxsprint.perf import networks

    dataset = data.load_dataset(config)
    model = models.create_model(config.model, num_classes=dataset.num_classes, dtype=config.dtype)
    shape = (int(config.image_size), int(config.image_size), int(dataset.channels))
    return networks.from_flax(model, shape, name=config.model, apply_kwargs={"train": True})


def gradient_function(config):
    """``(gradient, flat parameters, dataset)``: the runtime learner's jitted gradient function of ``config``
    (:func:`jaxsprint.runtime.learner.make_gradient_fn` with the CPU switch), the initial parameters it takes
    and the loaded dataset, as the runtime builds them."""
    from jax.flatten_util import ravel_pytree

    from jaxsprint.train import cpu, data, models
    from jaxsprint.runtime import learner

    dataset = data.load_dataset(config)
    accel = cpu.acceleration(config.cpu_kernels)
    model = models.create_model(config.model, num_classes=dataset.num_classes, dtype=config.dtype, bn_momentum=0.0,
                                bn_epsilon=config.bn.epsilon, zero_init_last_bn=config.zero_init_last_bn,
                                **accel.model_kwargs())
    shape = (1, config.image_size, config.image_size, dataset.channels)
    variables = model.init(jax.random.key(0), jnp.zeros(shape, jnp.float32), train=False)
    params_flat, unravel = ravel_pytree(variables["params"])
    train_pre, _ = data.make_preprocess_fns(config, dataset)
    fn = jax.jit(learner.make_gradient_fn(model=model, num_classes=dataset.num_classes,
                                          label_smoothing=config.label_smoothing, unravel_params=unravel,
                                          batch_stats=jax.device_get(variables.get("batch_stats", {})),
                                          preprocess=train_pre, seed=0), compiler_options=accel.compiler_options)
    return fn, params_flat, dataset


def _check_sub_batches(sub_batches: Sequence[int], dataset) -> None:
    for b in sub_batches:
        check(isinstance(b, int) and 1 <= b <= dataset.num_train, "sub_batches", b,
              f"integers in 1..{dataset.num_train} (the training set)")


def _gradient_runner(config, sub_batches: Sequence[int]) -> list[Callable[[], float]]:
    """One ``once() -> wall seconds`` per sub-batch: the runtime learner's jitted gradient, result to the host."""
    fn, params_flat, dataset = gradient_function(config)
    _check_sub_batches(sub_batches, dataset)
    runners = []
    for b in sub_batches:
        batch = dataset.train.get_batch(np.arange(b))
        images = np.asarray(batch["image"], np.uint8)
        labels = np.asarray(batch["label"], np.int32)

        def once(images=images, labels=labels) -> float:
            t = time.perf_counter()
            np.asarray(fn(params_flat, images, labels, np.zeros(2, np.int32)))
            return time.perf_counter() - t

        once(), once()  # compile, warm up
        runners.append(once)
    return runners


def measure_gradient_steps(config, sub_batches: Sequence[int], *, rounds: int = 3, min_time_s: float = 0.2,
                           min_reps: int = 3, log: Callable[[str], object] | None = None
                           ) -> list[tuple[float, list[float]]]:
    """Wall seconds of one runtime learner's gradient at each sub-batch, alone on one device.

    The runtime's own gradient function (:func:`jaxsprint.runtime.learner.make_gradient_fn`: augmentation,
    forward and backward of ``config.model``, BatchNorm over the sub-batch), jitted with the CPU switch of
    ``config.cpu_kernels``, its result copied to the host as a learner does. Rounds are interleaved over the
    sub-batches and each keeps its best round's median (see :func:`measure_train_steps`); every sample is
    returned too (a learner's MEAN cycle is made of all of them: the runtime calibration fits their mean).
    Wall time, not CPU time: a learner's cycle is wall time, and one learner alone may use several cores
    (:func:`measure_gradient_cores`).

    Args:
      config: A SPRINT config (``experiments/configs/sprint.py``): model, data, image size, CPU kernels.
      sub_batches: Sub-batch sizes.
      rounds, min_time_s, min_reps: As :func:`measure_train_steps`.
      log: Optional ``print``-like callable for progress lines.

    Returns:
      ``[(seconds, all samples)]`` in the order of ``sub_batches``.

    Raises:
      ConfigError: ``rounds`` or ``min_reps`` below 1, a sub-batch below 1 or above the training set.
    """
    check(int(rounds) >= 1, "rounds", rounds, "an integer >= 1")
    check(int(min_reps) >= 1, "min_reps", min_reps, "an integer >= 1")
    runners = _gradient_runner(config, sub_batches)
    if log:
        log(f"compiled the gradient at sub-batches {list(sub_batches)}")
    return _interleaved_rounds(runners, rounds=rounds, min_time_s=min_time_s, min_reps=min_reps, log=log)


def lone_step_probe(config, sub_batch: int, *, min_time_s: float = 1.0, min_reps: int = 5
                    ) -> Callable[[], float]:
    """A ``probe() -> seconds``: the 10%-trimmed mean wall time of :func:`measure_gradient_steps`'s gradient at
    ``sub_batch`` over at least ``min_time_s`` seconds and ``min_reps`` steps, compiled once here, so that each
    probe costs about ``min_time_s`` (a calibration probes between its runs how fast the machine is then).

    Raises:
      ConfigError: ``min_reps`` below 1, a sub-batch below 1 or above the training set.
    """
    check(int(min_reps) >= 1, "min_reps", min_reps, "an integer >= 1")
    runners = _gradient_runner(config, [sub_batch])

    def probe() -> float:  # one round of the lone steps' timing, the statistic the fit takes of them
        ((best, samples),) = _interleaved_rounds(runners, rounds=1, min_time_s=min_time_s, min_reps=min_reps, log=None)
        return gradient_step_seconds(dict(measured_s=best, samples=samples))

    return probe


def measure_gradient_cores(config, sub_batches: Sequence[int], *, min_time_s: float = 1.0, min_reps: int = 3
                           ) -> list[float]:
    """Cores one runtime learner's gradient keeps busy when it runs alone: process CPU time over wall time.

    One thread computes the gradient of :func:`measure_gradient_steps` back to back for at least
    ``min_time_s`` and ``min_reps`` steps per sub-batch; the process's CPU seconds over the wall seconds are
    the compute units that step occupies (the ``learner_step_cores`` figure of the runtime model). XLA's CPU
    client runs a program on one thread when the process has several devices (as a runtime process with a
    learner per device has) and spreads it over the cores when it has one, so time it in a process with as
    many devices as the runtime's.

    Raises:
      ConfigError: ``min_reps`` below 1, a sub-batch below 1 or above the training set.
    """
    check(int(min_reps) >= 1, "min_reps", min_reps, "an integer >= 1")
    out = []
    for once in _gradient_runner(config, sub_batches):
        reps, cpu0, wall0 = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - wall0 < min_time_s or reps < min_reps:
            once()
            reps += 1
        out.append((time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9))
    return out


def measure_input_draws(config, sub_batches: Sequence[int], *, rounds: int = 3, min_time_s: float = 0.1,
                        min_reps: int = 5) -> list[list[float]]:
    """Wall seconds of one runtime learner's input draw at each sub-batch: every sample, rounds interleaved.

    The draw is :meth:`jaxsprint.runtime.learner.SubBatches.draw` on ``config``'s training set (the indices of
    the next sub-batch, its images and labels gathered on the host), the host work a learner does per sample
    besides its gradient (``learner_input_per_sample_s``, the slope over the sub-batches).

    Raises:
      ConfigError: ``rounds`` or ``min_reps`` below 1, a sub-batch below 1 or above the training set.
    """
    from jaxsprint.train import data
    from jaxsprint.runtime import learner

    check(int(rounds) >= 1, "rounds", rounds, "an integer >= 1")
    check(int(min_reps) >= 1, "min_reps", min_reps, "an integer >= 1")
    dataset = data.load_dataset(config)
    _check_sub_batches(sub_batches, dataset)
    runners = []
    for b in sub_batches:
        draws = learner.SubBatches(dataset.train, seed=0, sub_batch=b, host=0, num_hosts=1)
        draws.draw()

        def once(draws=draws) -> float:
            t = time.perf_counter()
            draws.draw()
            return time.perf_counter() - t

        runners.append(once)
    return [s for _, s in _interleaved_rounds(runners, rounds=rounds, min_time_s=min_time_s, min_reps=min_reps,
                                              log=None)]


# One rank of the all-reduce timing, run as `python -c _WORKER '<json args>'` in its own process.
_WORKER = """
import json, os, sys, time
args = json.loads(sys.argv[1])
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"localhost:{args['port']}",
                           num_processes=args["ranks"], process_id=args["rank"],
                           initialization_timeout=int(args["timeout_s"]))
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("d",))
fns = {}
for nbytes in args["sizes"]:  # compiled and warmed up first, then timed in interleaved rounds
    local = np.ones((1, max(1, nbytes // 4)), np.float32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local)
    f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "d"), mesh=mesh, in_specs=P("d"),
                              out_specs=P("d")))
    y = f(x); y.block_until_ready(); y = f(x); y.block_until_ready()
    assert float(np.asarray(y.addressable_data(0)).ravel()[0]) == args["ranks"]
    fns[nbytes] = (f, x)
out = {str(n): float("inf") for n in args["sizes"]}
for _ in range(args["rounds"]):
    for nbytes, (f, x) in fns.items():
        ts = []
        for _ in range(args["reps"]):
            t = time.perf_counter(); y = f(x); y.block_until_ready(); ts.append(time.perf_counter() - t)
        out[str(nbytes)] = min(out[str(nbytes)], float(np.median(ts)))
if args["rank"] == 0:
    print("RESULT " + json.dumps(out), flush=True)
jax.distributed.shutdown()
"""


def measure_allreduce(ranks: int, sizes_bytes: Sequence[int], *, reps: int = 10, rounds: int = 2,
                      timeout_s: float = 120.0) -> list[AllreduceTiming]:
    """Wall seconds of an all-reduce (``psum``) over ``ranks`` local JAX processes on CPU.

    Starts ``ranks`` Python processes joined by :func:`jax.distributed.initialize` on a free localhost port
    (gloo CPU collectives, one CPU device each); each round all-reduces every size ``reps`` times (the rounds
    interleave the sizes, so that a burst of other work on the machine spoils one round of each, not all of
    one size) and the best round's median of rank 0 is kept.

    Args:
      ranks: Processes (>= 2).
      sizes_bytes: Message sizes, bytes per rank.
      reps: All-reduces timed per size and round.
      rounds: Rounds per size.
      timeout_s: Stop the processes after this long.

    Returns:
      One :class:`~jaxsprint.calibration.model_fit.AllreduceTiming` per size.

    Raises:
      ConfigError: ``ranks < 2``, ``reps`` or ``rounds`` below 1, or the processes exceed ``timeout_s``
        (they are then killed).
      RuntimeError: a process failed or printed no result (the message ends with its last stderr line).
    """
    check(not isinstance(ranks, bool) and int(ranks) == ranks and int(ranks) >= 2, "ranks", ranks,
          "an integer >= 2")
    check(int(reps) >= 1 and int(rounds) >= 1, "reps, rounds", (reps, rounds), "integers >= 1")
    check(timeout_s > 0, "timeout_s", timeout_s, "a number > 0")
    port = subprocs.coordinator_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    cmds = []
    for rank in range(ranks):
        args = dict(rank=rank, ranks=int(ranks), port=port, sizes=[int(s) for s in sizes_bytes],
                    reps=int(reps), rounds=int(rounds), timeout_s=max(1, int(timeout_s)))
        cmds.append([sys.executable, "-c", _WORKER, json.dumps(args)])
    try:  # every process's output drained (subprocs): a full pipe would stall a rank inside the all-reduce
        done = subprocs.run_together(cmds, env=env, timeout_s=timeout_s)
    except subprocess.TimeoutExpired:
        raise ConfigError("timeout_s", timeout_s, f"enough for the all-reduce over {ranks} processes "
                                                  "(it did not finish; the processes were stopped)") from None
    for f in done:
        if f.returncode != 0:
            tail = f.stderr.strip().splitlines()[-1] if f.stderr.strip() else "no message"
            raise RuntimeError(f"an all-reduce process over {ranks} ranks failed (exit {f.returncode}): {tail}")
    outs = [(f.stdout, f.stderr) for f in done]
    line = next((ln for ln in outs[0][0].splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"the all-reduce over {ranks} processes printed no result")
    result = json.loads(line[len("RESULT "):])
    return [AllreduceTiming(float(k), int(ranks), float(v), f"allreduce {int(k)} B x {ranks}")
            for k, v in result.items()]


def merge_lone_steps(before, after):
    """One record per sub-batch of two timings of the lone steps (before and after the runtime runs, each as
    ``experiments/calibrate_runtime.py`` makes them): every sample of both (the fit takes their trimmed mean,
    so the machine's speed over the whole calibration), the better best-round median, each timing's trimmed mean
    (``before_s``, ``after_s``) with ``drift = after_s / before_s - 1``."""
    from jaxsprint.calibration import measurements

    later = {g["sub_batch"]: g for g in after}
    out = []
    for g in before:
        a = later[g["sub_batch"]]
        samples = list(g["samples"]) + list(a["samples"])
        t0, t1 = measurements.gradient_step_seconds(g), measurements.gradient_step_seconds(a)
        out.append(dict(sub_batch=g["sub_batch"], measured_s=min(g["measured_s"], a["measured_s"]),
                        mean_s=float(sum(samples) / len(samples)), samples=samples, before_s=t0, after_s=t1,
                        drift=t1 / t0 - 1.0))
    return out
