r"""Choose the cluster configuration that reaches a target accuracy soonest (time to accuracy, not epoch time).

    .venv/bin/python experiments/plan.py --config=experiments/configs/plan.py \
        --config.machine=tsubame_kfc_dl --config.network=resnet50 --config.target_accuracy=0.95 \
        [--workdir=/tmp/plan] [--json] [--plot=plan.png]          # a few minutes on 2 cores

The config file (``experiments/configs/plan.py``, the default of ``--config``) holds every setting of the
experiment; ``--config.<field>=...`` overrides one. The launcher's own flags are outputs only.

1. Candidates: SPRINT's rule (the gradient search) over a ladder of mean mini-batch targets
   (``minibatch_range``, ``ladder``) and mean-staleness limits (``staleness_limits``).
2. Each candidate's predicted staleness and mini-batch pmfs drive an emulated run of a proxy network
   (``model``: mlp or cnn at 8x8) on ``data``, ``seeds`` seeds, the learning rate from ``lr_rule``; runs are
   cached in ``cache_dir`` keyed by the candidate's statistics. At most ``budget_runs`` runs: a
   space-filling first design, then runs where the fitted law is least certain.
3. The law ``U(mean mini-batch, mean staleness)`` (McCandlish et al. 2018 with a staleness factor) is fitted
   with its uncertainty; ``U * T_u`` is minimised over (nodes, learners per node, sub-batch).
4. A table of the candidates, the chosen configuration and the one SPRINT's rule picks for the same mean
   mini-batch. ``--json``: one object; ``--plot``: epoch time against time to accuracy; ``--workdir``: the
   report (plan.json) and the resolved config (config.json) are written there.

``holdout=N`` then measures the law's error on N cells of a shifted ladder that were not fitted; with
``runtime_configs`` the law is compared with the SPRINT runtime instead (its runs go into ``--workdir``).
Bad input exits with status 2 and one line naming the field, before anything is written.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402

from experiments import common_flags  # noqa: E402
from jaxsprint import cli  # noqa: E402
from jaxsprint.errors import ConfigError, check, is_int, is_real  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
_CONFIG = cli.define_config_file("config", os.path.join(_HERE, "configs", "plan.py"),
                                 "The plan's ml_collections config (experiments/configs/plan.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where config.json and plan.json are written (optional for a "
                               "plan); with config.runtime_configs, also where the runtime writes its runs.")
_JSON, _PLOT = common_flags.JSON, common_flags.PLOT  # --plot: epoch time against predicted time to accuracy
_PLOT_EXTENSIONS = (".png", ".pdf", ".svg")
MAX_LADDER = 100  # mini-batch targets, and staleness limits: their product is the number of candidates
MAX_RUNTIME_SEEDS = 100  # each is a whole runtime run per configuration


def _check_outputs(workdir_required: bool = False) -> None:
    """--workdir, --plot and config.cache_dir can be written (nothing is created)."""
    config = _CONFIG.value
    check(bool(_WORKDIR.value) or not workdir_required, "--workdir", _WORKDIR.value,
          "a directory for the runtime's runs")
    if _WORKDIR.value:
        cli.check_output_dir("--workdir", _WORKDIR.value)
    if _PLOT.value:
        check(os.path.splitext(_PLOT.value)[1].lower() in _PLOT_EXTENSIONS, "--plot", _PLOT.value,
              f"a file name ending in {', '.join(_PLOT_EXTENSIONS)}")
        cli.check_output_file("--plot", _PLOT.value)
    if config.cache_dir:
        cli.check_output_dir("config.cache_dir", config.cache_dir)


def resolve(config) -> dict[str, Any]:
    """Checks every field (nothing is read or written before); then loads the machine, network and data."""
    from jaxsprint.plan import emulator, planner
    from jaxsprint.perf import presets, zoo
    from jaxsprint.perf import space as spaces

    if config.target_accuracy is None:
        raise ConfigError("config.target_accuracy", None, "a fraction in (0, 1]; the field is required")
    planner.check_target_accuracy(config.target_accuracy)
    from jaxsprint.train import models

    check(config.model in emulator.PROXY_MODELS + tuple(models.MODELS), "config.model", config.model,
          f"one of {', '.join(emulator.PROXY_MODELS)} (proxy networks) or of the zoo: {', '.join(models.MODELS)}")
    from jaxsprint.train import data as data_lib
    check(config.data in data_lib.BUILTIN or bool(config.data_dir), "config.data", config.data,
          f"one of {', '.join(data_lib.BUILTIN)}, or a TFDS dataset name with config.data_dir")
    limits = cli.float_list("config.staleness_limits", config.staleness_limits)
    check(bool(limits) and all(v > 1 for v in limits), "config.staleness_limits", config.staleness_limits,
          "numbers > 1 or inf (the protocol's mean staleness always exceeds 1)")
    check(len(limits) <= MAX_LADDER, "config.staleness_limits", config.staleness_limits,
          f"at most {MAX_LADDER} limits (each limit x each ladder step is a candidate, one gradient search)")
    mb_range = (None if config.minibatch_range is None
                else cli.float_list("config.minibatch_range", config.minibatch_range))
    check(mb_range is None or (len(mb_range) == 2 and all(math.isfinite(v) and v > 0 for v in mb_range)
                               and mb_range[0] < mb_range[1]), "config.minibatch_range", config.minibatch_range,
          "two finite numbers 0 < lo < hi (cluster samples)")
    check(is_int(config.ladder) and 1 <= config.ladder <= MAX_LADDER, "config.ladder", config.ladder,
          f"an integer in [1, {MAX_LADDER}] (mini-batch targets)")
    for name in ("max_nodes", "max_gpus_per_node", "max_sub_batch", "dataset_size"):
        check(config[name] is None or (is_int(config[name]) and config[name] >= 1), f"config.{name}", config[name],
              "None or an integer >= 1")
    check(is_int(config.holdout) and 0 <= config.holdout <= planner.MAX_RUNS, "config.holdout", config.holdout,
          f"an integer in [0, {planner.MAX_RUNS}] (held-out cells, one emulated run each)")
    if config.max_staleness is not None:
        check(math.isfinite(config.max_staleness) and config.max_staleness > 1, "config.max_staleness",
              config.max_staleness, "a finite number > 1")
    planner.settings_from_config(config, minibatch_scale=config.minibatch_scale or 1.0)  # checked before any read
    # The lists as read (comma-separated text split), so that config.json says what was used.
    config.staleness_limits = tuple(limits)
    if mb_range is not None:
        config.minibatch_range = tuple(mb_range)
    _check_outputs()
    with cli.as_config_fields():
        machine = presets.load_machine(config.machine, config.machine_file)
        if not config.network:
            raise ConfigError("network", config.network, f"one of {', '.join(sorted(zoo.ZOO))}")
        net = zoo.get(config.network)
    if config.model in emulator.PROXY_MODELS and not config.train_config:
        data = emulator.load_proxy_data(config.data, data_dir=config.data_dir)
        em = emulator.Emulator(data, config.model, seeds=config.seeds, max_updates=config.max_updates,
                               eval_every=config.eval_every, momentum=config.momentum, width=config.width)
        num_train = data.num_train
    else:
        em = network_emulator(config)
        num_train = em.num_train
    dataset_size = config.dataset_size or num_train
    scale = config.minibatch_scale if config.minibatch_scale is not None else dataset_size / num_train
    settings = planner.settings_from_config(config, minibatch_scale=scale)
    with cli.as_config_fields():
        space = spaces.make_space(net, machine, max_nodes=config.max_nodes,
                                  max_gpus_per_node=config.max_gpus_per_node, max_sub_batch=config.max_sub_batch,
                                  dataset_size=dataset_size)
    lo, hi = mb_range if mb_range is not None else (8.0 * scale, 256.0 * scale)
    from jaxsprint.plan import law as plan_lib
    ladder = plan_lib.minibatch_ladder(lo, hi, config.ladder)
    return dict(space=space, emulator=em, opts=settings, ladder=ladder, limits=limits, scale=scale,
                cache=emulator.RunCache(config.cache_dir or None))


def training_base(config):
    """The training config the network's runs start from: ``config.train_config``'s (its model, data, image
    size, BN, augmentation), or the default one with the plan's model and data, no augmentation, label
    smoothing or weight decay (as the proxies train); momentum SGD at the plan's ``config.momentum`` either way.

    Raises:
      ConfigError: a train_config that cannot be loaded, or a plan field that contradicts it.
    """
    from experiments.configs import default
    from jaxsprint.train import data as data_lib

    if config.train_config:
        c = cli.load_config_file("config.train_config", config.train_config)
        defaults = {"model": "mlp", "data": "digits", "image_size": None, "data_dir": None}
        theirs = {"model": c.model, "data": c.dataset, "image_size": c.image_size, "data_dir": c.data_dir}
        for field, default_value in defaults.items():
            check(config[field] in (default_value, theirs[field]), f"config.{field}", config[field],
                  f"left out with config.train_config, which sets it ({theirs[field]!r})")
    else:
        c = default.get_config()
        c.model, c.dataset, c.data_dir = config.model, config.data, config.data_dir
        c.image_size = config.image_size or (8 if config.data == data_lib.DIGITS else 28)
        c.optimizer.weight_decay, c.augment.kind, c.label_smoothing = 0.0, "none", 0.0
    c.optimizer.name, c.optimizer.momentum = "sgd", config.momentum
    return c


def network_emulator(config):
    """The emulator that trains the network itself (jaxsprint.plan.network) from `training_base`."""
    from jaxsprint.plan import network
    from jaxsprint.train import data as data_lib
    from jaxsprint.train import settings as train_settings

    c = training_base(config)
    try:
        data_lib.validate_config(c)
    except ConfigError as e:
        raise ConfigError("config.image_size" if "image_size" in e.field else e.field, e.value, e.allowed) from None
    em = network.NetworkEmulator(c, seeds=config.seeds, max_updates=config.max_updates,
                                 eval_every=config.eval_every, target_accuracy=config.target_accuracy)
    train_settings.check_memory(c)
    return em


def _fmt(v, spec=".4g", none="-"):
    return none if v is None else format(v, spec)


def table(report: dict[str, Any], setup: dict[str, Any]) -> str:
    """Human-readable report."""
    space, em = setup["space"], setup["emulator"]
    opts = setup["opts"]
    noise = ("fitted" if opts.b_noise is None else
             f"measured: {opts.b_noise:.4g} +- {opts.b_noise_se:.2g} of its samples")
    lines = [f"plan: {space.network.name} on {space.machine.name}; target test accuracy "
             f"{report['target_accuracy']:g} of {em.describe()}, lr rule {opts.lr_rule}, {em.seeds} seeds, "
             f"{em.max_updates} updates per run; 1 emulated sample = {setup['scale']:.4g} cluster samples; "
             f"B_noise {noise}",
             f"runs: {report['runs']['used']} used ({report['runs']['trained']} trained, "
             f"{report['runs']['cached']} from the cache); {report['seconds']['total']:.0f} s in all"]
    head = (f"  {'':12s} {'nodes':>5s} {'gpus':>4s} {'sub':>5s} {'epoch s':>9s} {'mini-batch':>10s} {'stale':>6s}"
            f" {'emul. U':>8s} {'pred. U [band]':>22s} {'time to acc. s':>15s}")

    def u(v):  # beyond 1000 runs' length the law says "never" in practice
        return "-" if v is None else (f">{100 * em.max_updates:.0e}" if v > 100 * em.max_updates else f"{v:.0f}")

    def row(r):
        band = (f"{u(r.get('predicted_updates'))} [{u(r.get('predicted_updates_low'))}-"
                f"{u(r.get('predicted_updates_high'))}]") if "predicted_updates" in r else "-"
        em_u = r.get("emulated_updates")
        em_s = "-" if "emulated_best_accuracy" not in r else ("never" if em_u is None else f"{em_u:.0f}")
        return (f"  {r['role']:12s} {r['nodes']:5d} {r['gpus_per_node']:4d} {r['sub_batch']:5d} "
                f"{r['epoch_time_s']:9.4g} {r['mean_minibatch']:10.5g} {r['mean_staleness']:6.3g} {em_s:>8s} "
                f"{band:>22s} {_fmt(r.get('predicted_time_to_accuracy_s'), '15.4g'):>15s}")

    lines += ["candidates (SPRINT's rule over the ladder):", head] + [row(r) for r in report["candidates"]]
    if not report["reached"]:
        b = report["best_reached"]
        lines.append(f"no emulated run reached {report['target_accuracy']:g} within {em.max_updates} updates; the "
                     f"best reached {b['accuracy']:.4f} at {b['nodes']} x {b['gpus_per_node']} x {b['sub_batch']} "
                     "(try a lower config.target_accuracy, more config.max_updates, another config.lr_rule)")
        return "\n".join(lines)
    f = report["fit"]
    lines.append(f"law: U = {f['s_min']:.4g} (1 + {f['b_noise']:.4g} / B) exp(a tau^p (B/{f['b_ref']:.4g})^delta), "
                 f"a = {math.exp(f['params']['log_a']):.3g}, p = {math.exp(f['params']['log_p']):.3g}, "
                 f"delta = {f['params']['delta']:.3g}; {f['num_observed']} cells reached, {f['num_censored']} "
                 f"censored; residual sd of log U {f['residual_sd']:.3f}; choice held to mini-batch "
                 f"{f['minibatch_range'][0]:.4g}-{f['minibatch_range'][1]:.4g} and staleness <= "
                 f"{f['max_staleness']:.3g} (the stalest cell that reached the target; beyond: extrapolated)")
    lines += ["choice (minimum predicted time to accuracy) and SPRINT's rule for the same mean mini-batch:", head,
              row(report["chosen"])]
    if report.get("sprint_rule"):
        lines += [row(report["sprint_rule"]),
                  f"predicted speed-up over SPRINT's rule: {report['speedup_over_sprint_rule']:.3g}x"]
    if "holdout" in report:
        h = report["holdout"]
        lines.append(f"held-out cells: {h['reached']} reached, median |U_pred / U_emulated - 1| = "
                     f"{_fmt(h['median_abs_error'], '.3f')}; {h['censored']} not reached "
                     f"({h['censored_predicted_ok']} predicted beyond the run)")
    return "\n".join(lines)


def plot(path: str, report: dict[str, Any]) -> None:
    """Epoch time against predicted time to accuracy (candidates, choice, SPRINT's rule)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    rows = [r for r in report["candidates"] if "predicted_time_to_accuracy_s" in r]
    sc = ax.scatter([r["epoch_time_s"] for r in rows], [r["predicted_time_to_accuracy_s"] for r in rows],
                    c=[r["mean_staleness"] for r in rows], cmap="viridis", label="candidates")
    for r in rows:
        lo, hi = r["predicted_time_low_s"], r["predicted_time_high_s"]
        ax.plot([r["epoch_time_s"]] * 2, [lo, hi], "-", color="0.7", lw=1)
    fig.colorbar(sc, label="mean staleness")
    for key, marker, color in (("chosen", "*", "tab:red"), ("sprint_rule", "s", "k")):
        r = report.get(key)
        if r:
            ax.plot(r["epoch_time_s"], r["predicted_time_to_accuracy_s"], marker, ms=13, mfc="none", color=color,
                    label=f"{r['role']}: {r['nodes']} x {r['gpus_per_node']} x {r['sub_batch']}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("epoch time (s)")
    ax.set_ylabel(f"predicted time to {report['target_accuracy']:g} accuracy (s)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def validate_runtime(config) -> dict[str, Any]:
    """config.runtime_configs: measured time to accuracy on the SPRINT runtime beside the law's prediction."""
    from experiments.configs import sprint as sprint_config
    from jaxsprint.plan import emulator, planner, validation

    if config.target_accuracy is None:
        raise ConfigError("config.target_accuracy", None, "a fraction in (0, 1]; the field is required")
    target = planner.check_target_accuracy(config.target_accuracy)
    configs = validation.parse_configs(cli.text_list("config.runtime_configs", config.runtime_configs))
    _check_outputs(workdir_required=True)
    check(is_int(config.runtime_updates) and config.runtime_updates >= 1, "config.runtime_updates",
          config.runtime_updates, "an integer >= 1 (published versions of each runtime run)")
    check(is_int(config.runtime_seeds) and 1 <= config.runtime_seeds <= MAX_RUNTIME_SEEDS, "config.runtime_seeds",
          config.runtime_seeds, f"an integer in [1, {MAX_RUNTIME_SEEDS}] (runtime runs per configuration)")
    check(is_real(config.momentum) and 0 <= config.momentum < 1, "config.momentum", config.momentum,
          "a number in [0, 1)")
    base = sprint_config.get_config()
    with base.unlocked():  # config.momentum is the runtime's too, so that both sides train the same optimizer
        base.optimizer.momentum = float(config.momentum)
    run_settings = dict(num_updates=config.runtime_updates, eval_every_updates=config.eval_every,
                        learning_rate=config.base_lr)
    if config.train_config or config.model not in emulator.PROXY_MODELS:  # the network itself, both sides
        em = network_emulator(config)
        run_settings["training"] = em.base
    else:
        data = emulator.load_proxy_data("digits")
        em = emulator.Emulator(data, "tiny_nobn", seeds=config.seeds, max_updates=config.max_updates,
                               eval_every=config.eval_every, momentum=float(base.optimizer.momentum),
                               weight_decay=float(base.optimizer.weight_decay))
    import jax

    validation.check_runtime_configs(base, configs, len(jax.local_devices()), **run_settings)
    cache = emulator.RunCache(config.cache_dir or None)
    cli.write_config(_WORKDIR.value, config)
    measured, cells = [], []
    for n, b, t in configs:
        seeds = []
        for seed in range(config.runtime_seeds):
            cfg = validation.runtime_config(base, learners=n, sub_batch=b, network_time_s=t, seed=seed,
                                            **run_settings)
            name = f"n{n}_b{b}_t{t:g}" + (f"_s{seed}" if seed else "")
            seeds.append(validation.measure(cfg, os.path.join(_WORKDIR.value, name), target,
                                            reuse=config.runtime_reuse))
        m = validation.pool(seeds)
        # Each emulated run at its own bucket (its result does not depend on it): carrying the largest one
        # over, as the planner does to share one compilation, made every later run several times slower.
        spec = validation.emulated_spec(m, config.base_lr)
        measured.append(m)
        cells.append(cache.run(em, spec))
        if not _JSON.value:
            print(f"  {n} learners, sub-batch {b}, network {t:g} s: staleness {m['mean_staleness']:.3g}, mini-batch "
                  f"{m['mean_minibatch']:.4g}, measured U {m['updates_to_target']}, time {m['time_to_accuracy_s']}",
                  flush=True)
    return validation.compare(measured, cells, target, em.max_updates)


def runtime_table(out: dict[str, Any], target: float) -> str:
    """Human-readable runtime comparison (``validation.compare``'s rows and summary)."""
    pct = lambda v: "-" if v is None else f"{100 * v:+.1f}%"  # noqa: E731
    size = lambda v: "-" if v is None else f"{100 * abs(v):.1f}%"  # noqa: E731
    lines = [f"   {'configuration':13s} {'stale':>6s} {'mini-b.':>8s} {'T_u ms':>7s} {'U runtime [seeds]':>26s} "
             f"{'emul.':>6s} {'law':>6s} {'t meas. s':>9s} {'t pred. s':>9s} {'error':>7s} {'loo':>7s}"]
    for i, r in enumerate(out["rows"]):
        seeds = ", ".join(_fmt(p["updates_to_target"], ".0f") for p in r.get("per_seed", []))
        mark = ("*" if i == out["choice"] else "") + ("!" if i == out["measured_fastest"] else "")
        lines.append(
            f"{mark:>2s} {str(r['learners']) + ':' + str(r['sub_batch']) + ':' + format(r['network_time_s'], 'g'):13s} "
            f"{r['mean_staleness']:6.3g} "
            f"{r['mean_minibatch']:8.4g} {1e3 * r['t_update_s']:7.3g} "
            f"{_fmt(r['updates_to_target'], '.0f') + ' [' + seeds + ']':>26s} {_fmt(r['emulated_updates'], '.0f'):>6s} "
            f"{_fmt(r.get('predicted_updates'), '.0f'):>6s} {_fmt(r['time_to_accuracy_s'], '.3g'):>9s} "
            f"{_fmt(r.get('predicted_time_to_accuracy_s'), '.3g'):>9s} {pct(r.get('relative_error')):>7s} "
            f"{pct(r.get('relative_error_loo')) + (' x' if r.get('extrapolated_loo') else ''):>7s}")
    lines += [f"updates to {target:g} (U) and time to it (t); * the choice (held to the staleness of the cells "
              "that reached the target), ! the measured fastest, x a leave-one-out prediction beyond that staleness",
              f"median |error|: {size(out['median_abs_error'])} (leave one out {size(out['median_abs_error_loo'])}); "
              f"the choice is {size(out['choice_slower_than_fastest_by'])} slower than the measured fastest; the "
              f"emulator's updates against the runtime's: median |error| {size(out['emulator_median_abs_error'])}"]
    return "\n".join(lines)


def plot_runtime(path: str, out: dict[str, Any], target: float) -> None:
    """The runtime comparison: updates to the target against the mean staleness (runtime seeds, emulator,
    law), and the measured time to accuracy against the predicted one."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = out["rows"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.5))
    reached = False  # log axes need data: a short comparison may reach the target nowhere
    for r in rows:
        seeds = [p["updates_to_target"] for p in r.get("per_seed", []) if p["updates_to_target"]]
        ax.plot([r["mean_staleness"]] * len(seeds), seeds, ".", color="0.6")
        reached |= bool(seeds)
    for key, marker, label in (("updates_to_target", "o", "runtime (median of seeds)"),
                               ("emulated_updates", "x", "emulator (runtime's pmfs)"),
                               ("predicted_updates", "_", "law (all cells)")):
        pts = [(r["mean_staleness"], r[key]) for r in rows if r.get(key)]
        if pts:
            ax.plot(*zip(*pts), marker, ms=9, ls="none", label=label)
            reached = True
    ax.set(xlabel="mean staleness (versions)", ylabel=f"updates to {target:g}")
    both = [r for r in rows if r["time_to_accuracy_s"] and r.get("predicted_time_to_accuracy_s")]
    meas = np.array([r["time_to_accuracy_s"] for r in both])
    pred = np.array([r["predicted_time_to_accuracy_s"] for r in both])
    bx.scatter(meas, pred, c=[r["mean_staleness"] for r in both], cmap="viridis")
    for r in both:
        bx.annotate(f"{r['learners']}:{r['sub_batch']}:{r['network_time_s']:g}",
                    (r["time_to_accuracy_s"], r["predicted_time_to_accuracy_s"]), fontsize=7)
    for k, (key, marker) in enumerate((("choice", "*"), ("measured_fastest", "s"))):
        r = rows[out[key]]
        if r["time_to_accuracy_s"] and r.get("predicted_time_to_accuracy_s"):
            bx.plot(r["time_to_accuracy_s"], r["predicted_time_to_accuracy_s"], marker, ms=15, mfc="none",
                    color=("tab:red", "k")[k], label=key.replace("_", " "))
    if both:
        lim = np.array([min(meas.min(), pred.min()) * 0.8, max(meas.max(), pred.max()) * 1.2])
        for f, ls in ((1.0, "-"), (1.2, ":"), (1 / 1.2, ":")):
            bx.plot(lim, lim * f, ls, color="0.6", lw=1)
    else:  # no configuration both reached the target and has a law's prediction
        bx.text(0.5, 0.5, f"no run has a measured and a\npredicted time to {target:g}", ha="center", va="center",
                transform=bx.transAxes)
    bx.set(xlabel=f"measured time to {target:g} (s)", ylabel="predicted (s)")
    for a, logs in ((ax, reached), (bx, bool(both))):
        if logs:
            a.set(xscale="log", yscale="log")
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=8)
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise ConfigError("arguments", argv[1:], "none besides --flags")
    from jaxsprint.plan import planner

    config = _CONFIG.value
    if config.runtime_configs:
        out = validate_runtime(config)
        with open(os.path.join(_WORKDIR.value, "runtime_comparison.json"), "w") as f:
            json.dump(out, f, indent=1, default=float)
        if _PLOT.value:
            plot_runtime(_PLOT.value, out, planner.check_target_accuracy(config.target_accuracy))
        if _JSON.value:
            print(json.dumps(out, default=float))
            return
        print(runtime_table(out, planner.check_target_accuracy(config.target_accuracy)))
        print(f"wrote {os.path.join(_WORKDIR.value, 'runtime_comparison.json')}" +
              (f" and {_PLOT.value}" if _PLOT.value else ""))
        return

    t0 = time.time()
    setup = resolve(config)
    log = (lambda s: None) if _JSON.value else (lambda s: print(s, flush=True))
    report = planner.run_plan(setup["space"], setup["emulator"], setup["cache"], setup["opts"],
                              minibatch_targets=setup["ladder"], staleness_limits=setup["limits"],
                              max_staleness=config.max_staleness, log=log)
    fit = report.pop("_fit", None)
    if config.holdout and fit is not None:
        lad = setup["ladder"]
        mids = [math.sqrt(a * b) for a, b in zip(lad[:-1], lad[1:])] or lad
        fitted = [(r["nodes"], r["gpus_per_node"], r["sub_batch"]) for r in report["candidates"]
                  if "emulated_best_accuracy" in r]
        report["holdout"] = planner.holdout(setup["space"], setup["emulator"], setup["cache"], setup["opts"], fit,
                                            fitted, minibatch_targets=mids,
                                            staleness_limits=setup["limits"] + [3.0, 6.0], cells=config.holdout,
                                            log=log)
    report["seconds"]["wall"] = time.time() - t0
    if _WORKDIR.value:
        cli.write_config(_WORKDIR.value, config)
        with open(os.path.join(_WORKDIR.value, "plan.json"), "w") as f:
            json.dump(report, f, indent=1, default=float)
    if _PLOT.value and report["reached"]:
        plot(_PLOT.value, report)
    if _JSON.value:
        print(json.dumps(report, default=float))
        return
    print(table(report, setup))
    if _PLOT.value and report["reached"]:
        print(f"wrote {_PLOT.value}")
    if _WORKDIR.value:
        print(f"wrote {os.path.join(_WORKDIR.value, 'plan.json')} and config.json")


if __name__ == "__main__":
    cli.run(main)
