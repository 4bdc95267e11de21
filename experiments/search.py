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

The measurements of ``docs/perf-search.md`` (gradient search against the grid) are
``scripts/bench_search.py``. Bad input exits with status 2 and one message naming the flag.
"""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402

from experiments import common_flags  # noqa: E402,F401 (--machine, --network, ...)
from jaxsprint import cli  # noqa: E402
from jaxsprint.errors import ConfigError, check  # noqa: E402
from jaxsprint.perf import networks, presets, search, sensitivity, zoo  # noqa: E402
from jaxsprint.perf import space as spaces  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_float("target_minibatch", None, "Target mean mini-batch B* in samples.")
flags.DEFINE_float("tolerance", 0.05, "Relative tolerance: |E[B] / B* - 1| <= tolerance.")
flags.DEFINE_float("max_staleness", None, "Largest allowed mean staleness (default: no limit).")
flags.DEFINE_integer("max_nodes", None, "Nodes available (default: the machine's; more is "
                     "a hypothetical machine, with a warning).")
flags.DEFINE_integer("max_gpus_per_node", None, "Learners per node available (default: the machine's).")
flags.DEFINE_integer("max_sub_batch", None, "Largest sub-batch (default: the largest that fits).")
flags.DEFINE_integer("min_sub_batch", 1, "Smallest sub-batch.")
flags.DEFINE_bool("precision", False, "Add a low-precision choice per layer row (2^rows more "
                  "configurations; see jaxsprint.perf.space.Precision).")
flags.DEFINE_float("low_peak_factor", 989.0 / 67.0, "With --precision: low-precision peak over fp32.")
flags.DEFINE_float("max_low_fraction", 0.5, "With --precision: largest share of forward FLOPs in "
                   "low precision.")
flags.DEFINE_integer("starts", 32, "Starting points of the gradient search.")
flags.DEFINE_bool("grid", False, "Also run the exhaustive grid search and compare.")
flags.DEFINE_bool("sensitivities", False, "Print d log(epoch time) / d log(figure) at the result.")


# Starting points of the gradient search at most: each carries its Adam state through one vmapped call.
MAX_STARTS = 4096


def resolve() -> tuple[spaces.Space, spaces.Target, list[str]]:
    """Validates the flags; returns the space, the target and warnings."""
    machine = presets.load_machine(FLAGS.machine, FLAGS.machine_file)
    if not FLAGS.network:
        raise ConfigError("--network", FLAGS.network, f"one of {', '.join(sorted(zoo.ZOO))}")
    net = zoo.get(FLAGS.network)
    if FLAGS.target_minibatch is None:
        raise ConfigError("--target_minibatch", None, "a number >= 1 (samples); the flag is required")
    target = spaces.make_target(FLAGS.target_minibatch, FLAGS.tolerance, FLAGS.max_staleness)
    check(1 <= FLAGS.starts <= MAX_STARTS, "--starts", FLAGS.starts,
          f"an integer in [1, {MAX_STARTS}] (2 x starts problems are solved in one vmapped call)")
    if FLAGS.plot:
        cli.check_output_file("--plot", FLAGS.plot)
    precision = None
    if FLAGS.precision:
        precision = spaces.Precision(low_peak_factor=FLAGS.low_peak_factor, max_low_fraction=FLAGS.max_low_fraction)
    space = spaces.make_space(net, machine, max_nodes=FLAGS.max_nodes, max_gpus_per_node=FLAGS.max_gpus_per_node,
                              max_sub_batch=FLAGS.max_sub_batch, min_sub_batch=FLAGS.min_sub_batch,
                              dataset_size=FLAGS.dataset_size, algorithm=FLAGS.allreduce, precision=precision)
    if FLAGS.grid:
        search.check_grid_size(space)
    warnings = []
    if space.max_nodes > float(machine.max_nodes):
        warnings.append(f"max_nodes={space.max_nodes} exceeds the {int(float(machine.max_nodes))} "
                        f"nodes of {machine.name}: configurations above are for a hypothetical larger machine")
    return space, target, warnings


def run(space: spaces.Space, target: spaces.Target) -> tuple[dict[str, Any], search.SearchResult]:
    """The search (and, as the flags ask, the grid and the sensitivities): a JSON-ready object and the result."""
    res = search.gradient_search(space, target, starts=FLAGS.starts, seed=FLAGS.seed)
    out = res.as_dict()
    if FLAGS.grid:
        g = search.grid_search(space, target)
        out["grid"] = {"best": g.best.as_dict() if g.best else None, "evaluations": g.space_size,
                       "feasible_count": g.feasible_count, "wall_s": g.wall_s, "compile_s": g.compile_s}
        if g.best and res.best:
            out["grid"]["gap"] = res.best.epoch_time_s / g.best.epoch_time_s - 1.0
    if FLAGS.sensitivities:
        c = res.best or res.closest
        out["sensitivities"] = [r._asdict() for r in sensitivity.sensitivities(space, c.nodes, c.gpus_per_node,
                                                                                 c.sub_batch)]
    return out, res


def _row(c: dict[str, Any]) -> str:
    low = f" {c['low_fraction']:9.2f}" if "low_fraction" in c else ""
    return (f"  {c['nodes']:6d} {c['gpus_per_node']:5d} {c['sub_batch']:9d} {c['epoch_time_s']:12.4g}"
            f" {c['mean_minibatch']:12.6g} {c['mean_staleness']:10.4g}{low}")


def table(space: spaces.Space, target: spaces.Target, out: dict[str, Any], warnings: list[str]) -> str:
    """Human-readable report."""
    lo, hi = target.minibatch * (1 - target.tolerance), target.minibatch * (1 + target.tolerance)
    band = f"{target.minibatch:g} +- {100 * target.tolerance:g}% ({lo:.6g}..{hi:.6g})"
    stale = f", mean staleness <= {target.max_staleness:g}" if math.isfinite(target.max_staleness) else ""
    prec = (f", low precision per row ({space.num_precision} rows, at most "
            f"{100 * space.precision.max_low_fraction:g}% of forward FLOPs)" if space.precision else "")
    lines = [f"search: {networks.describe(space.network)}",
             f"        on {space.machine.name}: {space.machine.description}",
             f"        target mean mini-batch {band}{stale}",
             f"        nodes 1..{space.max_nodes}, learners per node 1..{space.max_gpus_per_node}, "
             f"sub-batch {space.min_sub_batch}..{space.max_sub_batch}{prec}: {space.size:.4g} configurations"]
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
                     f"(+ {g['compile_s']:.1f} s compilation), {g['feasible_count']:,} feasible; {res}{gap}")
    if "sensitivities" in out:
        rows = [sensitivity.Sensitivity(**r) for r in out["sensitivities"]]
        lines += ["sensitivities of the epoch time at this configuration "
                  "(elasticities; 'mini-batch kept': nodes move to keep the mean mini-batch):",
                  sensitivity.sensitivity_table(rows)]
    lines += [f"warning: {w}" for w in warnings]
    return "\n".join(lines)


def plot(path: str, space: spaces.Space, target: spaces.Target, out: dict[str, Any],
         res: search.SearchResult, samples: int = 20_000, seed: int = 0) -> None:
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
    stats, _, _, _ = spaces.score_configs(space, target, x)
    mb, ep = stats.mean_minibatch, stats.epoch_time_s
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    lo, hi = target.minibatch * (1 - target.tolerance), target.minibatch * (1 + target.tolerance)
    traj = res.trajectory
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


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise ConfigError("arguments", argv[1:], "none besides --flags")
    space, target, warnings = resolve()
    out, res = run(space, target)
    if FLAGS.plot:
        plot(FLAGS.plot, space, target, out, res)
    if FLAGS.json:
        print(json.dumps({**out, "warnings": warnings}))
        return
    print(table(space, target, out, warnings))
    if FLAGS.plot:
        print(f"wrote {FLAGS.plot}")


if __name__ == "__main__":
    cli.run(main)
