r"""Predict SPRINT's epoch time, mini-batch and staleness distributions for one configuration.

From specs (network costs x machine preset):

    .venv/bin/python experiments/predict.py --machine=tsubame_kfc_dl --network=resnet50 \
        --nodes=16 --gpus_per_node=8 --sub_batch=32

With a preset calibrated on this machine (``experiments/calibrate.py``), ``--machine_file=PATH``
replaces ``--machine``.

From measured timings:

    .venv/bin/python experiments/predict.py --workers=64 --sub_batch=32 --t_compute=0.1 \
        --t_compute_cv=0.05 --t_update=0.037

``--json`` prints one JSON object with exactly the keys :data:`JSON_KEYS`; ``--plot=FILE.png``
draws both pmfs next to the simulator's histograms. Bad input exits with status 2 and one message
naming the flag. Takes a few seconds on a laptop (``--plot`` adds the simulation).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402

from experiments import common_flags  # noqa: E402,F401 (--machine, --network, ...)
from jaxsprint import cli  # noqa: E402
from jaxsprint.errors import ConfigError, check  # noqa: E402
from jaxsprint.perf import collectives, networks, presets, simulate, sprint, zoo  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("nodes", 1, "Nodes (spec mode).")
flags.DEFINE_integer("gpus_per_node", None, "Learners per node (spec mode; default: the machine's).")
flags.DEFINE_integer("workers", None, "Learners N (timings mode).")
flags.DEFINE_float("t_compute", None, "Mean learner time per sub-batch T_c in seconds (timings mode).")
flags.DEFINE_float("t_update", None, "Updater cycle T_u in seconds (timings mode).")
flags.DEFINE_float("t_compute_cv", 0.0, "Coefficient of variation of the learner time (both modes).")
flags.DEFINE_float("t_update_cv", 0.0, "Coefficient of variation of the updater cycle (both modes; 0 = fixed).")
flags.DEFINE_float("t_update_shift", 0.0, "Fixed part of the updater cycle in seconds, in [0, T_u): the cycle is "
                   "this plus a gamma tail (both modes; 0 = a gamma cycle).")
flags.DEFINE_integer("sub_batch", 32, "Samples per learner step N_Subbatch.")
flags.DEFINE_integer("sim_cycles", 20_000, "Updater cycles simulated for --plot.")

JSON_KEYS = ("t_compute_s", "t_update_s", "epoch_time_s", "updates_per_epoch", "mean_minibatch",
             "mean_staleness", "minibatch_pmf", "staleness_pmf")
_TIMINGS = ("workers", "t_compute", "t_update")
_SPECS = ("machine", "machine_file", "network")


# Updater cycles the --plot simulation may run: its event arrays grow with the cycles (10^7 is ~2 minutes).
MAX_SIM_CYCLES = 10_000_000


def check_plot_flags() -> None:
    """--plot, --sim_cycles and --seed, before the model or the simulator runs."""
    if not FLAGS.plot:
        return
    cli.check_output_file("--plot", FLAGS.plot)
    check(1 <= FLAGS.sim_cycles <= MAX_SIM_CYCLES, "--sim_cycles", FLAGS.sim_cycles,
          f"an integer in [1, {MAX_SIM_CYCLES:,}] (updater cycles simulated for --plot)")
    check(0 <= FLAGS.seed < 2**32, "--seed", FLAGS.seed, "an integer in [0, 2^32)")


def resolve() -> dict[str, Any]:
    """Validates the flags; returns the configuration (mode, N, T_c, T_u, cv, ...)."""
    check_plot_flags()
    given = lambda names: [k for k in names if FLAGS[k].value is not None]  # noqa: E731
    timing_flags, spec_flags = given(_TIMINGS), given(_SPECS)
    cv, b, n_file = FLAGS.t_compute_cv, FLAGS.sub_batch, FLAGS.dataset_size
    ucv, shift = FLAGS.t_update_cv, FLAGS.t_update_shift
    jitter = dict(update_cv=ucv, update_shift_s=shift)
    if timing_flags and spec_flags:
        raise ConfigError(f"--{spec_flags[0]}", FLAGS[spec_flags[0]].value,
                          f"not given with --{timing_flags[0]}: either --machine and --network (spec mode) or "
                          "--workers, --t_compute and --t_update (timings mode)")
    if timing_flags:
        for k in _TIMINGS:
            if FLAGS[k].value is None:
                raise ConfigError(f"--{k}", None, "required in timings mode (--workers, --t_compute, --t_update)")
        sprint.validate_timings(FLAGS.workers, FLAGS.t_compute, FLAGS.t_update, cv, b, n_file, **jitter)
        return dict(mode="timings", workers=FLAGS.workers, warnings=[], t_compute_s=FLAGS.t_compute,
                    t_update_s=FLAGS.t_update, cv=cv, sub_batch=b, dataset_size=n_file, **jitter)
    sprint.validate_timings(1, 1.0, 1.0, cv, b, n_file, update_cv=ucv)
    sprint.finite_number("t_update_shift", shift, allow_minimum=True)  # below T_u: checked once T_u is known
    machine = presets.load_machine(FLAGS.machine, FLAGS.machine_file)
    if FLAGS.network is None:
        raise ConfigError("--network", None, f"required in spec mode: one of {', '.join(sorted(zoo.ZOO))}")
    if FLAGS.allreduce not in collectives.ALGORITHMS:
        raise ConfigError("--allreduce", FLAGS.allreduce, f"one of {', '.join(collectives.ALGORITHMS)}")
    net = zoo.get(FLAGS.network)
    g = int(float(machine.gpus_per_node)) if FLAGS.gpus_per_node is None else FLAGS.gpus_per_node
    warnings = sprint.validate_config(net, machine, FLAGS.nodes, g, b, n_file)
    p = sprint.predict(net, machine, float(FLAGS.nodes), float(g), float(b), float(n_file),
                       algorithm=FLAGS.allreduce)
    sprint.validate_timings(FLAGS.nodes * g, float(p.t_compute_s), float(p.t_update_s), cv, b, n_file, **jitter)
    return dict(mode="specs", workers=FLAGS.nodes * g, warnings=warnings, t_compute_s=float(p.t_compute_s),
                t_update_s=float(p.t_update_s), cv=cv, sub_batch=b, dataset_size=n_file, machine=machine,
                network=net, nodes=FLAGS.nodes, gpus_per_node=g, **jitter)


def prediction(cfg: dict[str, Any]) -> tuple[dict[str, Any], sprint.Distributions]:
    """Model outputs of a resolved configuration: the JSON object and the distributions."""
    n, tc, tu, cv, b = cfg["workers"], cfg["t_compute_s"], cfg["t_update_s"], cfg["cv"], cfg["sub_batch"]
    p = sprint.predict_from_timings(n, tc, tu, b, cfg["dataset_size"])
    u = (cfg.get("update_cv", 0.0), cfg.get("update_shift_s", 0.0))
    d = sprint.distributions(n, tc, tu, cv, *u, **sprint.suggest_windows(n, tc, tu, cv, *u))
    out = {k: float(getattr(p, k)) for k in JSON_KEYS[:6]}
    out["minibatch_pmf"] = sprint.pmf_items(int(d.count_offset), d.count_pmf, scale=b, stride=int(d.count_stride))
    out["staleness_pmf"] = sprint.pmf_items(int(d.staleness_offset), d.staleness_pmf, stride=int(d.staleness_stride))
    return out, d


def table(cfg: dict[str, Any], out: dict[str, Any], d: sprint.Distributions) -> str:
    """Human-readable report."""
    lines = []
    if cfg["mode"] == "specs":
        lines += [f"configuration: {networks.describe(cfg['network'])}",
                  f"               on {cfg['machine'].description}",
                  f"               {cfg['nodes']} nodes x {cfg['gpus_per_node']} learners, "
                  f"sub-batch {cfg['sub_batch']}, all-reduce {FLAGS.allreduce}"]
    else:
        lines.append(f"configuration: {cfg['workers']} learners, sub-batch {cfg['sub_batch']}")
    lines.append(f"               compute-time cv {cfg['cv']:g}, dataset {cfg['dataset_size']:,} samples")
    sd_b = cfg["sub_batch"] * float(d.var_count) ** 0.5
    rows = [
        ("T_c (learner time per sub-batch)", f"{out['t_compute_s']:.4g} s"),
        ("T_u (updater cycle)", f"{out['t_update_s']:.4g} s"),
        ("epoch time", f"{out['epoch_time_s']:.4g} s"),
        ("updates per epoch", f"{out['updates_per_epoch']:.5g}"),
        ("mean mini-batch (sd)", f"{out['mean_minibatch']:.5g} ({sd_b:.3g})"),
        ("mean staleness (sd)", f"{out['mean_staleness']:.4g} ({float(d.var_staleness) ** 0.5:.3g})"),
    ]
    lines += [f"  {k:34s} {v}" for k, v in rows]
    for title, pmf in (("mini-batch pmf", out["minibatch_pmf"]), ("staleness pmf", out["staleness_pmf"])):
        top = sorted(pmf.items(), key=lambda kv: -kv[1])[:8]
        lines.append(f"  {title} (most likely values): "
                     + ", ".join(f"{k}: {v:.3f}" for k, v in sorted(top, key=lambda kv: int(kv[0]))))
    lines += [f"warning: {w}" for w in cfg["warnings"]]
    return "\n".join(lines)


def plot(path: str, cfg: dict[str, Any], d: sprint.Distributions) -> None:
    """Both pmfs of the model next to the simulator's histograms."""
    import matplotlib  # optional dependency (the "plot" extra)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    s = simulate.simulate(cfg["workers"], cfg["t_compute_s"], cfg["t_update_s"], cfg["cv"],
                          n_cycles=FLAGS.sim_cycles, seed=FLAGS.seed, update_cv=cfg.get("update_cv", 0.0),
                          update_shift_s=cfg.get("update_shift_s", 0.0))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    b = cfg["sub_batch"]
    panels = ((axes[0], d.count_offset, d.count_stride, d.count_pmf, s.count_pmf, b, "mini-batch size"),
              (axes[1], d.staleness_offset, d.staleness_stride, d.staleness_pmf, s.staleness_pmf, 1, "staleness"))
    for ax, off, stride, pmf, emp, scale, label in panels:
        pmf = np.asarray(pmf)
        x = scale * (int(off) + int(stride) * np.arange(pmf.size))
        keep = pmf > 1e-5
        xe = scale * np.arange(emp.size)
        ax.bar(xe[emp > 0], emp[emp > 0], width=0.8 * scale, alpha=0.5, label="simulator")
        ax.plot(x[keep], pmf[keep], "k.-", ms=3, lw=0.8, label="model")
        ax.set_xlabel(label)
        ax.set_ylabel("probability")
        ax.legend()
    fig.suptitle(f"N={cfg['workers']}, T_c={cfg['t_compute_s']:.3g} s, T_u={cfg['t_update_s']:.3g} s, "
                 f"cv={cfg['cv']:g} ({s.n_cycles} simulated cycles)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise ConfigError("arguments", argv[1:], "none besides --flags")
    cfg = resolve()
    out, d = prediction(cfg)
    if FLAGS.plot:
        plot(FLAGS.plot, cfg, d)
    if FLAGS.json:
        print(json.dumps(out))
        return
    print(table(cfg, out, d))
    if FLAGS.plot:
        print(f"wrote {FLAGS.plot}")


if __name__ == "__main__":
    cli.run(main)
