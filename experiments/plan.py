r"""Choose the cluster configuration that reaches a target accuracy soonest (time to accuracy, not epoch time).

    .venv/bin/python experiments/plan.py --machine=tsubame_kfc_dl --network=resnet50 \
        --target_accuracy=0.95 --data=digits --model=mlp          # a few minutes on 2 cores

1. Candidates: SPRINT's rule (the gradient search) over a ladder of mean mini-batch targets
   (``--minibatch_range``, ``--ladder``) and mean-staleness limits (``--staleness_limits``).
2. Each candidate's predicted staleness and mini-batch pmfs drive an emulated run of a proxy network
   (``--model``: mlp or cnn at 8x8) on ``--data`` (digits, mnist5k or a prepared TFDS dataset with
   ``--data_dir``), ``--seeds`` seeds, the learning rate from ``--lr_rule``; runs are cached in
   ``--cache_dir`` keyed by the candidate's statistics. At most ``--budget_runs`` runs: a space-filling
   first design, then runs where the fitted law is least certain.
3. The law ``U(mean mini-batch, mean staleness)`` (McCandlish et al. 2018 with a staleness factor) is fitted
   with its uncertainty; ``U * T_u`` is minimised over (nodes, learners per node, sub-batch).
4. A table of the candidates (epoch time, mean mini-batch, mean staleness, updates to the target predicted with
   a band and emulated, time to accuracy), the chosen configuration and the one SPRINT's rule picks for the
   same mean mini-batch. ``--plot=FILE.png``: epoch time against time to accuracy. ``--json``: one object.

``--holdout=N`` then measures the law's error on N cells of a shifted ladder that were not fitted.
Mini-batches are in cluster samples; the proxy trains on ``B / --minibatch_scale`` samples (default
``--dataset_size / proxy training examples``, 1 when the cluster trains on the same data). Bad input exits
with status 2 and one line naming the flag, before anything is written.
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

from jaxsprint import cli  # noqa: E402
from jaxsprint.errors import ConfigError, check  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("machine", None, "Machine preset (see experiments/search.py).")
flags.DEFINE_string("machine_file", None, "A calibrated machine preset (JSON) instead of --machine.")
flags.DEFINE_string("network", None, "Network of the zoo whose costs give T_c and T_u.")
flags.DEFINE_float("target_accuracy", None, "Test accuracy to reach, in (0, 1].")
flags.DEFINE_string("data", "digits", "Proxy data: digits, mnist5k or a TFDS dataset prepared in --data_dir.")
flags.DEFINE_string("data_dir", None, "Directory of a prepared TFDS dataset.")
flags.DEFINE_string("model", "mlp", "Proxy network: mlp or cnn.")
flags.DEFINE_integer("width", 64, "Hidden width of the proxy.")
flags.DEFINE_integer("max_nodes", None, "Nodes available (default: the machine's).")
flags.DEFINE_integer("max_gpus_per_node", None, "Learners per node available (default: the machine's).")
flags.DEFINE_integer("max_sub_batch", None, "Largest sub-batch (default: the largest that fits, at most 4096).")
flags.DEFINE_integer("dataset_size", None, "Samples per epoch on the cluster (default: the proxy's training set).")
flags.DEFINE_float("minibatch_scale", None, "Cluster samples per proxy sample (default: dataset_size / the "
                   "proxy's training examples).")
flags.DEFINE_list("minibatch_range", None, "lo,hi of the mean mini-batch ladder in cluster samples "
                  "(default: 8 and 256 proxy samples times the scale).")
flags.DEFINE_integer("ladder", 5, "Mini-batch targets on the ladder.")
flags.DEFINE_list("staleness_limits", ["2", "4", "8", "inf"], "Mean-staleness limits of the candidates.")
flags.DEFINE_float("max_staleness", None, "Limit on the chosen configuration's mean staleness.")
flags.DEFINE_float("tolerance", 0.05, "Relative band of SPRINT's rule around a mini-batch target.")
flags.DEFINE_enum("lr_rule", "linear", ["linear", "lr_tau", "none"], "Learning rate: linear scaling with the "
                  "mean mini-batch, the same divided by each gradient's staleness, or constant.")
flags.DEFINE_float("base_lr", 0.05, "Proxy learning rate at --reference_batch proxy samples.")
flags.DEFINE_float("reference_batch", 32.0, "Proxy mini-batch of --base_lr.")
flags.DEFINE_float("momentum", 0.5, "Proxy SGD momentum (applied by the updater to the stale gradients; asynchrony adds "
                   "momentum of its own, docs/planning.md).")
flags.DEFINE_float("t_compute_cv", 0.05, "Coefficient of variation of the learners' compute time.")
flags.DEFINE_integer("seeds", 4, "Seeds per emulated run (vmapped).")
flags.DEFINE_integer("max_updates", 1500, "Updates per emulated run (a run that does not reach the target "
                     "by then is censored).")
flags.DEFINE_integer("eval_every", 25, "Updates between test evaluations.")
flags.DEFINE_integer("budget_runs", 16, "Emulated runs at most (cached ones included).")
flags.DEFINE_integer("initial_runs", 8, "Runs of the first, space-filling design.")
flags.DEFINE_integer("search_starts", 8, "Starts of each gradient search.")
flags.DEFINE_string("cache_dir", os.path.join(os.path.expanduser("~"), ".cache", "jaxsprint", "plan"),
                    "Cache of emulated runs ('' keeps nothing).")
flags.DEFINE_integer("holdout", 0, "After the plan, emulate this many held-out cells and report the law's error.")
flags.DEFINE_list("runtime_configs", None, "Instead of a plan: learners:sub_batch:network_time_s,... run on the "
                  "SPRINT runtime here (tiny_nobn on digits at 8x8) and compared with the law's leave-one-out "
                  "prediction from emulated runs under each configuration's measured pmfs.")
flags.DEFINE_integer("runtime_updates", 600, "With --runtime_configs: updates per runtime run.")
flags.DEFINE_string("runtime_workdir", None, "With --runtime_configs: where the runtime writes its runs.")
flags.DEFINE_bool("runtime_reuse", False, "With --runtime_configs: read a finished run of the same config from "
                  "--runtime_workdir instead of running it again (to judge one set of runs at another target).")
flags.DEFINE_bool("json", False, "Print one JSON object instead of the tables.")
flags.DEFINE_string("plot", None, "Write a PNG: epoch time against predicted time to accuracy.")


def _floats(field: str, values: list[str] | None) -> list[float] | None:
    if values is None:
        return None
    try:
        return [float(v) for v in values]
    except ValueError:
        raise ConfigError(field, ",".join(values), "comma-separated numbers") from None


def resolve() -> dict[str, Any]:
    """Checks every flag (nothing is read or written before); then loads the machine, network and data."""
    from jaxsprint.plan import emulator, planner
    from jaxsprint.perf import presets, zoo
    from jaxsprint.perf import space as spaces

    if FLAGS.target_accuracy is None:
        raise ConfigError("--target_accuracy", None, "a fraction in (0, 1]; the flag is required")
    planner.check_target_accuracy(FLAGS.target_accuracy)
    check(FLAGS.model in emulator.PROXY_MODELS, "--model", FLAGS.model,
          f"one of {', '.join(emulator.PROXY_MODELS)} (proxy networks)")
    from jaxsprint.train import data as data_lib
    check(FLAGS.data in data_lib.BUILTIN or bool(FLAGS.data_dir), "--data", FLAGS.data,
          f"one of {', '.join(data_lib.BUILTIN)}, or a TFDS dataset name with --data_dir")
    limits = _floats("--staleness_limits", FLAGS.staleness_limits)
    check(all(v > 1 for v in limits), "--staleness_limits", FLAGS.staleness_limits,
          "numbers > 1 or inf (the protocol's mean staleness always exceeds 1)")
    mb_range = _floats("--minibatch_range", FLAGS.minibatch_range)
    check(mb_range is None or len(mb_range) == 2, "--minibatch_range", FLAGS.minibatch_range, "two numbers lo,hi")
    check(FLAGS.holdout >= 0, "--holdout", FLAGS.holdout, "an integer >= 0")
    machine = presets.load_machine(FLAGS.machine, FLAGS.machine_file)
    if not FLAGS.network:
        raise ConfigError("--network", FLAGS.network, f"one of {', '.join(sorted(zoo.ZOO))}")
    net = zoo.get(FLAGS.network)
    data = emulator.load_proxy_data(FLAGS.data, data_dir=FLAGS.data_dir)
    dataset_size = FLAGS.dataset_size or data.num_train
    scale = FLAGS.minibatch_scale if FLAGS.minibatch_scale is not None else dataset_size / data.num_train
    opts = planner.PlanOptions(
        target_accuracy=FLAGS.target_accuracy, lr_rule=FLAGS.lr_rule, base_lr=FLAGS.base_lr,
        reference_batch=FLAGS.reference_batch, minibatch_scale=scale, t_compute_cv=FLAGS.t_compute_cv,
        tolerance=FLAGS.tolerance, budget_runs=FLAGS.budget_runs, initial_runs=min(FLAGS.initial_runs,
                                                                                     FLAGS.budget_runs),
        search_starts=FLAGS.search_starts)
    opts.validate()
    emulator = emulator.Emulator(data, FLAGS.model, seeds=FLAGS.seeds, max_updates=FLAGS.max_updates,
                                    eval_every=FLAGS.eval_every, momentum=FLAGS.momentum, width=FLAGS.width)
    space = spaces.make_space(net, machine, max_nodes=FLAGS.max_nodes, max_gpus_per_node=FLAGS.max_gpus_per_node,
                              max_sub_batch=FLAGS.max_sub_batch, dataset_size=dataset_size)
    lo, hi = mb_range if mb_range is not None else (8.0 * scale, 256.0 * scale)
    from jaxsprint.plan import law as plan_lib
    ladder = plan_lib.minibatch_ladder(lo, hi, FLAGS.ladder)
    if FLAGS.max_staleness is not None:
        check(math.isfinite(FLAGS.max_staleness) and FLAGS.max_staleness > 1, "--max_staleness",
              FLAGS.max_staleness, "a finite number > 1")
    return dict(space=space, emulator=emulator, opts=opts, ladder=ladder, limits=limits, scale=scale,
                cache=emulator.RunCache(FLAGS.cache_dir or None))


def _fmt(v, spec=".4g", none="-"):
    return none if v is None else format(v, spec)


def table(report: dict[str, Any], setup: dict[str, Any]) -> str:
    """Human-readable report."""
    space, em = setup["space"], setup["emulator"]
    lines = [f"plan: {space.network.name} on {space.machine.name}; target test accuracy "
             f"{report['target_accuracy']:g} of the proxy {em.model} (width {em.width}) on {em.data.name} at "
             f"{em.data.image_size}x{em.data.image_size}, lr rule {setup['opts'].lr_rule}, {em.seeds} seeds, "
             f"{em.max_updates} updates per run; 1 proxy sample = {setup['scale']:.4g} cluster samples",
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
                     "(try a lower --target_accuracy, more --max_updates, another --lr_rule)")
        return "\n".join(lines)
    f = report["fit"]
    lines.append(f"law: U = {f['s_min']:.4g} (1 + {f['b_noise']:.4g} / B) exp(a tau^p (B/{f['b_ref']:.4g})^delta), "
                 f"a = {math.exp(f['params']['log_a']):.3g}, p = {math.exp(f['params']['log_p']):.3g}, "
                 f"delta = {f['params']['delta']:.3g}; {f['num_observed']} cells reached, {f['num_censored']} "
                 f"censored; residual sd of log U {f['residual_sd']:.3f}")
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


def validate_runtime() -> dict[str, Any]:
    """--runtime_configs: measured time to accuracy on the SPRINT runtime beside the law's prediction."""
    from experiments.configs import sprint as sprint_config
    from jaxsprint.plan import emulator, planner, validation

    if FLAGS.target_accuracy is None:
        raise ConfigError("--target_accuracy", None, "a fraction in (0, 1]; the flag is required")
    target = planner.check_target_accuracy(FLAGS.target_accuracy)
    configs = validation.parse_configs(FLAGS.runtime_configs)
    check(bool(FLAGS.runtime_workdir), "--runtime_workdir", FLAGS.runtime_workdir, "a directory for the runs")
    base = sprint_config.get_config()
    with base.unlocked():  # --momentum is the runtime's too, so that both sides train the same optimizer
        base.optimizer.momentum = float(FLAGS.momentum)
    data = emulator.load_proxy_data("digits")
    em = emulator.Emulator(data, "tiny_nobn", seeds=FLAGS.seeds, max_updates=FLAGS.max_updates,
                              eval_every=FLAGS.eval_every, momentum=float(base.optimizer.momentum),
                              weight_decay=float(base.optimizer.weight_decay))
    cache = emulator.RunCache(FLAGS.cache_dir or None)
    measured, cells = [], []
    for n, b, t in configs:
        cfg = validation.runtime_config(base, learners=n, sub_batch=b, network_time_s=t,
                                          num_updates=FLAGS.runtime_updates, eval_every_updates=FLAGS.eval_every,
                                          learning_rate=FLAGS.base_lr)
        m = validation.measure(cfg, os.path.join(FLAGS.runtime_workdir, f"n{n}_b{b}_t{t:g}"), target,
                                 reuse=FLAGS.runtime_reuse)
        # Each emulated run at its own bucket (its result does not depend on it): carrying the largest one
        # over, as the planner does to share one compilation, made every later run several times slower.
        spec = validation.emulated_spec(m, FLAGS.base_lr)
        measured.append(m)
        cells.append(cache.run(em, spec))
        if not FLAGS.json:
            print(f"  {n} learners, sub-batch {b}, network {t:g} s: staleness {m['mean_staleness']:.3g}, mini-batch "
                  f"{m['mean_minibatch']:.4g}, measured U {m['updates_to_target']}, time {m['time_to_accuracy_s']}",
                  flush=True)
    return validation.compare(measured, cells, target, em.max_updates)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise ConfigError("arguments", argv[1:], "none besides --flags")
    from jaxsprint.plan import planner

    if FLAGS.runtime_configs:
        out = validate_runtime()
        print(json.dumps(out, default=float) if FLAGS.json else json.dumps(out, indent=1, default=float))
        return

    t0 = time.time()
    setup = resolve()
    log = (lambda s: None) if FLAGS.json else (lambda s: print(s, flush=True))
    report = planner.run_plan(setup["space"], setup["emulator"], setup["cache"], setup["opts"],
                              minibatch_targets=setup["ladder"], staleness_limits=setup["limits"],
                              max_staleness=FLAGS.max_staleness, log=log)
    fit = report.pop("_fit", None)
    if FLAGS.holdout and fit is not None:
        lad = setup["ladder"]
        mids = [math.sqrt(a * b) for a, b in zip(lad[:-1], lad[1:])] or lad
        fitted = [(r["nodes"], r["gpus_per_node"], r["sub_batch"]) for r in report["candidates"]
                  if "emulated_best_accuracy" in r]
        report["holdout"] = planner.holdout(setup["space"], setup["emulator"], setup["cache"], setup["opts"], fit,
                                            fitted, minibatch_targets=mids,
                                            staleness_limits=setup["limits"] + [3.0, 6.0], cells=FLAGS.holdout,
                                            log=log)
    report["seconds"]["wall"] = time.time() - t0
    if FLAGS.plot and report["reached"]:
        plot(FLAGS.plot, report)
    if FLAGS.json:
        print(json.dumps(report, default=float))
        return
    print(table(report, setup))
    if FLAGS.plot and report["reached"]:
        print(f"wrote {FLAGS.plot}")


if __name__ == "__main__":
    cli.run(main)
