r"""Gradient search against the exhaustive grid on the SPRINT model (the measurements of docs/perf-search.md).

Part 1: for every machine x network x target, :func:`jaxsprint.perf.search.gradient_search` and
:func:`jaxsprint.perf.search.grid_search` on the same space (nodes 1..--max_nodes): chosen configurations,
the gap of the gradient search to the grid's optimum, evaluations and wall time (median of --repeats, after
compilation). Part 2 (--precision_targets): the per-layer precision space on DGX H100, where no grid can go,
against an fp32 grid, a greedy precision choice plus grid, random search with the same evaluation budget and
a rigorous lower bound of the epoch time. Prints tables; --out_json writes everything.

    .venv/bin/python scripts/bench_search.py --out_json=docs/perf-search.json     # ~4 min on 2 cores
    .venv/bin/python scripts/bench_search.py --machines=abci --networks=resnet8 --targets=256 \
        --max_nodes=16 --max_sub_batch=64 --precision_networks=resnet8 --precision_targets=256 --repeats=1
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np
from absl import flags

import benchlib
from jaxsprint import cli
from jaxsprint.errors import check
from jaxsprint.perf import machines, search, zoo
from jaxsprint.perf import space as spaces

_MACHINES = flags.DEFINE_list("machines", ["tsubame_kfc_dl", "dgx_h100"], "Machine presets of part 1.")
_NETWORKS = flags.DEFINE_list("networks", ["resnet50", "vgg16"], "Networks of part 1.")
_TARGETS = flags.DEFINE_list("targets", ["1024", "4096", "8192", "16384", "65536"], "Target mean mini-batches.")
_MAX_NODES = flags.DEFINE_integer("max_nodes", 2048, "Nodes of every space (the real machines have 40 and 32: "
                                  "a target of 65,536 needs hypothetical ones).")
_MAX_SUB_BATCH = flags.DEFINE_integer("max_sub_batch", None, "Largest sub-batch of every space (default: the "
                                      "largest that fits the accelerator memory, at most 4,096).")
_PRECISION_MACHINE = flags.DEFINE_string("precision_machine", "dgx_h100", "Machine of part 2.")
_PRECISION_NETWORKS = flags.DEFINE_list("precision_networks", ["resnet50", "vgg16"], "Networks of part 2.")
_PRECISION_TARGETS = flags.DEFINE_list("precision_targets", ["1024", "8192", "65536"],
                                       "Targets of part 2 (empty: skip part 2).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats per search (median wall time).")
_OUT_JSON = flags.DEFINE_string("out_json", "", "Write the results here (empty: do not write).")


def _timed(fn, repeats: int):
    """``(first result, median of the results' wall_s)``; each search compiles before its own clock starts."""
    results = [fn() for _ in range(repeats)]
    return results[0], statistics.median(r.wall_s for r in results)


def _cfg(c: search.Candidate | None) -> list[int] | None:
    return None if c is None else [c.nodes, c.gpus_per_node, c.sub_batch]


def _epochs(space: spaces.Space, target: spaces.Target, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact epoch times and feasibility of many configurations."""
    s, _, ok, _ = spaces.score_configs(space, target, x, chunk=1 << 15)
    return s.epoch_time_s, ok


def _greedy_precision(space: spaces.Space) -> np.ndarray:
    """Low-precision rows by gradient bytes per share of forward FLOPs, within the budget."""
    net, phi = space.network, space.precision.max_low_fraction
    w = np.asarray(net.count * net.fwd_flops, np.float64)
    w = w / w.sum()
    v = np.asarray(net.count * net.params, np.float64) + 1e-9 * np.asarray(net.count * net.out_elems)
    p, used = np.zeros(len(w), int), 0.0
    for i in np.argsort(-v / np.maximum(w, 1e-30)):
        if used + w[i] <= phi + 1e-9:
            p[i], used = 1, used + w[i]
    return p


def _fixed_precision_grid(space: spaces.Space, target: spaces.Target, p: np.ndarray):
    """Exhaustive search over (n, g, b) with the precision rows fixed to ``p``: ``((config, epoch) | None, n)``."""
    n, g, b = np.meshgrid(np.arange(1, space.max_nodes + 1), np.arange(1, space.max_gpus_per_node + 1),
                          np.arange(space.min_sub_batch, space.max_sub_batch + 1), indexing="ij")
    x = np.stack([n.ravel(), g.ravel(), b.ravel()], 1)
    x = np.concatenate([x, np.broadcast_to(p, (len(x), len(p)))], 1)
    epoch, ok = _epochs(space, target, x)
    if not ok.any():
        return None, len(x)
    i = int(np.argmin(np.where(ok, epoch, np.inf)))
    return (x[i, :3].tolist(), float(epoch[i])), len(x)


def _lower_bound(space: spaces.Space, target: spaces.Target) -> float:
    """A rigorous lower bound of the epoch time over the precision space (under the model).

    ``T_epoch = N_file T_u / E[B]`` for every configuration and ``E[B] <= (1 + tau) B*`` for a feasible one,
    so ``T_epoch >= N_file min T_u / ((1 + tau) B*)`` over the ``(n, g)`` that can reach ``(1 - tau) B*`` at
    all. ``T_u`` is bounded below by the fractional knapsack of the gradient bytes under the FLOP budget (a
    relaxation of the 0/1 choice); the reachable mini-batch is bounded above by
    ``n g T_u^{fp32} max_b b / T_c^{all low}(b)``.
    """
    net, prec = space.network, space.precision
    w = np.asarray(net.count * net.fwd_flops, np.float64)
    w = w / w.sum()
    val = np.asarray(net.count * net.params, np.float64)
    p_frac, used = np.zeros(len(w)), 0.0
    for i in np.argsort(-val / np.maximum(w, 1e-30)):
        take = 1.0 if w[i] <= 0 else min(1.0, max(0.0, (prec.max_low_fraction - used) / w[i]))
        p_frac[i], used = take, used + take * w[i]
    nn, gg = np.meshgrid(np.arange(1, space.max_nodes + 1), np.arange(1, space.max_gpus_per_node + 1),
                         indexing="ij")
    ng = np.stack([nn.ravel(), gg.ravel(), np.ones(nn.size)], 1)
    stats = lambda x: spaces.score_configs(space, target, x)[0]  # noqa: E731
    tu_lb = stats(np.concatenate([ng, np.broadcast_to(p_frac, (len(ng), len(w)))], 1)).t_update_s
    tu_32 = stats(np.concatenate([ng, np.zeros((len(ng), len(w)))], 1)).t_update_s
    gb = np.stack(np.meshgrid(np.arange(1, space.max_gpus_per_node + 1),
                              np.arange(space.min_sub_batch, space.max_sub_batch + 1), indexing="ij"), -1)
    gb = gb.reshape(-1, 2)
    tc_low = stats(np.concatenate([np.ones((len(gb), 1)), gb, np.ones((len(gb), len(w)))], 1)).t_compute_s
    rate = (gb[:, 1] / tc_low).reshape(space.max_gpus_per_node, -1).max(1)  # samples/s per learner
    reach = ng[:, 0] * ng[:, 1] * tu_32 * rate[ng[:, 1].astype(int) - 1]
    ok = reach >= (1 - target.tolerance) * target.minibatch
    if not ok.any():
        return float("inf")
    return float(space.dataset_size * tu_lb[ok].min() / ((1 + target.tolerance) * target.minibatch))


def grid_cases(repeats: int) -> list[dict[str, Any]]:
    """Part 1: gradient search against the grid on every machine x network x target."""
    cases, rows = [], []
    for mname in _MACHINES.value:
        for nname in _NETWORKS.value:
            space = spaces.make_space(zoo.get(nname), machines.get(mname), max_nodes=_MAX_NODES.value,
                                      max_sub_batch=_MAX_SUB_BATCH.value)
            for t in map(int, _TARGETS.value):
                target = spaces.make_target(t)
                g, g_wall = _timed(lambda: search.gradient_search(space, target), repeats)
                r, r_wall = _timed(lambda: search.grid_search(space, target), repeats)
                gap = g.best.epoch_time_s / r.best.epoch_time_s - 1 if g.best and r.best else None
                cases.append(dict(
                    machine=mname, network=nname, target=t, space_size=space.size,
                    gradient=dict(config=_cfg(g.best), epoch_time_s=g.best and g.best.epoch_time_s,
                                  evaluations=g.evaluations, total_evaluations=g.total_evaluations,
                                  wall_s=g_wall, compile_s=g.compile_s),
                    grid=dict(config=_cfg(r.best), epoch_time_s=r.best and r.best.epoch_time_s,
                              evaluations=r.space_size, wall_s=r_wall, compile_s=r.compile_s,
                              feasible_count=r.feasible_count),
                    gap=gap))
                rows.append([mname, nname, str(t), f"{space.size:,}", str(_cfg(g.best)), str(_cfg(r.best)),
                             "-" if gap is None else f"{100 * gap:+.3f}%", f"{g.total_evaluations:,}",
                             f"{r.space_size:,}", f"{g_wall:.2f}s", f"{r_wall:.2f}s"])
                print(" | ".join(rows[-1]), flush=True)
    print(benchlib.format_table(["machine", "network", "target", "space", "gradient search", "grid optimum", "gap",
                                 "evals grad", "evals grid", "wall grad", "wall grid"], rows))
    return cases


def grid_summary(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """How close and how much cheaper the gradient search was."""
    gaps = [c["gap"] for c in cases if c["gap"] is not None]
    return dict(cases=len(cases), within_1_percent=sum(g <= 0.01 for g in gaps), exact=sum(g <= 1e-6 for g in gaps),
                max_gap=max(gaps) if gaps else None,
                median_evaluation_ratio=float(np.median([c["grid"]["evaluations"] / c["gradient"]["total_evaluations"]
                                                         for c in cases])),
                median_wall_ratio=float(np.median([c["grid"]["wall_s"] / c["gradient"]["wall_s"] for c in cases])))


def precision_cases(repeats: int) -> list[dict[str, Any]]:
    """Part 2: the precision space (2^rows more configurations) against the baselines and a lower bound."""
    machine = machines.get(_PRECISION_MACHINE.value)
    rng = np.random.default_rng(0)
    out, rows = [], []
    for nname in _PRECISION_NETWORKS.value:
        net = zoo.get(nname)
        base = spaces.make_space(net, machine, max_nodes=_MAX_NODES.value, max_sub_batch=_MAX_SUB_BATCH.value)
        space = spaces.make_space(net, machine, max_nodes=_MAX_NODES.value, max_sub_batch=base.max_sub_batch,
                                  precision=spaces.Precision())
        p_greedy = _greedy_precision(space)
        for t in map(int, _PRECISION_TARGETS.value):
            target = spaces.make_target(t)
            g, g_wall = _timed(lambda: search.gradient_search(space, target), repeats)
            fp32 = search.grid_search(base, target)
            greedy, greedy_evals = _fixed_precision_grid(space, target, p_greedy)
            k = g.total_evaluations
            xr = np.concatenate([
                np.exp(rng.uniform(0, np.log(space.upper + 1), (k, 3))).astype(int).clip(space.lower, space.upper),
                (rng.random((k, space.num_precision)) < 0.5).astype(int)], 1)
            ep, ok = _epochs(space, target, xr)
            rand = float(ep[ok].min()) if ok.any() else None
            lb = _lower_bound(space, target)
            best = g.best.epoch_time_s if g.best else None
            out.append(dict(network=nname, target=t, space_size=float(space.size), rows=space.num_precision,
                            fp32_grid=fp32.best and fp32.best.epoch_time_s, fp32_config=_cfg(fp32.best),
                            greedy_grid=greedy and greedy[1], greedy_config=greedy and greedy[0],
                            greedy_evaluations=greedy_evals, random_search=rand, random_evaluations=k,
                            gradient=best, gradient_config=_cfg(g.best),
                            gradient_low_rows=int(sum(g.best.low_precision)) if g.best else None,
                            gradient_low_fraction=g.best.low_fraction if g.best else None,
                            evaluations=g.evaluations, wall_s=g_wall, compile_s=g.compile_s,
                            lower_bound=lb, gap_to_bound=best / lb - 1 if best else None))
            fmt = lambda v: "none" if v is None else f"{v:.4g}"  # noqa: E731
            rows.append([nname, str(t), f"{space.size:.2e}", fmt(out[-1]["fp32_grid"]), fmt(out[-1]["greedy_grid"]),
                         fmt(rand), fmt(best), fmt(lb),
                         "-" if best is None else f"{100 * out[-1]['gap_to_bound']:+.2f}%", f"{k:,}",
                         f"{g_wall:.2f}s"])
            print(" | ".join(rows[-1]), flush=True)
    print(benchlib.format_table(["network", "target", "space", "fp32 grid", "greedy+grid", "random", "gradient",
                                 "lower bd", "gap to bd", "evals", "wall"], rows))
    return out


def main(argv: list[str]) -> None:
    check(len(argv) == 1, "arguments", argv[1:], "none besides --flags")
    check(_REPEATS.value >= 1, "--repeats", _REPEATS.value, "an integer >= 1")
    for name in _MACHINES.value + [_PRECISION_MACHINE.value]:
        machines.get(name)  # unknown names fail before anything runs
    for name in _NETWORKS.value + _PRECISION_NETWORKS.value:
        zoo.get(name)
    t0 = time.perf_counter()
    import jax

    out: dict[str, Any] = dict(machine="jax " + jax.__version__ + " on " + jax.default_backend(),
                               max_nodes=_MAX_NODES.value, repeats=_REPEATS.value)
    out["cases"] = grid_cases(_REPEATS.value) if _TARGETS.value else []
    if out["cases"]:
        out["summary"] = grid_summary(out["cases"])
        print(out["summary"])
    out["precision"] = precision_cases(_REPEATS.value) if _PRECISION_TARGETS.value else []
    out["total_wall_s"] = time.perf_counter() - t0
    if _OUT_JSON.value:
        benchlib.write_json(_OUT_JSON.value, out)
        print(f"wrote {_OUT_JSON.value} ({out['total_wall_s']:.0f} s)")


if __name__ == "__main__":
    cli.run(main)
