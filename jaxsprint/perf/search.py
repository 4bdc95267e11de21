r"""Configuration search on the differentiable SPRINT model: gradient-based and exhaustive.

The problem (fastest configuration whose mean mini-batch meets a target, under staleness, memory and
precision-budget constraints) and its exact evaluation are :mod:`jaxsprint.perf.space`.

**Gradient search** (:func:`gradient_search`). A continuous relaxation: the integer variables are searched
as ``z = log x`` and the precision ones as ``p`` in ``[0, 1]``, with projected steps (clipped to the box),
so the bounds hold exactly and the gradient does not vanish near them. The other constraints ``c_i(x) <= 0``
(:func:`jaxsprint.perf.space.constraints`, log form) enter the Powell-Hestenes-Rockafellar augmented
Lagrangian of ``log T_epoch``

.. math::
    L_\rho(z, \lambda) = \log T_{epoch}(x(z)) + \sum_i \frac{\max(0, \lambda_i + \rho c_i)^2
    - \lambda_i^2}{2\rho},

minimised by Adam (optax) for ``inner`` steps, after which ``lambda_i <- max(0, lambda_i + rho c_i)`` and
``rho`` grows (Nocedal and Wright, *Numerical Optimization*, 2nd ed., sec. 17.4). Several random starts run
in one ``vmap``. The end points are rounded and the best few refined by hill climbing over a discrete
neighbourhood (small absolute and relative steps of each integer variable, precision flips with sub-batch
steps), evaluated exactly.

**Grid search** (:func:`grid_search`). Every configuration of the same space, evaluated by the same function
in vmapped chunks inside one jitted loop: the baseline and the check.

Both compile once per :class:`~jaxsprint.perf.space.Space` (the machine and the target are arguments).
Measured against each other: ``docs/perf-search.md``. Related: Qiao et al., "Pollux", OSDI 2021 (fits a
throughput model, then enumerates).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxsprint.errors import ConfigError
from jaxsprint.perf.space import (INFEASIBLE_SCORE, Space, Stats, Target, constraints, evaluate, score,
                                  score_configs, target_array)

__all__ = ["GRID_MAX_CONFIGS", "Candidate", "SearchResult", "check_grid_size", "evaluate_configs", "gradient_search",
           "grid_search"]

GRID_MAX_CONFIGS = 2 ** 31 - 1  # int32 decoding of grid indices


# ----------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Candidate:
    """One discrete configuration with its predicted statistics."""

    nodes: int
    gpus_per_node: int
    sub_batch: int
    epoch_time_s: float
    mean_minibatch: float
    mean_staleness: float
    t_compute_s: float
    t_update_s: float
    memory_bytes: float
    feasible: bool
    violation: float
    low_precision: tuple[int, ...] | None = None
    low_fraction: float = 0.0

    @property
    def config(self) -> tuple[int, ...]:
        """``(nodes, gpus_per_node, sub_batch[, precision bits])``."""
        base = (self.nodes, self.gpus_per_node, self.sub_batch)
        return base + (self.low_precision or ())

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the precision fields only with the precision option)."""
        d = dataclasses.asdict(self)
        if self.low_precision is None:
            d.pop("low_precision")
            d.pop("low_fraction")
        else:
            d["low_precision"] = list(self.low_precision)
        return d


@dataclasses.dataclass
class SearchResult:
    """Outcome of a search.

    Attributes:
      best: The fastest feasible configuration, or None when no configuration meets the target.
      closest: When ``best`` is None, the configuration with the smallest constraint violation.
      runner_ups: Next-best feasible configurations that differ from the best and each other in
        learners per node or by more than 2% in nodes.
      evaluations: Model evaluations by kind (``gradient``: value-and-gradient evaluations of the
        relaxation; ``discrete``: exact evaluations while rounding and refining; ``grid``).
      space_size: Configurations in the space.
      wall_s: Wall-clock seconds of the search (after compilation; ``compile_s`` separately).
      trajectory: ``[starts, steps, 2]`` (epoch time, mean mini-batch) of the relaxation, or None.
      feasible_count: Feasible configurations (grid search only).
    """

    best: Candidate | None
    closest: Candidate | None
    runner_ups: list[Candidate]
    evaluations: dict[str, int]
    space_size: int
    wall_s: float
    compile_s: float = 0.0
    trajectory: np.ndarray | None = None
    feasible_count: int | None = None

    @property
    def feasible(self) -> bool:
        """Whether some configuration meets the target."""
        return self.best is not None

    @property
    def total_evaluations(self) -> int:
        """Model evaluations of every kind."""
        return int(sum(self.evaluations.values()))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary (no trajectory); a space size beyond 2^53 becomes a float."""
        out: dict[str, Any] = {
            "feasible": self.feasible,
            "best": self.best.as_dict() if self.best else None,
            "closest": self.closest.as_dict() if self.closest else None,
            "runner_ups": [c.as_dict() for c in self.runner_ups],
            "evaluations": dict(self.evaluations),
            "total_evaluations": self.total_evaluations,
            "space_size": float(self.space_size) if self.space_size > 2 ** 53 else self.space_size,
            "wall_s": self.wall_s,
            "compile_s": self.compile_s,
        }
        if self.feasible_count is not None:
            out["feasible_count"] = self.feasible_count
        return out


def _candidate(space: Space, x: np.ndarray, s: Stats, i: int, ok: np.ndarray,
               viol: np.ndarray) -> Candidate:
    low = tuple(int(v) for v in x[i, 3:]) if space.precision is not None else None
    return Candidate(int(x[i, 0]), int(x[i, 1]), int(x[i, 2]), float(s.epoch_time_s[i]),
                     float(s.mean_minibatch[i]), float(s.mean_staleness[i]), float(s.t_compute_s[i]),
                     float(s.t_update_s[i]), float(s.memory_bytes[i]), bool(ok[i]), float(viol[i]),
                     low, float(s.low_fraction[i]))


def evaluate_configs(space: Space, target: Target, configs: Sequence[Sequence[int]]
                     ) -> list[Candidate]:
    """Exact statistics and feasibility of discrete configurations (for tables and checks)."""
    x = np.asarray(configs, np.float32).reshape(-1, space.dims)
    s, _, ok, viol = score_configs(space, target, x)
    return [_candidate(space, x, s, i, ok, viol) for i in range(len(x))]


# ----------------------------------------------------------------------------------------------
# Grid search
# ----------------------------------------------------------------------------------------------


def _grid_fn(space: Space, chunk: int, top_k: int):
    """``(jitted run(machine, tgt) -> (best scores, best indices, closest violation, its index, feasible
    count), decode)`` of the grid over ``space``."""
    nb = space.max_sub_batch - space.min_sub_batch + 1
    g_max, nprec = space.max_gpus_per_node, space.num_precision
    total = space.size
    num_chunks = -(-total // chunk)

    def decode(idx):
        rest = idx
        bits = []
        for _ in range(nprec):
            bits.append(rest % 2)
            rest = rest // 2
        b = rest % nb + space.min_sub_batch
        rest = rest // nb
        g = rest % g_max + 1
        n = rest // g_max + 1
        cols = [n, g, b] + bits[::-1]
        return jnp.stack(cols, -1).astype(jnp.float32)

    def run(machine, tgt):
        sp = dataclasses.replace(space, machine=machine)
        f = jax.vmap(lambda x: score(sp, evaluate(sp, machine, x), tgt))

        def body(i, carry):
            best_s, best_i, close_v, close_i, count = carry
            idx = i * chunk + jnp.arange(chunk, dtype=jnp.int32)
            valid = idx < total
            sc, ok, viol = f(decode(jnp.minimum(idx, total - 1)))
            ok = ok & valid
            sc = jnp.where(ok, sc, jnp.inf)
            neg, pos = jax.lax.top_k(-sc, top_k)
            all_s = jnp.concatenate([best_s, -neg])
            all_i = jnp.concatenate([best_i, idx[pos]])
            keep = jnp.argsort(all_s)[:top_k]
            viol = jnp.where(valid & ~ok, viol, jnp.inf)
            j = jnp.argmin(viol)
            better = viol[j] < close_v
            return (all_s[keep], all_i[keep], jnp.where(better, viol[j], close_v),
                    jnp.where(better, idx[j], close_i), count + jnp.sum(ok))

        init = (jnp.full((top_k,), jnp.inf), jnp.zeros((top_k,), jnp.int32), jnp.float32(jnp.inf),
                jnp.int32(0), jnp.int32(0))
        return jax.lax.fori_loop(0, num_chunks, body, init)

    return jax.jit(run), decode


def check_grid_size(space: Space) -> None:
    """Raises ConfigError (field ``grid size``) when `space` is too large for :func:`grid_search`."""
    if space.size > GRID_MAX_CONFIGS:
        raise ConfigError("grid size", space.size, f"at most {GRID_MAX_CONFIGS} configurations (use "
                                                   "gradient_search: the search launcher without --grid)")


def grid_search(space: Space, target: Target, *, chunk: int = 1 << 16, top_k: int = 64
                ) -> SearchResult:
    """Exhaustive search: every configuration of ``space``, vmapped in chunks in one jitted loop.

    Args:
      space: The space (at most 2^31 - 1 configurations).
      target: Constraints.
      chunk: Configurations per vmapped chunk.
      top_k: Feasible configurations kept (for the runner-ups).

    Returns:
      :class:`SearchResult` with ``evaluations = {"grid": space.size}``.

    Raises:
      ConfigError: a space too large to enumerate.
    """
    check_grid_size(space)
    chunk = int(min(chunk, 1 << max(4, math.ceil(math.log2(space.size)))))
    top_k = int(min(top_k, chunk))  # lax.top_k needs k <= the chunk (a small space has a small chunk)
    t0 = time.perf_counter()
    run, decode = space.jitted(("grid", chunk, top_k), lambda: _grid_fn(space, chunk, top_k))
    tgt = target_array(target)
    lowered = run.lower(space.machine, tgt)
    compiled = lowered.compile()
    t1 = time.perf_counter()
    best_s, best_i, close_v, close_i, count = jax.block_until_ready(compiled(space.machine, tgt))
    wall = time.perf_counter() - t1
    best_s, best_i = np.asarray(best_s), np.asarray(best_i)
    idx = best_i[np.isfinite(best_s)]
    if idx.size == 0:
        idx = np.asarray([int(close_i)])
    x = np.asarray(decode(jnp.asarray(idx, jnp.int32)))
    cands = evaluate_configs(space, target, x)
    best = cands[0] if cands[0].feasible else None
    return SearchResult(best, None if best else cands[0], _runner_ups(cands[1:], best),
                        {"grid": space.size}, space.size, wall, t1 - t0,
                        feasible_count=int(count))


def _runner_ups(cands: list[Candidate], best: Candidate | None, k: int = 5,
                min_node_gap: float = 0.02) -> list[Candidate]:
    """Feasible candidates by epoch time, each a real alternative to those already listed.

    A candidate is listed when, against every listed one (the best included), it has another
    learner count per node or a node count more than ``min_node_gap`` (relative) away.
    """
    listed = [] if best is None else [best]
    out = []
    for c in sorted((c for c in cands if c.feasible), key=lambda c: c.epoch_time_s):
        if all(c.gpus_per_node != p.gpus_per_node
               or abs(c.nodes - p.nodes) > min_node_gap * max(p.nodes, 1) for p in listed):
            listed.append(c)
            out.append(c)
        if len(out) == k:
            break
    return out


# ----------------------------------------------------------------------------------------------
# Gradient search
# ----------------------------------------------------------------------------------------------


def _box(space: Space) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of the search variables ``z``: ``log x`` for the integers, ``p`` for precision."""
    lo = np.concatenate([np.log(space.lower.astype(np.float64)), np.zeros(space.num_precision)])
    hi = np.concatenate([np.log(space.upper.astype(np.float64)), np.ones(space.num_precision)])
    return lo.astype(np.float32), hi.astype(np.float32)


def _relaxation_fn(space: Space, batch: int, outer: int, inner: int):
    """Jitted augmented-Lagrangian solve of ``batch`` relaxed problems with per-problem boxes.

    ``run(machine, tgt, z0, lo, hi, lr, rho0, rho_growth, lr_decay) -> (x, merit, traj)``; a
    variable is fixed by giving it ``lo = hi``. ``merit`` is the log epoch time where the relaxed
    point meets every constraint to within 1e-3 (log units), else ``INFEASIBLE_SCORE`` + the violation.
    """
    nprec = space.num_precision

    def to_x(z):  # integer variables are searched in log space, precision ones directly
        return jnp.concatenate([jnp.exp(z[:3]), z[3:]]) if nprec else jnp.exp(z)

    def run(machine, tgt, z0, lo, hi, lr, rho0, rho_growth, lr_decay):
        sp = dataclasses.replace(space, machine=machine)

        def parts(z):
            s = evaluate(sp, machine, to_x(z))
            return jnp.log(s.epoch_time_s), constraints(sp, s, tgt), s

        def lagrangian(z, lam, rho):
            f, c, s = parts(z)
            pen = jnp.sum((jnp.maximum(0.0, lam + rho * c) ** 2 - lam ** 2) / (2.0 * rho))
            return f + pen, s

        adam = optax.scale_by_adam()

        def one(z, lo, hi):
            z = jnp.clip(z, lo, hi)
            lam = jnp.zeros_like(parts(z)[1])

            def inner_step(carry, _):
                z, opt, lam, rho, step_size = carry
                (_, s), gz = jax.value_and_grad(lagrangian, has_aux=True)(z, lam, rho)
                upd, opt = adam.update(gz, opt)
                z = jnp.clip(z - step_size * upd, lo, hi)  # projected step: the box holds exactly
                return (z, opt, lam, rho, step_size), jnp.stack([s.epoch_time_s, s.mean_minibatch])

            def outer_step(carry, _):
                carry, traj = jax.lax.scan(inner_step, carry, None, length=inner)
                z, opt, lam, rho, step_size = carry
                lam = jnp.maximum(0.0, lam + rho * parts(z)[1])
                return (z, opt, lam, rho * rho_growth, step_size * lr_decay), traj

            carry = (z, adam.init(z), lam, jnp.float32(rho0), jnp.float32(lr))
            (z, *_), traj = jax.lax.scan(outer_step, carry, None, length=outer)
            f, c, _ = parts(z)
            viol = jnp.sum(jnp.maximum(c, 0.0))
            merit = jnp.where(viol <= 1e-3, f, INFEASIBLE_SCORE + viol)
            return z, merit, traj.reshape(outer * inner, 2)

        return jax.vmap(one)(z0, lo, hi)

    return jax.jit(run)


def _neighbourhood(space: Space, x: np.ndarray, fractions=(0.05, 0.15, 0.4)) -> np.ndarray:
    """Discrete neighbours of configurations ``x`` ``[S, dims]`` -> ``[S, C, dims]`` (C fixed).

    Integer variables: every combination of steps ``0, +-1, +-2, +-3, +-max(4, f v)`` for ``f`` in
    ``fractions``; precision variables: each single flip combined with each sub-batch step.
    Out-of-range values are clipped (duplicates are harmless).
    """
    steps = []
    for d in range(3):
        v = x[:, d:d + 1].astype(np.int64)
        rel = [np.maximum(4, np.rint(v * f).astype(np.int64)) for f in fractions]
        cols = [np.zeros_like(v)] + [np.full_like(v, s * k) for k in (1, 2, 3) for s in (-1, 1)]
        cols += [s * r for r in rel for s in (-1, 1)]
        steps.append(np.concatenate(cols, 1))  # [S, 13]
    m = steps[0].shape[1]
    sn = steps[0][:, :, None, None]
    sg = steps[1][:, None, :, None]
    sb = steps[2][:, None, None, :]
    shape = (x.shape[0], m, m, m)
    delta = np.stack([np.broadcast_to(sn, shape), np.broadcast_to(sg, shape),
                      np.broadcast_to(sb, shape)], -1).reshape(x.shape[0], m ** 3, 3)
    base = np.repeat(x[:, None, :], m ** 3, 1).astype(np.int64)
    base[:, :, :3] += delta
    out = [base]
    if space.num_precision:
        rows = space.num_precision
        flips = np.repeat(x[:, None, :], rows * m, 1).astype(np.int64)  # [S, rows*m, dims]
        for r in range(rows):
            sl = slice(r * m, (r + 1) * m)
            flips[:, sl, 3 + r] = 1 - flips[:, sl, 3 + r]
            flips[:, sl, 2] += steps[2]
        out.append(flips)
    nb = np.concatenate(out, 1)
    nb[:, :, :3] = np.clip(nb[:, :, :3], space.lower, space.upper)
    return nb


def _beam(z: np.ndarray, merit: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` best distinct points (by merit; duplicates only to fill up)."""
    order = np.argsort(merit, kind="stable")
    keys = np.round(z, 3)
    picked, seen = [], set()
    for i in order:
        key = keys[i].tobytes()
        if key not in seen:
            seen.add(key)
            picked.append(i)
        if len(picked) == k:
            break
    picked += [picked[j % len(picked)] for j in range(k - len(picked))]
    return np.asarray(picked)


def gradient_search(space: Space, target: Target, *, starts: int = 32, outer: int = 6,
                    inner: int = 50, learning_rate: float = 0.1, rho0: float = 10.0,
                    rho_growth: float = 3.0, lr_decay: float = 0.8, refine_seeds: int = 4,
                    max_refine_steps: int = 40, seed: int = 0) -> SearchResult:
    """Gradient-based search over the relaxed configuration, then rounding and discrete refinement.

    1. **Relax.** ``2 * starts`` random points in the box are optimised by the augmented
       Lagrangian with projected Adam (module docstring); the best ``starts`` are kept.
    2. **Round (relax-and-fix, as a beam).** The precision variables are rounded at 1/2; then
       the integer variables one at a time, coarsest range first: each kept point branches on
       the floor and the ceiling of the variable, the remaining free variables are re-optimised
       from there (warm start), and the ``starts`` best distinct branches are kept (so when the
       starts agree, both roundings survive). This lets the other variables absorb a rounding
       step (e.g. fewer learners per node, more nodes) instead of leaving the band.
    3. **Refine.** The best ``refine_seeds`` integer points climb over the discrete neighbourhood
       (every combination of small and relative steps) with exact evaluations, until no
       neighbour is better (feasible first, then the epoch time).

    Args:
      space: The space.
      target: Constraints.
      starts: Relaxed problems kept after step 1 (``2 * starts`` are solved in one vmapped call).
      outer: Augmented-Lagrangian outer iterations (multiplier updates) per solve.
      inner: Adam steps per outer iteration.
      learning_rate: Adam step size (log units for the integer variables), multiplied by
        ``lr_decay`` after each outer iteration.
      rho0: Initial penalty weight, multiplied by ``rho_growth`` after each outer iteration.
      rho_growth: Penalty growth factor.
      lr_decay: Step-size decay per outer iteration.
      refine_seeds: Integer points refined by hill climbing.
      max_refine_steps: Hill-climbing steps at most.
      seed: Seed of the starting points.

    Returns:
      :class:`SearchResult`: the best feasible configuration (or the closest one when none is
      feasible), runner-ups, evaluation counts (``gradient``: value-and-gradient evaluations of
      the relaxation; ``discrete``: exact evaluations) and the trajectories of step 1.
    """
    tgt = target_array(target)
    batch = 2 * starts
    lo0, hi0 = _box(space)
    t0 = time.perf_counter()
    relax = space.jitted(("relax", batch, outer, inner), lambda: _relaxation_fn(space, batch, outer, inner))
    hyper = tuple(jnp.float32(v) for v in (learning_rate, rho0, rho_growth, lr_decay))
    u0 = np.asarray(jax.random.uniform(jax.random.PRNGKey(seed), (batch, space.dims)))
    z0 = lo0 + (hi0 - lo0) * u0
    lo = np.tile(lo0, (batch, 1))
    hi = np.tile(hi0, (batch, 1))
    compiled = relax.lower(space.machine, tgt, z0, lo, hi, *hyper).compile()
    score_configs(space, tgt, np.zeros((1, space.dims)) + 1)  # compiles the exact evaluation
    t1 = time.perf_counter()
    evals = {"gradient": 0, "discrete": 0}

    def solve(z, lo, hi):
        z, merit, traj = compiled(space.machine, tgt, z, lo, hi, *hyper)
        evals["gradient"] += batch * outer * inner
        return np.asarray(z), np.asarray(merit), np.asarray(traj)

    # 1. Relax from random starts; keep the best half.
    z, merit, traj = solve(z0, lo, hi)
    keep = np.argsort(merit, kind="stable")[:starts]
    z, lo, hi = z[keep], lo[keep], hi[keep]

    # 2. Relax-and-fix: precision at 1/2 (all at once), then each integer variable, coarsest first.
    if space.num_precision:
        p = np.rint(z[:, 3:])
        z[:, 3:], lo[:, 3:], hi[:, 3:] = p, p, p
    for d in np.argsort(space.upper - space.lower, kind="stable"):
        v = np.exp(z[:, d].astype(np.float64))
        branches = np.clip(np.stack([np.floor(v), np.ceil(v)]), space.lower[d], space.upper[d])
        zb, lob, hib = (np.concatenate([a, a]) for a in (z, lo, hi))
        fixed = np.log(branches.reshape(-1)).astype(np.float32)
        zb[:, d], lob[:, d], hib[:, d] = fixed, fixed, fixed
        zb, mb, _ = solve(zb, lob, hib)
        pick = _beam(zb, mb, starts)
        z, lo, hi = zb[pick], lob[pick], hib[pick]
    x_int = np.concatenate([np.rint(np.exp(z[:, :3].astype(np.float64))), np.rint(z[:, 3:])], 1)
    x_int = np.clip(x_int.astype(np.int64), np.concatenate([space.lower, np.zeros(space.num_precision,
                                                                                  np.int64)]),
                    np.concatenate([space.upper, np.ones(space.num_precision, np.int64)]))

    # 3. Exact evaluation and hill climbing over the discrete neighbourhood.
    seen: dict[tuple, tuple[float, Candidate]] = {}

    def run_eval(xs: np.ndarray) -> np.ndarray:
        s, sc, ok, viol = score_configs(space, tgt, xs)
        evals["discrete"] += len(xs)
        for i in np.nonzero(ok)[0]:  # feasible ones, for the runner-ups
            key = tuple(xs[i])
            if key not in seen:
                seen[key] = (float(sc[i]), _candidate(space, xs, s, i, ok, viol))
        return sc

    sc = run_eval(x_int)
    seeds, keys = [], set()
    for i in np.argsort(sc, kind="stable"):
        if tuple(x_int[i]) not in keys:
            keys.add(tuple(x_int[i]))
            seeds.append(i)
        if len(seeds) == refine_seeds:
            break
    seeds += [seeds[-1]] * (refine_seeds - len(seeds))
    cur, cur_score = x_int[seeds].copy(), sc[seeds].copy()
    for _ in range(max_refine_steps):
        nb = _neighbourhood(space, cur)
        sc = run_eval(nb.reshape(-1, space.dims)).reshape(nb.shape[:2])
        j = np.argmin(sc, 1)
        new = sc[np.arange(len(cur)), j]
        moved = new < cur_score - 1e-7
        if not moved.any():
            break
        cur[moved] = nb[np.arange(len(cur)), j][moved]
        cur_score[moved] = new[moved]
    wall = time.perf_counter() - t1

    best = evaluate_configs(space, target, cur[int(np.argmin(cur_score))][None])[0]
    feasible = [c for _, c in sorted(seen.values(), key=lambda v: v[0])]
    if feasible and (not best.feasible or feasible[0].epoch_time_s < best.epoch_time_s):
        best = feasible[0]
    ok = best.feasible
    return SearchResult(best if ok else None, None if ok else best,
                        _runner_ups(feasible, best if ok else None), evals, space.size, wall,
                        t1 - t0, trajectory=traj[keep])
