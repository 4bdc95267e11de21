r"""The runtime's cost form on one host: :class:`HostFigures` beside a :class:`~jaxsprint.perf.machines.Machine`.

:mod:`jaxsprint.runtime` runs learner threads that may share cores and an updater thread per host process.
Its cycles are a closed network with two shared resources, each process's interpreter lock and the ``C``
compute units (``cores_per_node``); the figures of that form are a host's, not the SPRINT model's, so they
live here (the machine keeps the model's: device step, bandwidths, ``updater_overhead_s``):

.. math::
    T_c = \big(t_{lone}^k + t_{lock}^k + t_{cores}^k\big)^{1/k}, \quad
    t_{lone} = T_c(b)\,(1 + \kappa H \beta) + g + w_L \beta, \quad t_{lock} = \frac{N_h\,g}{1 - \beta/2}, \quad
    t_{cores} = \frac{N\,(p_N(b)\,T_c(b) + g)}{C - H \beta c_u}, \quad
    p_N(b) = 1 + (p - 1)\frac{b}{b + b_p}\big(1 - \tfrac{C}{N}\big)^+, \\
    T_u = (1 - a)\,T_{empty} + a\,T_{apply}, \quad \beta = t_{own} / T_u, \quad
    \rho = \min(0.95, N_h g / T_c), \quad a = \frac{p_E}{1 - p_A + p_E}, \quad p_X = 1 - e^{-N_{all} T_X / T_c}, \\
    T_{empty} = (t_{overhead} + c\,N_h)(1 + s_H [nodes > 1]) + n_L\,g\,\tfrac{\rho}{1 - \rho}
                + (t_{queue} + w_R\,T_c(b)\,d + z N) [nodes > 1] + t_{net} + \mathrm{allreduce}(4P, nodes), \\
    T_{apply} = T_{empty} + t_{prog} + (t_{apply} + (N_h + passes)\,4P/\beta_{host})(1 + s_H [nodes > 1])
                + (1 - f [t_{net} > 0])\,\omega\,(N - C + 1)^+ (1 - a\,[t_{net} = 0]) [one\ host], \\
    T_{empty} \mathrel{+}= f\,\omega\,(N - C + 1)^+ [t_{net} > 0] [one\ host], \quad
    t_{prog} = t_{queue} + (w\,d\,(1 - s) + w_S\,[shared]\,s)\,T_c(b), \quad s = [t_{net} > 0][one\ host], \quad
    t_{queue} = q\,u\,T_c(b)\,(1 + s_H [nodes > 1]), \quad d = [shared]\,[N_h > 1], \\
    T_c \leftarrow T_c\,\frac{N_h}{N_h - u}, \quad
    u = \min\Big(0.9,\ \nu\,[shared]\,\frac{a\,(t_{apply} + (N_h + passes)\,4P/\beta_{host})
        + [nodes > 1]\,\mathrm{allreduce}(4P, nodes)}{T_u}\Big)

``T_c(b)`` the device step of :func:`jaxsprint.perf.times.compute_time_s`, ``g = g_0 + g_s b`` a learner's
host work under the lock (``learner_overhead_s`` per cycle, ``learner_input_per_sample_s`` per sample drawn),
``p`` = ``learner_step_cores`` with ``b_p`` = ``learner_step_cores_half_batch``,
``c_u`` = ``updater_cores``, ``c`` = ``updater_per_learner_s``, ``kappa`` = ``learner_updater_stretch`` (a
lone step slowed by the ``H`` updaters while busy), ``q`` = ``updater_queue`` once the learners fill the cores
(``u = clip(N - C + 1, 0, 1)``), paid like ``w`` by each updater program (an applied update, an all-reduce);
``t_apply`` = ``updater_apply_s`` and the host passes paid by the cycles that apply, the share ``a`` of them
(Poisson arrivals, each cycle gathering what arrived during the one before: :func:`applying_share`;
:func:`runtime_times` iterates the coupled pair); ``T_empty`` and ``T_apply`` are the two
kinds of cycle the calibration measures apart; ``s_H`` = ``updater_hosts_stretch``, ``z`` =
``updater_sync_per_learner_s`` (co-located hosts), ``beta_host`` the updater's streaming bandwidth, ``t_net``
the emulated network time, ``k`` = :data:`RUNTIME_SHARPNESS`; ``omega`` = ``updater_apply_core_wait_s``, an
applying cycle's wait for a core among the learner threads of its host (co-located hosts pay ``z N`` instead),
paid by an apply that follows an empty cycle or the network's sleep (a share ``1 - a`` of them without network
time): right after an apply the updater's device is still at work; ``f`` = ``updater_wake_share`` of it is
paid instead by every cycle that slept (the updater waking among the learner threads).
Interpreter lock: the updater waits ``n_L`` = ``updater_lock_waits`` times a cycle behind the learners' host work
(``rho`` their share of the lock, an M/M/1 wait) and a learner ``w_L`` = ``learner_lock_wait_s`` behind a busy
updater. Shared device (``d``): with the updater on the first learner's device, an update program waits ``w`` =
``updater_shared_wait`` device steps behind that learner's, an all-reduce between hosts ``w_R`` =
``updater_shared_allreduce_wait`` (it waits for every host's device); a host's only learner is between steps when
its gradient arrives, so ``d = 0`` there; an updater of one host waking from the network's sleep finds the
learner anywhere in its step (one learner too): its update waits ``w_S`` = ``updater_shared_sleep_wait`` steps
instead (on several hosts the all-reduce comes between the sleep and the update, and waits ``w_R``).
The other way round, that learner waits ``nu`` = ``learner_shared_wait`` of every update program's own time on its
device (``u``: the share of the device they take), so the mean cycle of a host's ``N_h`` learners is
``N_h / (N_h - u)`` of the others'. With the neutral figures (:func:`neutral`) the
form is the SPRINT model's. The form and its figures: docs/calibration.md; they are the ``host`` section of a
machine's preset file (:func:`load_host`).
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxsprint.errors import ConfigError, DataError
from jaxsprint.perf import collectives, machines, presets
from jaxsprint.perf.machines import Machine
from jaxsprint.perf.networks import BYTES_PER_VALUE, NetworkCost
from jaxsprint.perf.times import compute_time_s

__all__ = ["ADDED_LATER", "COMPATIBLE_FORMATS", "FIELDS", "HOST_FORMAT", "MIN_CYCLE_S", "HostFigures", "NEUTRAL",
           "RUNTIME_ITERATIONS", "RUNTIME_SHARPNESS", "RuntimeTimes", "SAME_AS", "applying_share", "host_json",
           "learner_host_s", "load_host", "make_host", "neutral", "nonempty_probability", "runtime_compute_time_s",
           "runtime_times", "runtime_update_time_s", "shipped", "step_cores", "with_figures"]

RUNTIME_ITERATIONS = 20  # fixed-point steps of runtime_times (the empty cycles' share couples T_u and T_c)
# Exponent of the smooth maximum of the learner cycle's three bounds: 4 puts N = C learners 19% above either
# bound alone, as two learners on two cores measure (docs/sprint-runtime.md).
RUNTIME_SHARPNESS = 4.0
HOST_FORMAT = "jaxsprint-host-8"  # 8: an update program's wait on a shared device after the network's sleep
# Formats read as this one with the figures they lack neutral (ADDED_LATER): the same form with those terms off;
# their updater_shared_sleep_wait is their updater_shared_wait (SAME_AS), the wait they applied after a sleep.
COMPATIBLE_FORMATS = ("jaxsprint-host-5", "jaxsprint-host-6", "jaxsprint-host-7")
OLD_FORMATS = {"jaxsprint-host-3": "shared-device waits in learner cycles",
               "jaxsprint-host-4": "the core wait paid by every applying cycle"}
# An updater cycle's own work takes at least this long (one turn of its loop), whatever figures are zero: an
# empty cycle of no time would make T_u 0 and the mini-batch 0/0.
MIN_CYCLE_S = 1e-6


@struct.dataclass
class HostFigures:
    """The runtime's figures of one host (units in the names: ``_s`` seconds, ``_cores`` compute units).

    Attributes:
      cores_per_node: ``C``, the compute units every learner of the host (and its updaters) share.
      learner_overhead_s: ``g_0``, a learner's host work per cycle besides its device step, under the lock.
      learner_input_per_sample_s: ``g_s``, its host work per sample of its sub-batch (drawing the input).
      learner_step_cores: ``p``, the units one step takes on busy cores at large sub-batches, reached as the
        learners oversubscribe the cores (``N >> C``; none extra at ``N <= C``).
      learner_step_cores_half_batch: ``b_p`` (samples): half of ``p - 1`` is reached there; 0: ``p`` always.
      updater_per_learner_s: ``c``, the updater's own cost per cycle for each learner of its host.
      updater_queue: ``q``, the fraction of one device step the updater's work waits once the cores are full.
      updater_hosts_stretch: ``s_H``, the stretch of the updater's own work with several co-located hosts.
      updater_cores: ``c_u``, the units an updater takes while it works.
      updater_apply_s: ``t_apply``, the cost of applying an update, skipped by a cycle with no gradient.
      updater_shared_wait: ``w``, the device steps an update program waits on a shared device (host of 2+ learners).
      updater_shared_allreduce_wait: ``w_R``, the same for each all-reduce between hosts.
      updater_shared_sleep_wait: ``w_S``, the device steps an applying update program waits on a shared device
        after the network's sleep on one host (any number of learners: it wakes anywhere in the learner's step).
      updater_lock_waits: ``n_L``, the updater's waits for the interpreter lock per cycle.
      updater_sync_per_learner_s: ``z``, the wait of each all-reduce between hosts that are processes of one
        machine, per learner thread on its cores (the other updater must get a core among them).
      updater_apply_core_wait_s: ``omega``, an applying cycle's wait for a core, per learner thread beyond the
        host's cores (its update program must get a core among them; one host, or hosts on separate machines),
        where the cycle before it was empty or slept.
      updater_wake_share: ``f``, the share of that wait paid instead by every cycle that slept (network time),
        on waking: 0 to 1.
      learner_shared_wait: ``nu``, the share of each update program's own time (applying an update, an all-reduce)
        that the learner on the updater's device (``updater_device=shared``) waits behind it.
      learner_lock_wait_s: ``w_L``, a learner's wait per cycle behind an updater that never sleeps.
      learner_updater_stretch: ``kappa``, a lone learner's step stretched by ``kappa`` per busy updater of the
        machine (an updater that never sleeps takes cycles from the step's threads).
      learner_cv: Coefficient of variation of the learner cycle.
      updater_cv: Coefficient of variation of the updater's own work.
      name: Name (static).
      sources: ``(field, source)`` pairs (static).
    """

    cores_per_node: jax.Array
    learner_overhead_s: jax.Array
    learner_input_per_sample_s: jax.Array
    learner_step_cores: jax.Array
    learner_step_cores_half_batch: jax.Array
    updater_per_learner_s: jax.Array
    updater_queue: jax.Array
    updater_hosts_stretch: jax.Array
    updater_cores: jax.Array
    updater_apply_s: jax.Array
    updater_shared_wait: jax.Array
    updater_shared_allreduce_wait: jax.Array
    updater_shared_sleep_wait: jax.Array
    updater_lock_waits: jax.Array
    updater_sync_per_learner_s: jax.Array
    updater_apply_core_wait_s: jax.Array
    updater_wake_share: jax.Array
    learner_shared_wait: jax.Array
    learner_lock_wait_s: jax.Array
    learner_updater_stretch: jax.Array
    learner_cv: jax.Array
    updater_cv: jax.Array
    name: str = struct.field(pytree_node=False, default="host")
    sources: tuple[tuple[str, str], ...] = struct.field(pytree_node=False, default=())


FIELDS = tuple(f for f in HostFigures.__dataclass_fields__ if f not in ("name", "sources"))
_POSITIVE = ("cores_per_node", "learner_step_cores")  # the others may be 0 ("off")
# Figures added after host format 3 was first written: a section without them loads them neutral (term off).
ADDED_LATER = ("updater_apply_core_wait_s", "updater_wake_share", "learner_shared_wait",
               "updater_shared_sleep_wait")
# An added figure that a section without it takes from another of its figures, not its neutral value.
SAME_AS = {"updater_shared_sleep_wait": "updater_shared_wait"}
# The neutral figures: the SPRINT model's separate accelerators (cores_per_node: the machine's gpus_per_node).
NEUTRAL: dict[str, tuple[float, str]] = dict(
    learner_overhead_s=(0.0, "neutral: 0 (host cost of a learner cycle not modelled)"),
    learner_input_per_sample_s=(0.0, "neutral: 0 (host cost of drawing a learner's input not modelled)"),
    learner_step_cores=(1.0, "neutral: 1 (a step keeps one compute unit busy)"),
    learner_step_cores_half_batch=(0.0, "neutral: 0 (learner_step_cores at every sub-batch)"),
    updater_per_learner_s=(0.0, "neutral: 0 (the updater's cost does not grow with the learners)"),
    updater_queue=(0.0, "neutral: 0 (the updater's work never waits for the learners')"),
    updater_hosts_stretch=(0.0, "neutral: 0 (co-located hosts do not slow each other's updater)"),
    updater_cores=(0.0, "neutral: 0 (the updater takes no compute unit from the learners)"),
    updater_apply_s=(0.0, "neutral: 0 (an empty updater cycle costs as much as one that applies an update)"),
    updater_shared_wait=(0.0, "neutral: 0 (an update program never waits behind a learner's on its device)"),
    updater_shared_allreduce_wait=(0.0, "neutral: 0 (an all-reduce never waits behind a learner's program)"),
    updater_shared_sleep_wait=(0.0, "neutral: 0 (an update program never waits behind a learner's after a sleep)"),
    updater_lock_waits=(0.0, "neutral: 0 (the updater never waits for an interpreter lock)"),
    updater_sync_per_learner_s=(0.0, "neutral: 0 (an all-reduce between hosts never waits for a core)"),
    updater_apply_core_wait_s=(0.0, "neutral: 0 (an applying cycle never waits for a core)"),
    updater_wake_share=(0.0, "neutral: 0 (the core wait is paid by the applying cycles only)"),
    learner_shared_wait=(0.0, "neutral: 0 (a learner never waits behind the updater's programs on its device)"),
    learner_lock_wait_s=(0.0, "neutral: 0 (a learner never waits for the updater's interpreter lock)"),
    learner_updater_stretch=(0.0, "neutral: 0 (a busy updater does not slow a learner's step)"),
    learner_cv=(0.05, "neutral: 0.05 (assumed compute jitter)"),
    updater_cv=(0.0, "neutral: 0 (a deterministic updater cycle, the protocol's assumption)"),
)


def _check_field(field: str) -> None:
    if field not in FIELDS:
        raise ConfigError("field", field, f"a host figure: one of {', '.join(FIELDS)}")


def make_host(name: str, sources: dict[str, str], **figures: float) -> HostFigures:
    """A :class:`HostFigures` from every figure (finite, >= 0; > 0 for ``cores_per_node`` and ``learner_step_cores``;
    one of :data:`ADDED_LATER` may be absent: its neutral value, or that of its :data:`SAME_AS` figure).

    Raises:
      ConfigError: a missing, unknown or invalid figure.
    """
    for f in ADDED_LATER:  # absent from what was written before the figure existed: its neutral value
        if figures.get(f) is None:
            like = SAME_AS.get(f)
            if like is not None and figures.get(like) is not None:
                figures[f] = figures[like]
                sources = {**sources, f: f"{like}'s value: absent from the figures given, written by a form that "
                                         f"applied {like} there"}
            else:
                figures[f] = NEUTRAL[f][0]
                sources = {**sources, f: NEUTRAL[f][1] + "; absent from the figures given"}
    missing = [f for f in FIELDS if figures.get(f) is None]
    if missing:
        raise ConfigError(f"host {name!r} figures", tuple(missing), "present: every figure of HostFigures")
    for field, value in figures.items():
        _check_field(field)
        try:
            v = float(value)
        except (TypeError, ValueError):
            v = float("nan")
        if not math.isfinite(v) or v < 0 or (v == 0 and field in _POSITIVE):
            raise ConfigError(field, value, f"a finite number {'> 0' if field in _POSITIVE else '>= 0'} (host {name!r})")
    return HostFigures(**{k: jnp.float32(v) for k, v in figures.items()}, name=name,
                       sources=tuple((f, str(sources.get(f, ""))) for f in FIELDS))


def neutral(machine: Machine) -> HostFigures:
    """The neutral figures for ``machine`` (:data:`NEUTRAL`; one compute unit per accelerator)."""
    figures = {f: v for f, (v, _) in NEUTRAL.items()}
    sources = {f: s for f, (_, s) in NEUTRAL.items()}
    sources["cores_per_node"] = "neutral: the machine's gpus_per_node (every learner has its own accelerator)"
    return make_host(machine.name, sources, cores_per_node=float(machine.gpus_per_node), **figures)


def with_figures(host: HostFigures, **figures: Any) -> HostFigures:
    """A copy of ``host`` with some figures replaced.

    Raises:
      ConfigError: an unknown figure.
    """
    for field in figures:
        _check_field(field)
    return host.replace(**{k: jnp.asarray(v, jnp.float32) for k, v in figures.items()})


def host_json(host: HostFigures, **extra: Any) -> dict[str, Any]:
    """The ``host`` section of a preset file: figures, sources and ``extra`` (e.g. ``fitted``, ``rel_std_error``)."""
    return dict(format=HOST_FORMAT, name=host.name, figures={f: presets.figure(getattr(host, f)) for f in FIELDS},
                sources=dict(host.sources), **extra)


def _from_json(section: Any, path: str) -> HostFigures:
    what = f"a host section (format {HOST_FORMAT!r}) with every figure of HostFigures"
    if isinstance(section, dict) and section.get("format") in OLD_FORMATS:
        what += (f"; this one is {section['format']!r} ({OLD_FORMATS[section['format']]}): fit it again, "
                 "experiments/calibrate_runtime.py --config.calibration.fit_only=True")
    readable = (HOST_FORMAT, *COMPATIBLE_FORMATS)
    if not isinstance(section, dict) or section.get("format") not in readable or not isinstance(
            section.get("figures"), dict):
        raise DataError("machine_file", path, what)
    try:
        return make_host(str(section.get("name", "host")), {str(k): str(v) for k, v in
                                                            section.get("sources", {}).items()}, **section["figures"])
    except ConfigError as e:
        raise DataError("machine_file", path, f"{what} ({e})") from None


def shipped() -> tuple[str, ...]:
    """Names of the shipped machine presets whose files have a host section."""
    return tuple(n for n in sorted(machines.PRESETS) if "host" in _shipped_file(n)[1])


def _shipped_file(name: str) -> tuple[str, dict[str, Any]]:
    path = os.path.join(machines.DATA_DIR, f"{name}.json")
    if not os.path.exists(path):
        return path, {}
    with open(path) as fh:
        return path, json.load(fh)


def load_host(machine: Machine, name: str | None = None, path: str | None = None) -> HostFigures:
    """The host figures that go with ``machine``: the ``host`` section of a preset file (``path``: the launchers'
    ``--machine_file``), else the shipped ones of preset ``name`` (:func:`shipped`), else :func:`neutral`.

    Raises:
      DataError: an unreadable file, or a host section that is not valid.
    """
    if path:
        try:
            with open(path) as fh:
                data = json.load(fh)
        except (OSError, json.JSONDecodeError) as e:
            raise DataError("machine_file", path, f"a readable JSON preset ({e})") from None
        return _from_json(data["host"], path) if isinstance(data, dict) and "host" in data else neutral(machine)
    file, data = _shipped_file(name) if name else ("", {})
    return _from_json(data["host"], file) if "host" in data else neutral(machine)


def step_cores(host: HostFigures, sub_batch: jax.Array) -> jax.Array:
    """Compute units one learner step takes on busy cores: ``1 + (p - 1) b / (b + b_p)``, ``p`` at ``b_p = 0``."""
    b = jnp.asarray(sub_batch, jnp.float32)
    half = host.learner_step_cores_half_batch
    frac = jnp.where(half > 0, b / (b + jnp.maximum(half, 1e-30)), 1.0)
    return 1.0 + (host.learner_step_cores - 1.0) * frac


def learner_host_s(host: HostFigures, sub_batch: jax.Array) -> jax.Array:
    """A learner's host work per cycle under the lock: ``g_0 + g_s b``."""
    return host.learner_overhead_s + host.learner_input_per_sample_s * jnp.asarray(sub_batch, jnp.float32)


def nonempty_probability(gradients_per_cycle: jax.Array) -> jax.Array:
    """Chance that an updater cycle gathers at least one gradient: ``1 - exp(-m)``, ``m`` the mean count."""
    return -jnp.expm1(-jnp.maximum(gradients_per_cycle, 0.0))


def applying_share(rate: jax.Array, t_empty: jax.Array, t_applying: jax.Array) -> jax.Array:
    """Share of updater cycles that apply an update, gradients arriving at ``rate`` (per second, Poisson).

    A cycle gathers what arrived during the one before, so the cycles are a two-state chain: after an empty
    cycle (``t_empty`` long) the next applies with ``p_e = 1 - exp(-rate t_empty)``, after an applying one
    (``t_applying``) with ``p_a``; its stationary share is ``p_e / (1 - p_a + p_e)``. With both kinds equally
    long it is :func:`nonempty_probability` of the mean count; a long applying cycle beside short empty ones
    (an updater cycling back to back) makes fewer, fuller updates than that mean suggests.
    """
    p_e = nonempty_probability(rate * t_empty)
    p_a = nonempty_probability(rate * t_applying)
    return p_e / jnp.maximum(1.0 - p_a + p_e, 1e-12)


def _learner_cycle(host, step, sub_batch, n, learners_per_host, cores, updater_demand, updater_busy,
                   updater_load=None):
    """:func:`runtime_compute_time_s` from its device step ``step`` (computed once by the callers)."""
    c = host.cores_per_node if cores is None else cores
    n_h = n if learners_per_host is None else jnp.asarray(learners_per_host, jnp.float32)
    load = updater_busy if updater_load is None else updater_load
    g = learner_host_s(host, sub_batch)
    lone = step * (1.0 + host.learner_updater_stretch * load) + g + host.learner_lock_wait_s * updater_busy
    lock = n_h * g / jnp.maximum(1e-3, 1.0 - 0.5 * updater_busy)
    over = jnp.clip(1.0 - c / jnp.maximum(n, 1.0), 0.0, 1.0)  # oversubscription: 0 with N <= C learners
    p_eff = 1.0 + (step_cores(host, sub_batch) - 1.0) * over
    units = n * (p_eff * step + g) / jnp.maximum(1e-3, c - updater_demand)
    k = RUNTIME_SHARPNESS
    top = jnp.maximum(jnp.maximum(lone, lock), units)  # scaled, so that the powers stay in float32 range
    return top * ((lone / top) ** k + (lock / top) ** k + (units / top) ** k) ** (1.0 / k)


def runtime_compute_time_s(network: NetworkCost, machine: Machine, host: HostFigures, sub_batch: jax.Array,
                           learners: jax.Array, *, learners_per_host: jax.Array | None = None,
                           cores: jax.Array | None = None, updater_demand: jax.Array = 0.0,
                           updater_busy: jax.Array = 0.0) -> jax.Array:
    """Learner cycle ``T_c``: the smooth maximum of its three bounds (module docstring), in seconds.

    ``learners``: ``N`` on the cores (every host's when the hosts are processes of one machine);
    ``learners_per_host``: ``N_h`` sharing one lock (default ``N``); ``cores``: ``C`` (default the host's);
    ``updater_demand``: ``H beta c_u``; ``updater_busy``: ``beta``.
    """
    n = jnp.asarray(learners, jnp.float32)
    step = compute_time_s(network, machine, sub_batch, gpus_per_node=n)
    return _learner_cycle(host, step, sub_batch, n, learners_per_host, cores, updater_demand, updater_busy)


def _update_parts(network, machine, host, nodes, learners, network_time_s, sharing_learners, cores, algorithm,
                  sub_batch=None, co_located=True):
    """``(own work of every cycle, own work of every updater program (applying an update, an all-reduce):
    waiting for the learners' programs, own work of applying an update (reading the gradients and stepping
    the optimizer), a cold apply's wait for a core, the network's part)`` of the updater cycle."""
    c = host.cores_per_node if cores is None else cores
    n = jnp.asarray(learners if sharing_learners is None else sharing_learners, jnp.float32)
    g = jnp.asarray(learners, jnp.float32)
    h = jnp.asarray(nodes, jnp.float32)
    param_bytes = BYTES_PER_VALUE * network.total_params
    t_host = (g + machine.updater_passes) * param_bytes / machine.host_memory_bandwidth_bytes_per_s
    t_queue = jnp.float32(0.0)
    if sub_batch is not None:
        full = jnp.clip(n - c + 1.0, 0.0, 1.0)  # the learners alone keep every core busy
        t_queue = host.updater_queue * full * compute_time_s(network, machine, sub_batch, gpus_per_node=learners)
    stretch = (1.0 + jnp.where(h > 1, host.updater_hosts_stretch, 0.0)) if co_located else 1.0
    t_base = (machine.updater_overhead_s + host.updater_per_learner_s * g) * stretch
    t_net = collectives.allreduce_time_s(param_bytes, nodes, machine.network_latency_s,
                                         machine.network_bandwidth_bytes_per_s, algorithm=algorithm)
    co_hosts = h > 1 if co_located else False  # several hosts that are processes of one machine
    if co_located:  # the peer updaters must each get a core among the machine's learner threads
        t_net = t_net + jnp.where(co_hosts, host.updater_sync_per_learner_s * n, 0.0)
    # An applying cycle's update program waits for a core among the learner threads beyond the cores (where
    # co-located hosts all-reduce, z N above already waits for them).
    t_core = jnp.where(co_hosts, 0.0, host.updater_apply_core_wait_s * jnp.maximum(n - c + 1.0, 0.0))
    return (t_base, t_queue * stretch, (host.updater_apply_s + t_host) * stretch, t_core,
            t_net + jnp.asarray(network_time_s, jnp.float32))


def _cold(nonempty, network_time_s):
    """The share of applying cycles that follow an empty cycle or the network's sleep (each cycle gathers
    independently: ``1 - a`` without network time, all of them with it)."""
    return 1.0 - nonempty * jnp.where(jnp.asarray(network_time_s, jnp.float32) > 0, 0.0, 1.0)


def _core_waits(host, t_core, nonempty, network_time_s):
    """``(every cycle's, every applying cycle's)`` part of the core wait ``t_core``: the share ``f`` paid on
    waking from the network's sleep by every cycle, the rest by the applies after an empty cycle or a sleep."""
    wake = host.updater_wake_share * jnp.where(jnp.asarray(network_time_s, jnp.float32) > 0, 1.0, 0.0)
    return t_core * wake, t_core * (1.0 - wake) * _cold(nonempty, network_time_s)


def runtime_update_time_s(network: NetworkCost, machine: Machine, host: HostFigures, nodes: jax.Array,
                          learners: jax.Array, network_time_s: jax.Array = 0.0, *,
                          sharing_learners: jax.Array | None = None, cores: jax.Array | None = None,
                          algorithm: str = "ring", sub_batch: jax.Array | None = None, co_located: bool = True,
                          nonempty: jax.Array = 1.0) -> jax.Array:
    """Updater cycle ``T_u`` (module docstring): its own work, the emulated network, the all-reduce, in seconds.

    ``nodes``: hosts all-reducing every cycle; ``learners``: ``N_h``; ``sharing_learners``: ``N`` on the
    updater's cores (default ``N_h``); ``sub_batch``: for the queue term (None: none); ``co_located``: the
    hosts are processes of one machine (stretch ``1 + s_H``); ``nonempty``: the share of cycles that apply.
    """
    t_base, t_queue, t_apply, t_core, t_wait = _update_parts(network, machine, host, nodes, learners, network_time_s,
                                                             sharing_learners, cores, algorithm, sub_batch, co_located)
    programs = nonempty + jnp.where(jnp.asarray(nodes, jnp.float32) > 1, 1.0, 0.0)
    t_every, t_cold = _core_waits(host, t_core, nonempty, network_time_s)
    return t_base + t_queue * programs + t_every + (t_apply + t_cold) * nonempty + t_wait


class RuntimeTimes(NamedTuple):
    """What the model needs of a runtime configuration: both cycle means and their coefficients of variation."""

    t_compute_s: jax.Array  # mean learner cycle (s)
    t_update_s: jax.Array  # mean updater cycle (s)
    t_compute_cv: jax.Array
    t_update_cv: jax.Array
    t_update_empty_s: jax.Array  # mean updater cycle that gathers no gradient (s)
    t_update_applying_s: jax.Array  # mean updater cycle that applies an update (s)


def runtime_times(network: NetworkCost, machine: Machine, host: HostFigures, *, learners_per_host: jax.Array,
                  sub_batch: jax.Array, hosts: jax.Array = 1, network_time_s: jax.Array = 0.0,
                  co_located: bool = True, algorithm: str = "ring", shared: jax.Array = 0.0) -> RuntimeTimes:
    """``T_c``, ``T_u`` and their cvs of a runtime configuration, from the machine's and the host's figures.

    The specs prediction of the runtime: feed it to :func:`jaxsprint.perf.sprint.distributions` (``n =
    learners_per_host * hosts``). ``co_located``: the hosts are processes of one machine sharing its cores
    (False: separate machines). ``shared``: 1 where the updater's programs run on the first learner's device
    (``config.sprint.updater_device=shared``), 0 where it has its own. The learner's cv is ``learner_cv``; the
    updater's own work (the waits on a shared device included) jitters with ``updater_cv`` while its network
    part is steady, so ``t_update_cv = updater_cv * own / T_u``.
    """
    per_host = jnp.asarray(learners_per_host, jnp.float32)
    h = jnp.asarray(hosts, jnp.float32)
    sharing = per_host * h if co_located else per_host
    updaters = h if co_located else jnp.float32(1.0)

    t_base, t_queue, t_apply, t_core, t_wait = _update_parts(network, machine, host, hosts, per_host, network_time_s,
                                                             sharing, None, algorithm, sub_batch, co_located)
    step = compute_time_s(network, machine, sub_batch, gpus_per_node=sharing)
    programs = jnp.where(h > 1, 1.0, 0.0)  # the all-reduce of every cycle, on the updater's device
    # On a shared device, behind the learner's program (none where it is the host's only learner: it has just
    # finished the gradient that starts the update); in device steps, whatever the learner's wait for cores.
    # On one host the apply follows the network's sleep, woken anywhere in the learner's step, one learner too
    # (w_S); on several the all-reduce comes between them (and waits w_R).
    on_shared = step * jnp.asarray(shared, jnp.float32)
    device = on_shared * jnp.where(per_host > 1.0, 1.0, 0.0)
    slept = (jnp.asarray(network_time_s, jnp.float32) > 0) & (h <= 1)
    apply_wait = t_queue + jnp.where(slept, host.updater_shared_sleep_wait * on_shared,
                                     host.updater_shared_wait * device)
    allreduce_wait = t_queue + host.updater_shared_allreduce_wait * device
    # The update programs' own time on a shared device, which its learner waits behind (the share nu of it).
    t_collective = t_wait - jnp.asarray(network_time_s, jnp.float32)
    behind = host.learner_shared_wait * jnp.asarray(shared, jnp.float32)

    g = learner_host_s(host, sub_batch)

    def cycles(nonempty, t_c_before):  # scalar arithmetic only: the fixed point below repeats it
        rho = jnp.minimum(0.95, per_host * g / t_c_before)  # the learners' lock share
        t_lock = host.updater_lock_waits * g * rho / (1.0 - rho)
        t_every, t_cold = _core_waits(host, t_core, nonempty, network_time_s)
        t_empty = jnp.maximum(t_base + allreduce_wait * programs + t_lock + t_every, MIN_CYCLE_S)
        applying = t_apply + t_cold + apply_wait
        t_own = t_empty + applying * nonempty
        t_u = t_own + t_wait
        beta = t_own / t_u
        t_c = _learner_cycle(host, step, sub_batch, sharing, per_host, None, updaters * beta * host.updater_cores,
                             beta, updaters * beta)
        u = jnp.minimum(0.9, behind * (t_apply * nonempty + t_collective * programs) / t_u)
        t_c = t_c * per_host / (per_host - u)
        return t_own, t_u, t_c, t_empty + t_wait, t_empty + applying + t_wait

    def state(nonempty, t_c_before):  # float32 throughout: the loop's carry keeps one type
        return tuple(jnp.asarray(x, jnp.float32) for x in cycles(nonempty, t_c_before))

    def iterate(_, s):  # a loop, not unrolled: one copy of the cycle in the compiled fits and their Jacobians
        _, _, t_c, t_e, t_a = s
        return state(applying_share(per_host * h / t_c, t_e, t_a), t_c)

    t_own, t_u, t_c, t_e, t_a = jax.lax.fori_loop(0, RUNTIME_ITERATIONS, iterate, state(1.0, step))
    return RuntimeTimes(t_c, t_u, jnp.asarray(host.learner_cv, jnp.float32), host.updater_cv * t_own / t_u, t_e, t_a)
