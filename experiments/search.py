r"""Choose SPRINT's fastest configuration for a target mini-batch: gradient search on the model.

    .venv/bin/python experiments/search.py --machine=tsubame_kfc_dl --network=resnet50 \
        --target_minibatch=8192 --max_nodes=2048          # ~10 s on 2 cores (mostly compilation)

Prints the chosen ``(nodes, learners per node, sub-batch)``, its predicted epoch time, mean
mini-batch and staleness, the runner-ups and how many model evaluations the search used against
the grid's. ``--grid`` also runs the exhaustive grid and compares; ``--sensitivities`` prints
d(epoch time)/d(machine figure) at the chosen configuration; ``--precision`` adds a per-layer
precision choice (a space no grid can enumerate); ``--plot=FILE.png`` draws the search
trajectory on the epoch-time / mini-batch plane; ``--json`` prints one JSON object;
``--machine_file`` reads a preset written by ``experiments/calibrate.py``.

``--benchmark`` runs the measurements of ``docs/perf-search.md`` (about 4 minutes here) and
writes ``--benchmark_json``. Bad input exits with status 2 and one message naming the flag.
"""
from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

from absl import app, flags

from jaxsprint.cli import parse_flags  # noqa: F401  (app.run below; in-process tests)

from jaxsprint.errors import JaxsprintError
from jaxsprint.perf import calibrate, collectives, machines, networks, search, sprint

FLAGS = flags.FLAGS
flags.DEFINE_string("machine", None, f"Machine preset: {', '.join(machines.PRESETS)}.")
flags.DEFINE_string("machine_file", None, "A calibrated machine preset (JSON from "
                    "experiments/calibrate.py) instead of --machine.")
flags.DEFINE_string("network", None, f"Network of the zoo: {', '.join(sorted(networks.ZOO))}.")
flags.DEFINE_float("target_minibatch", None, "Target mean mini-batch B* in samples.")
flags.DEFINE_float("tolerance", 0.05, "Relative tolerance: |E[B] / B* - 1| <= tolerance.")
flags.DEFINE_float("max_staleness", None, "Largest allowed mean staleness (default: no limit).")
flags.DEFINE_integer("max_nodes", None, "Nodes available (default: the machine's; more is "
                     "a hypothetical machine, with a warning).")
flags.DEFINE_integer("max_gpus_per_node", None, "Learners per node available (default: the machine's).")
flags.DEFINE_integer("max_sub_batch", None, "Largest sub-batch (default: the largest that fits).")
flags.DEFINE_integer("min_sub_batch", 1, "Smallest sub-batch.")
flags.DEFINE_string("allreduce", "ring", f"Inter-node all-reduce: {', '.join(collectives.ALGORITHMS)}.")
flags.DEFINE_integer("dataset_size", sprint.IMAGENET_TRAIN_IMAGES, "Samples per epoch N_File.")
flags.DEFINE_bool("precision", False, "Add a low-precision choice per layer row (2^rows more "
                  "configurations; see jaxsprint.perf.search.Precision).")
flags.DEFINE_float("low_peak_factor", 989.0 / 67.0, "With --precision: low-precision peak over fp32.")
flags.DEFINE_float("max_low_fraction", 0.5, "With --precision: largest share of forward FLOPs in "
                   "low precision.")
flags.DEFINE_integer("starts", 32, "Starting points of the gradient search.")
flags.DEFINE_integer("seed", 0, "Seed of the starting points.")
flags.DEFINE_bool("grid", False, "Also run the exhaustive grid search and compare.")
flags.DEFINE_bool("sensitivities", False, "Print d log(epoch time) / d log(figure) at the result.")
flags.DEFINE_bool("json", False, "Print one JSON object instead of the tables.")
flags.DEFINE_string("plot", None, "Write a PNG of the search on the epoch-time / mini-batch plane.")
flags.DEFINE_bool("benchmark", False, "Run the measurements of docs/perf-search.md instead.")
flags.DEFINE_string("benchmark_json", "docs/perf-search.json", "Where --benchmark writes its results.")
flags.DEFINE_integer("repeats", 3, "--benchmark: timed repeats per search (median wall time).")

_OUR_FLAGS = ("machine", "machine_file", "network", "target_minibatch", "tolerance",
              "max_staleness", "max_nodes", "max_gpus_per_node", "max_sub_batch", "min_sub_batch",
              "allreduce", "dataset_size", "precision", "low_peak_factor", "max_low_fraction",
              "starts", "seed", "grid", "sensitivities", "json", "plot", "benchmark",
              "benchmark_json", "repeats")


class LauncherError(JaxsprintError):
    """A bad combination of flags (the message names the flags)."""


def load_machine(name: str | None, path: str | None) -> machines.Machine:
    """The machine of ``--machine`` or ``--machine_file`` (exactly one)."""
    if name and path:
        raise LauncherError(f"--machine={name} and --machine_file={path} were both given; allowed: one")
    if path:
        return calibrate.load_preset(path)[0]
    if not name:
        raise LauncherError("--machine is missing; give --machine (a preset: "
                            f"{', '.join(machines.PRESETS)}) or --machine_file")
    return machines.get(name)


def resolve(values: dict[str, Any]) -> tuple[search.Space, search.Target, list[str]]:
    """Validates the flags; returns the space, the target and warnings."""
    machine = load_machine(values["machine"], values["machine_file"])
    if not values["network"]:
        raise LauncherError(f"--network is missing; allowed: {', '.join(sorted(networks.ZOO))}")
    net = networks.get(values["network"])
    if values["target_minibatch"] is None:
        raise LauncherError("--target_minibatch is missing; allowed: a number >= 1 (samples)")
    target = search.make_target(values["target_minibatch"], values["tolerance"],
                                values["max_staleness"])
    precision = None
    if values["precision"]:
        precision = search.Precision(low_peak_factor=values["low_peak_factor"],
                                     max_low_fraction=values["max_low_fraction"])
    if values["starts"] < 1:
        raise LauncherError(f"starts={values['starts']} is not allowed; allowed: an integer >= 1")
    space = search.make_space(net, machine, max_nodes=values["max_nodes"],
                              max_gpus_per_node=values["max_gpus_per_node"],
                              max_sub_batch=values["max_sub_batch"],
                              min_sub_batch=values["min_sub_batch"],
                              dataset_size=values["dataset_size"], algorithm=values["allreduce"],
                              precision=precision)
    warnings = []
    if space.max_nodes > float(machine.max_nodes):
        warnings.append(f"max_nodes={space.max_nodes} exceeds the {int(float(machine.max_nodes))} "
                        f"nodes of {machine.name}: configurations above are for a hypothetical "
                        "larger machine")
    return space, target, warnings


def run(space: search.Space, target: search.Target, *, starts: int, seed: int, grid: bool,
        sensitivities: bool) -> dict[str, Any]:
    """The search (and optionally the grid and the sensitivities) as one JSON-ready object."""
    res = search.gradient_search(space, target, starts=starts, seed=seed)
    out: dict[str, Any] = {
        "feasible": res.feasible,
        "best": res.best.as_dict() if res.best else None,
        "closest": res.closest.as_dict() if res.closest else None,
        "runner_ups": [c.as_dict() for c in res.runner_ups],
        "evaluations": res.evaluations,
        "total_evaluations": res.total_evaluations,
        "space_size": float(res.space_size) if res.space_size > 2 ** 53 else res.space_size,
        "wall_s": res.wall_s,
        "compile_s": res.compile_s,
    }
    if grid:
        g = search.grid_search(space, target)
        out["grid"] = {"best": g.best.as_dict() if g.best else None, "evaluations": g.space_size,
                       "feasible_count": g.feasible_count, "wall_s": g.wall_s,
                       "compile_s": g.compile_s}
        if g.best and res.best:
            out["grid"]["gap"] = res.best.epoch_time_s / g.best.epoch_time_s - 1.0
    if sensitivities:
        c = res.best or res.closest
        rows = search.sensitivities(space, c.nodes, c.gpus_per_node, c.sub_batch)
        out["sensitivities"] = [r._asdict() for r in rows]
    out["_result"] = res
    return out


def _row(c: dict[str, Any]) -> str:
    low = f" {c['low_fraction']:9.2f}" if "low_fraction" in c else ""
    return (f"  {c['nodes']:6d} {c['gpus_per_node']:5d} {c['sub_batch']:9d} {c['epoch_time_s']:12.4g}"
            f" {c['mean_minibatch']:12.6g} {c['mean_staleness']:10.4g}{low}")


def table(space: search.Space, target: search.Target, out: dict[str, Any], warnings: list[str]) -> str:
    """Human-readable report."""
    lo, hi = target.minibatch * (1 - target.tolerance), target.minibatch * (1 + target.tolerance)
    band = f"{target.minibatch:g} +- {100 * target.tolerance:g}% ({lo:.6g}..{hi:.6g})"
    stale = (f", mean staleness <= {target.max_staleness:g}"
             if math.isfinite(target.max_staleness) else "")
    lines = [f"search: {networks.describe(space.network)}",
             f"        on {space.machine.name}: {space.machine.description}",
             f"        target mean mini-batch {band}"
             + stale,
             f"        nodes 1..{space.max_nodes}, learners per node 1..{space.max_gpus_per_node}, "
             f"sub-batch {space.min_sub_batch}..{space.max_sub_batch}"
             + (f", low precision per row ({space.num_precision} rows, at most "
                f"{100 * space.precision.max_low_fraction:g}% of forward FLOPs)" if space.precision else "")
             + f": {space.size:.4g} configurations"]
    head = (f"  {'nodes':>6s} {'gpus':>5s} {'sub-batch':>9s} {'epoch (s)':>12s} {'mini-batch':>12s} "
            f"{'staleness':>10s}" + (f" {'low share':>9s}" if space.precision else ""))
    if out["best"]:
        b = out["best"]
        lines += ["chosen configuration:", head, _row(b),
                  f"  T_c {b['t_compute_s']:.4g} s, T_u {b['t_update_s']:.4g} s, memory per learner "
                  f"{b['memory_bytes'] / 1e9:.2f} GB"]
        if space.precision:
            rows = [space.network.layer_names[i] for i, v in enumerate(b["low_precision"]) if v]
            lines.append(f"  low-precision rows ({len(rows)}): {', '.join(rows) if rows else 'none'}")
        if out["runner_ups"]:
            lines += ["runner-ups (other learners per node, or nodes more than 2% apart):", head]
            lines += [_row(c) for c in out["runner_ups"]]
    else:
        c = out["closest"]
        lines += ["no configuration meets the target; the closest one:", head, _row(c),
                  f"  (constraint violation {c['violation']:.3g} in log units; try a larger "
                  "--max_nodes, a wider --tolerance or another target)"]
    ev = out["evaluations"]
    lines.append(f"evaluations: {ev['gradient']:,} value-and-gradient (relaxation) + "
                 f"{ev['discrete']:,} exact (rounding, refinement) = {out['total_evaluations']:,}, "
                 f"against {space.size:.4g} for the grid; search {out['wall_s']:.2f} s "
                 f"(+ {out['compile_s']:.1f} s compilation)")
    if "grid" in out:
        g = out["grid"]
        gb = g["best"]
        res = (f"optimum {gb['nodes']} x {gb['gpus_per_node']} x {gb['sub_batch']}, epoch "
               f"{gb['epoch_time_s']:.4g} s" if gb else "no feasible configuration")
        gap = f"; gradient search within {100 * g['gap']:+.3f}%" if "gap" in g else ""
        lines.append(f"grid: {g['evaluations']:,} evaluations in {g['wall_s']:.2f} s "
                     f"(+ {g['compile_s']:.1f} s compilation), {g['feasible_count']:,} feasible; "
                     f"{res}{gap}")
    if "sensitivities" in out:
        rows = [search.Sensitivity(**r) for r in out["sensitivities"]]
        lines += ["sensitivities of the epoch time at this configuration "
                  "(elasticities; 'mini-batch kept': nodes move to keep the mean mini-batch):",
                  search.sensitivity_table(rows)]
    lines += [f"warning: {w}" for w in warnings]
    return "\n".join(lines)


def plot(path: str, space: search.Space, target: search.Target, out: dict[str, Any],
         samples: int = 20_000, seed: int = 0) -> None:
    """The search on the epoch-time / mini-batch plane, over a random sample of the space."""
    import matplotlib  # optional dependency (the "plot" extra)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rng = np.random.default_rng(seed)
    x = np.stack([rng.integers(1, space.max_nodes + 1, samples),
                  rng.integers(1, space.max_gpus_per_node + 1, samples),
                  rng.integers(space.min_sub_batch, space.max_sub_batch + 1, samples)], 1)
    if space.num_precision:
        x = np.concatenate([x, (rng.random((samples, space.num_precision)) < 0.3).astype(int)], 1)
    cands = search.evaluate_configs(space, target, x)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    mb = np.array([c.mean_minibatch for c in cands])
    ep = np.array([c.epoch_time_s for c in cands])
    lo, hi = target.minibatch * (1 - target.tolerance), target.minibatch * (1 + target.tolerance)
    traj = out["_result"].trajectory
    best = out["best"] or out["closest"]
    for ax, zoom in ((axes[0], False), (axes[1], True)):
        ax.scatter(mb, ep, s=2, c="0.75", label=f"{samples:,} random configurations")
        ax.axvspan(lo, hi, color="tab:green", alpha=0.15, label="target band")
        for i in range(traj.shape[0]):
            ax.plot(traj[i, :, 1], traj[i, :, 0], "-", lw=0.6, alpha=0.5, color="tab:blue",
                    label="relaxation trajectories (one per start)" if i == 0 else None)
            ax.plot(traj[i, -1, 1], traj[i, -1, 0], ".", ms=4, color="tab:blue")
        for j, c in enumerate(out["runner_ups"]):
            ax.plot(c["mean_minibatch"], c["epoch_time_s"], "s", ms=6, mfc="none", color="tab:orange",
                    label="runner-ups" if j == 0 else None)
        ax.plot(best["mean_minibatch"], best["epoch_time_s"], "*", ms=14, color="tab:red",
                label=f"chosen: {best['nodes']} x {best['gpus_per_node']} x {best['sub_batch']}")
        if out.get("grid", {}).get("best"):
            gb = out["grid"]["best"]
            ax.plot(gb["mean_minibatch"], gb["epoch_time_s"], "o", ms=12, mfc="none", color="k",
                    label="grid optimum")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("mean mini-batch (samples)")
        ax.set_ylabel("epoch time (s)")
        if zoom:
            ax.set_xlim(lo / 1.15, hi * 1.15)
            ax.set_ylim(best["epoch_time_s"] / 1.1, best["epoch_time_s"] * 1.6)
            ax.set_title("near the target band")
        else:
            ax.set_title(f"{space.network.name} on {space.machine.name}: target {target.minibatch:g}")
            ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# --benchmark: the measurements of docs/perf-search.md
# ----------------------------------------------------------------------------------------------

BENCH_MACHINES = ("tsubame_kfc_dl", "dgx_h100")
BENCH_NETWORKS = ("resnet50", "vgg16")
BENCH_TARGETS = (1024, 4096, 8192, 16384, 65536)
BENCH_MAX_NODES = 2048  # the real machines have 40 and 32 nodes: 65,536 needs hypothetical ones
PRECISION_TARGETS = (1024, 8192, 65536)


def _timed(fn, repeats: int):
    """``(first result, median of the results' wall_s)``; compilation happens before the clock."""
    results = [fn() for _ in range(repeats)]
    return results[0], float(sorted(r.wall_s for r in results)[len(results) // 2])


def _cfg(c: search.Candidate | None) -> list[int] | None:
    return None if c is None else [c.nodes, c.gpus_per_node, c.sub_batch]


def _chunks(space: search.Space, target: search.Target, x, chunk: int = 1 << 15):
    """Exact evaluation of many configurations in fixed-size chunks: (epoch, feasible) arrays."""
    import numpy as np
    n = len(x)
    epochs, oks = [], []
    for i in range(0, n, chunk):
        part = x[i:i + chunk]
        pad = chunk - len(part)
        if pad:
            part = np.concatenate([part, np.repeat(part[-1:], pad, 0)])
        s, ok, _ = search.score_configs(space, target, part)
        epochs.append(s.epoch_time_s[:chunk - pad])
        oks.append(ok[:chunk - pad])
    return np.concatenate(epochs), np.concatenate(oks)


def _greedy_precision(space: search.Space):
    """Low-precision rows by gradient bytes per share of forward FLOPs, within the budget."""
    import numpy as np
    net, phi = space.network, space.precision.max_low_fraction
    w = np.asarray(net.count * net.fwd_flops, np.float64)
    w = w / w.sum()
    v = np.asarray(net.count * net.params, np.float64) + 1e-9 * np.asarray(net.count * net.out_elems)
    p, used = np.zeros(len(w), int), 0.0
    for i in np.argsort(-v / np.maximum(w, 1e-30)):
        if used + w[i] <= phi + 1e-9:
            p[i], used = 1, used + w[i]
    return p


def _fixed_precision_grid(space: search.Space, target: search.Target, p):
    """Exhaustive search over (n, g, b) with the precision rows fixed to ``p``."""
    import numpy as np
    n, g, b = np.meshgrid(np.arange(1, space.max_nodes + 1), np.arange(1, space.max_gpus_per_node + 1),
                          np.arange(space.min_sub_batch, space.max_sub_batch + 1), indexing="ij")
    x = np.stack([n.ravel(), g.ravel(), b.ravel()], 1)
    x = np.concatenate([x, np.broadcast_to(p, (len(x), len(p)))], 1)
    epoch, ok = _chunks(space, target, x)
    if not ok.any():
        return None, len(x)
    i = int(np.argmin(np.where(ok, epoch, np.inf)))
    return (x[i, :3].tolist(), float(epoch[i])), len(x)


def _lower_bound(space: search.Space, target: search.Target) -> float:
    """A rigorous lower bound of the epoch time over the precision space (under the model).

    ``T_epoch = N_file T_u / E[B]`` for every configuration and ``E[B] <= (1 + tau) B*`` for a
    feasible one, so ``T_epoch >= N_file min T_u / ((1 + tau) B*)`` over the ``(n, g)`` that can
    reach ``(1 - tau) B*`` at all. ``T_u`` is bounded below by the fractional knapsack of the
    gradient bytes under the FLOP budget (a relaxation of the 0/1 choice); the reachable
    mini-batch is bounded above by ``n g T_u^{fp32} max_b b / T_c^{all low}(b)``.
    """
    import numpy as np
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
    tu_lb = search.score_configs(space, target, np.concatenate(
        [ng, np.broadcast_to(p_frac, (len(ng), len(w)))], 1))[0].t_update_s
    tu_32 = search.score_configs(space, target, np.concatenate(
        [ng, np.zeros((len(ng), len(w)))], 1))[0].t_update_s
    gb = np.stack(np.meshgrid(np.arange(1, space.max_gpus_per_node + 1),
                              np.arange(space.min_sub_batch, space.max_sub_batch + 1), indexing="ij"), -1)
    gb = gb.reshape(-1, 2)
    x = np.concatenate([np.ones((len(gb), 1)), gb, np.ones((len(gb), len(w)))], 1)
    tc_low = search.score_configs(space, target, x)[0].t_compute_s
    rate = (gb[:, 1] / tc_low).reshape(space.max_gpus_per_node, -1).max(1)  # samples/s per learner
    reach = ng[:, 0] * ng[:, 1] * tu_32 * rate[ng[:, 1].astype(int) - 1]
    ok = reach >= (1 - target.tolerance) * target.minibatch
    if not ok.any():
        return float("inf")
    return float(space.dataset_size * tu_lb[ok].min() / ((1 + target.tolerance) * target.minibatch))


def benchmark(path: str, repeats: int = 3) -> dict[str, Any]:
    """Gradient search vs grid on the >= 100,000-configuration spaces, and the precision space."""
    import numpy as np

    import jax
    t_start = time.perf_counter()
    out: dict[str, Any] = dict(machine="2-core AMD EPYC (shared), no GPU, jax " + jax.__version__,
                               max_nodes=BENCH_MAX_NODES, repeats=repeats, cases=[], precision=[])
    print(f"{'machine':15s} {'network':9s} {'target':>6s} {'space':>10s} {'gradient search':>18s} "
          f"{'grid optimum':>18s} {'gap':>8s} {'evals grad':>10s} {'evals grid':>10s} "
          f"{'wall grad':>9s} {'wall grid':>9s}")
    for mname in BENCH_MACHINES:
        for nname in BENCH_NETWORKS:
            space = search.make_space(networks.get(nname), machines.get(mname), max_nodes=BENCH_MAX_NODES)
            for t in BENCH_TARGETS:
                target = search.make_target(t)
                g, g_wall = _timed(lambda: search.gradient_search(space, target), repeats)
                r, r_wall = _timed(lambda: search.grid_search(space, target), repeats)
                gap = g.best.epoch_time_s / r.best.epoch_time_s - 1 if g.best and r.best else None
                case = dict(machine=mname, network=nname, target=t, space_size=space.size,
                            gradient=dict(config=_cfg(g.best), epoch_time_s=g.best and g.best.epoch_time_s,
                                          evaluations=g.evaluations, total_evaluations=g.total_evaluations,
                                          wall_s=g_wall, compile_s=g.compile_s),
                            grid=dict(config=_cfg(r.best), epoch_time_s=r.best and r.best.epoch_time_s,
                                      evaluations=r.space_size, wall_s=r_wall, compile_s=r.compile_s,
                                      feasible_count=r.feasible_count),
                            gap=gap)
                out["cases"].append(case)
                print(f"{mname:15s} {nname:9s} {t:6d} {space.size:10,d} {str(_cfg(g.best)):>18s} "
                      f"{str(_cfg(r.best)):>18s} {100 * gap:+7.3f}% {g.total_evaluations:10,d} "
                      f"{r.space_size:10,d} {g_wall:8.2f}s {r_wall:8.2f}s", flush=True)
    gaps = [c["gap"] for c in out["cases"] if c["gap"] is not None]
    out["summary"] = dict(
        cases=len(out["cases"]), within_1_percent=sum(g <= 0.01 for g in gaps),
        exact=sum(g <= 1e-6 for g in gaps), max_gap=max(gaps),
        median_evaluation_ratio=float(np.median([
            c["grid"]["evaluations"] / c["gradient"]["total_evaluations"] for c in out["cases"]])),
        median_wall_ratio=float(np.median([c["grid"]["wall_s"] / c["gradient"]["wall_s"]
                                           for c in out["cases"]])))
    print(json.dumps(out["summary"]))

    # The precision space: 2^rows more configurations; no grid can enumerate it.
    print(f"\n{'network':9s} {'target':>6s} {'space':>9s} {'fp32 grid':>10s} {'greedy+grid':>11s} "
          f"{'random':>9s} {'gradient':>9s} {'lower bd':>9s} {'gap to bd':>9s} {'evals':>8s} {'wall':>7s}")
    machine = machines.get("dgx_h100")
    rng = np.random.default_rng(0)
    for nname in BENCH_NETWORKS:
        net = networks.get(nname)
        base = search.make_space(net, machine, max_nodes=BENCH_MAX_NODES)
        space = search.make_space(net, machine, max_nodes=BENCH_MAX_NODES, max_sub_batch=base.max_sub_batch,
                                  precision=search.Precision())
        p_greedy = _greedy_precision(space)
        for t in PRECISION_TARGETS:
            target = search.make_target(t)
            g, g_wall = _timed(lambda: search.gradient_search(space, target), repeats)
            fp32 = search.grid_search(base, target)
            greedy, greedy_evals = _fixed_precision_grid(space, target, p_greedy)
            k = g.total_evaluations
            xr = np.concatenate([
                np.exp(rng.uniform(0, np.log(space.upper + 1), (k, 3))).astype(int).clip(
                    space.lower, space.upper),
                (rng.random((k, space.num_precision)) < 0.5).astype(int)], 1)
            ep, ok = _chunks(space, target, xr)
            rand = float(ep[ok].min()) if ok.any() else None
            lb = _lower_bound(space, target)
            best = g.best.epoch_time_s if g.best else None
            row = dict(network=nname, target=t, space_size=float(space.size),
                       rows=space.num_precision, fp32_grid=fp32.best and fp32.best.epoch_time_s,
                       fp32_config=_cfg(fp32.best), greedy_grid=greedy and greedy[1],
                       greedy_config=greedy and greedy[0], greedy_evaluations=greedy_evals,
                       random_search=rand, random_evaluations=k,
                       gradient=best, gradient_config=_cfg(g.best),
                       gradient_low_rows=int(sum(g.best.low_precision)) if g.best else None,
                       gradient_low_fraction=g.best.low_fraction if g.best else None,
                       evaluations=g.evaluations, wall_s=g_wall, compile_s=g.compile_s,
                       lower_bound=lb, gap_to_bound=best / lb - 1 if best else None)
            out["precision"].append(row)
            fmt = lambda v: f"{v:9.4g}" if v is not None else f"{'none':>9s}"  # noqa: E731
            print(f"{nname:9s} {t:6d} {space.size:9.2e} {fmt(row['fp32_grid']):>10s} "
                  f"{fmt(row['greedy_grid']):>11s} {fmt(rand)} {fmt(best)} {fmt(lb)} "
                  f"{100 * row['gap_to_bound']:+8.2f}% {k:8,d} {g_wall:6.2f}s", flush=True)
    out["total_wall_s"] = time.perf_counter() - t_start
    if path:
        with open(path, "w") as fh:
            json.dump(out, fh, indent=1)
        print(f"wrote {path} ({out['total_wall_s']:.0f} s)")
    return out


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        print(f"error: unexpected arguments {argv[1:]}; all options are --flags", file=sys.stderr)
        sys.exit(2)
    values = {name: FLAGS[name].value for name in _OUR_FLAGS}
    if values["benchmark"]:
        benchmark(values["benchmark_json"], repeats=values["repeats"])
        return
    try:
        space, target, warnings = resolve(values)
        out = run(space, target, starts=values["starts"], seed=values["seed"], grid=values["grid"],
                  sensitivities=values["sensitivities"])
    except JaxsprintError as e:  # every error of jaxsprint.perf names the field
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if values["plot"]:
        plot(values["plot"], space, target, out)
    if values["json"]:
        out.pop("_result")
        out["warnings"] = warnings
        print(json.dumps(out))
    else:
        print(table(space, target, out, warnings))
        if values["plot"]:
            print(f"wrote {values['plot']}")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
