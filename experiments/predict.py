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
import sys
from typing import Any

from absl import app, flags

from jaxsprint.cli import parse_flags  # noqa: F401  (app.run below; in-process tests)

from jaxsprint.errors import JaxsprintError
from jaxsprint.perf import calibrate, collectives, machines, networks, simulate, sprint

FLAGS = flags.FLAGS
flags.DEFINE_string("machine", None, f"Machine preset: {', '.join(machines.PRESETS)}.")
flags.DEFINE_string("machine_file", None, "A calibrated machine preset (JSON written by "
                    "experiments/calibrate.py) instead of --machine (spec mode).")
flags.DEFINE_string("network", None, f"Network of the zoo: {', '.join(sorted(networks.ZOO))}.")
flags.DEFINE_integer("nodes", 1, "Nodes (spec mode).")
flags.DEFINE_integer("gpus_per_node", None, "Learners per node (spec mode; default: the machine's).")
flags.DEFINE_string("allreduce", "ring", f"Inter-node all-reduce: {', '.join(collectives.ALGORITHMS)}.")
flags.DEFINE_integer("workers", None, "Learners N (timings mode).")
flags.DEFINE_float("t_compute", None, "Mean learner time per sub-batch T_c in seconds (timings mode).")
flags.DEFINE_float("t_update", None, "Updater cycle T_u in seconds (timings mode).")
flags.DEFINE_float("t_compute_cv", 0.0, "Coefficient of variation of the learner time (both modes).")
flags.DEFINE_integer("sub_batch", 32, "Samples per learner step N_Subbatch.")
flags.DEFINE_integer("dataset_size", sprint.IMAGENET_TRAIN_IMAGES, "Samples per epoch N_File.")
flags.DEFINE_bool("json", False, "Print one JSON object instead of the table.")
flags.DEFINE_string("plot", None, "Write a PNG of both pmfs next to the simulator's histograms.")
flags.DEFINE_integer("sim_cycles", 20_000, "Updater cycles simulated for --plot.")
flags.DEFINE_integer("seed", 0, "Simulator seed for --plot.")

JSON_KEYS = ("t_compute_s", "t_update_s", "epoch_time_s", "updates_per_epoch", "mean_minibatch",
             "mean_staleness", "minibatch_pmf", "staleness_pmf")


class PredictError(JaxsprintError):
    """A bad combination of flags (the message names the flags)."""


def _resolve(values: dict[str, Any]) -> dict[str, Any]:
    """Validates the flags; returns the configuration (mode, N, T_c, T_u, cv, ...)."""
    timing_flags = [k for k in ("workers", "t_compute", "t_update") if values[k] is not None]
    spec_flags = [k for k in ("machine", "machine_file", "network") if values[k] is not None]
    if timing_flags and spec_flags:
        raise PredictError(f"--{timing_flags[0]} and --{spec_flags[0]} were both given; allowed: "
                           "either --machine and --network (spec mode) or --workers, --t_compute "
                           "and --t_update (timings mode)")
    cv, b, n_file = values["t_compute_cv"], values["sub_batch"], values["dataset_size"]
    if timing_flags:
        missing = [k for k in ("workers", "t_compute", "t_update") if values[k] is None]
        if missing:
            raise PredictError(f"--{missing[0]} is missing; timings mode needs --workers, "
                               "--t_compute and --t_update")
        sprint.validate_timings(values["workers"], values["t_compute"], values["t_update"], cv, b,
                                n_file)
        return dict(mode="timings", workers=int(values["workers"]), warnings=[],
                    t_compute_s=float(values["t_compute"]), t_update_s=float(values["t_update"]),
                    cv=float(cv), sub_batch=int(b), dataset_size=int(n_file))
    if values["machine"] is not None and values["machine_file"] is not None:
        raise PredictError(f"--machine={values['machine']} and --machine_file={values['machine_file']} "
                           "were both given; allowed: one of them")
    if not spec_flags or len(spec_flags) < 2:
        missing = "network" if values["machine"] or values["machine_file"] else "machine"
        raise PredictError(f"--{missing} is missing; give --machine and --network (spec mode) or "
                           "--workers, --t_compute and --t_update (timings mode)")
    sprint.validate_timings(1, 1.0, 1.0, cv, b, n_file)
    if values["allreduce"] not in collectives.ALGORITHMS:
        raise PredictError(f"allreduce={values['allreduce']!r} is unknown; allowed: "
                           f"{', '.join(collectives.ALGORITHMS)}")
    if values["machine_file"] is not None:
        machine = calibrate.load_preset(values["machine_file"])[0]
    else:
        machine = machines.get(values["machine"])
    net = networks.get(values["network"])
    g = values["gpus_per_node"]
    g = int(float(machine.gpus_per_node)) if g is None else g
    warnings = sprint.validate_config(net, machine, values["nodes"], g, b, n_file)
    p = sprint.predict(net, machine, float(values["nodes"]), float(g), float(b), float(n_file),
                       algorithm=values["allreduce"])
    return dict(mode="specs", workers=int(values["nodes"]) * g, warnings=warnings,
                t_compute_s=float(p.t_compute_s), t_update_s=float(p.t_update_s), cv=float(cv),
                sub_batch=int(b), dataset_size=int(n_file), machine=machine, network=net,
                nodes=int(values["nodes"]), gpus_per_node=g)


def run_prediction(cfg: dict[str, Any]) -> tuple[dict[str, Any], sprint.Distributions]:
    """Model outputs of a resolved configuration: the JSON object and the distributions."""
    n, tc, tu, cv, b = cfg["workers"], cfg["t_compute_s"], cfg["t_update_s"], cfg["cv"], cfg["sub_batch"]
    p = sprint.predict_from_timings(n, tc, tu, b, cfg["dataset_size"])
    d = sprint.distributions(n, tc, tu, cv, **sprint.suggest_windows(n, tc, tu, cv))
    out = {
        "t_compute_s": float(p.t_compute_s),
        "t_update_s": float(p.t_update_s),
        "epoch_time_s": float(p.epoch_time_s),
        "updates_per_epoch": float(p.updates_per_epoch),
        "mean_minibatch": float(p.mean_minibatch),
        "mean_staleness": float(p.mean_staleness),
        "minibatch_pmf": sprint.pmf_items(int(d.count_offset), d.count_pmf, scale=b),
        "staleness_pmf": sprint.pmf_items(int(d.staleness_offset), d.staleness_pmf),
    }
    assert tuple(out) == JSON_KEYS
    return out, d


def _table(cfg: dict[str, Any], out: dict[str, Any], d: sprint.Distributions) -> str:
    lines = []
    if cfg["mode"] == "specs":
        m, net = cfg["machine"], cfg["network"]
        lines.append(f"configuration: {networks.describe(net)}")
        lines.append(f"               on {m.description}")
        lines.append(f"               {cfg['nodes']} nodes x {cfg['gpus_per_node']} learners, "
                     f"sub-batch {cfg['sub_batch']}, all-reduce {FLAGS.allreduce}")
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


def _plot(path: str, cfg: dict[str, Any], d: sprint.Distributions) -> None:
    import matplotlib  # optional dependency (the "plot" extra)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    s = simulate.simulate(cfg["workers"], cfg["t_compute_s"], cfg["t_update_s"], cfg["cv"],
                          n_cycles=FLAGS.sim_cycles, seed=FLAGS.seed)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    b = cfg["sub_batch"]
    panels = ((axes[0], d.count_offset, d.count_pmf, s.count_pmf, b, "mini-batch size"),
              (axes[1], d.staleness_offset, d.staleness_pmf, s.staleness_pmf, 1, "staleness"))
    for ax, off, pmf, emp, scale, label in panels:
        pmf = np.asarray(pmf)
        x = scale * (int(off) + np.arange(pmf.size))
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
        print(f"error: unexpected arguments {argv[1:]}; all options are --flags", file=sys.stderr)
        sys.exit(2)
    values = {name: FLAGS[name].value for name in FLAGS if name in _OUR_FLAGS}
    try:
        cfg = _resolve(values)
        out, d = run_prediction(cfg)
    except JaxsprintError as e:  # every error of jaxsprint.perf names the field
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if FLAGS.plot:
        _plot(FLAGS.plot, cfg, d)
    if FLAGS.json:
        print(json.dumps(out))
    else:
        print(_table(cfg, out, d))
        if FLAGS.plot:
            print(f"wrote {FLAGS.plot}")


_OUR_FLAGS = ("machine", "machine_file", "network", "nodes", "gpus_per_node", "allreduce", "workers", "t_compute",
              "t_update", "t_compute_cv", "sub_batch", "dataset_size", "json", "plot", "sim_cycles",
              "seed")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
