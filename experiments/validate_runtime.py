r"""The SPRINT model judged against the real runtime over a grid of configurations.

  python experiments/validate_runtime.py --config=experiments/configs/validate_runtime.py \
      --out=runs/validate_runtime                                  # the grid: about 30-40 minutes
  python experiments/validate_runtime.py --out=runs/validate_runtime --dry_run  # the plan and its time only
  python experiments/validate_runtime.py --out=/tmp/vr_quick --quick            # 2 tiny runs, about a minute
  python experiments/validate_runtime.py --out=runs/validate_runtime --reanalyse  # saved runs, current model
  python experiments/validate_runtime.py --out=docs/runtime-calibration-runs \
      --config.validation.grid=calibration   # the runs calibrate_runtime.py fits to (10 others, ~12 minutes)

The config (``experiments/configs/validate_runtime.py``, the default of ``--config``) is the SPRINT config of
every run with ``config.validation`` (``validation.<field>`` below): the grid and the predictions. Each
configuration (hosts x learners per host, sub-batch, emulated network time; the grid spans T_u/T_c from about
0.1 to 10) is one run of experiments/run_sprint.py --json (two processes on loopback for two hosts,
jax.distributed with gloo; each process gets one fake CPU device per learner and, with ``updater_device=own``,
the default, one more for its updater), long enough for at least ``min_gradients`` gradients and
``min_updates`` updates after the warm-up: the duration comes from the model's specs estimate of T_c and T_u
(the ``machine`` preset), and a run that falls short is repeated once, longer. Writes to --out: ``runs/<name>/``
(each run's workdir, stdout and stderr), ``results.json``, ``results.csv``, ``summary.md`` (errors per
configuration, their medians and 90th percentiles, from timings and from specs), ``errors.png`` and
``config.json`` (the resolved config). Run it on a quiet machine: the learners share the cores.

The specs prediction (``specs``): ``loo`` (the default) predicts each run with the preset whose runtime figures
(:data:`jaxsprint.calibration.host_fit.RUNTIME_FIELDS`) are refitted to the measured cycle means of the OTHER
runs of the grid (:func:`jaxsprint.calibration.host_fit.cross_validate`); ``preset`` uses the preset as it is.
``--reanalyse`` runs nothing: it re-reads every saved ``runs/<name>/events.npz`` under --out and recomputes
both predictions with the current model and preset (the specs one from the config with the overrides saved in
``results.json``). The ``--config.<field>`` overrides outside ``config.validation`` are passed to every run
(not those of the fields a grid entry sets: ``learners_per_host``, ``sub_batch``, ``network_time_s``, the
stops and the warm-up), and every run's config is checked before the first starts.
"""
import copy
import csv
import json
import math
import os
import subprocess
import sys
import time

os.environ["JAX_PLATFORMS"] = "cpu"  # every run is on XLA:CPU (run_config), so are this process's checks and costs
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxsprint import cli, subprocs  # noqa: E402
from jaxsprint.errors import ConfigError, check  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
_DEFAULT_CONFIG = os.path.join(_HERE, "configs", "validate_runtime.py")
_CONFIG = cli.define_config_file("config", _DEFAULT_CONFIG, "The SPRINT config of every run with "
                                 "config.validation, the grid and the predictions "
                                 "(experiments/configs/validate_runtime.py).")
_OUT = flags.DEFINE_string("out", None, "Output folder (created).")
_QUICK = flags.DEFINE_bool("quick", False, "A tiny grid (2 runs of a tiny model, a few seconds each) for tests.")
_DRY = flags.DEFINE_bool("dry_run", False, "Print the plan and its estimated time; run nothing.")
_REANALYSE = flags.DEFINE_bool("reanalyse", False, "Re-analyse the saved runs under --out with the current model "
                               "and preset; run nothing.")
_GRIDS, _SPECS_KINDS, _UPDATER_DEVICES = ("validation", "calibration"), ("loo", "preset"), ("shared", "own")

# (name, hosts, learners per host, sub-batch, emulated network ms), chosen for T_u/T_c from about 0.1 to 10
# on 2 cores (learners beyond the cores time-share them, so T_c grows with all processes' learners).
GRID = (
    ("h1_l1_b8_n20", 1, 1, 8, 20), ("h1_l1_b128_n5", 1, 1, 128, 5), ("h1_l2_b8_n50", 1, 2, 8, 50),
    ("h1_l2_b64_n10", 1, 2, 64, 10), ("h1_l4_b32_n30", 1, 4, 32, 30), ("h1_l4_b16_n100", 1, 4, 16, 100),
    ("h1_l8_b32_n10", 1, 8, 32, 10), ("h1_l8_b128_n50", 1, 8, 128, 50), ("h1_l8_b8_n20", 1, 8, 8, 20),
    ("h2_l1_b32_n0", 2, 1, 32, 0), ("h2_l1_b8_n50", 2, 1, 8, 50), ("h2_l2_b32_n20", 2, 2, 32, 20),
    ("h2_l4_b64_n100", 2, 4, 64, 100), ("h2_l2_b128_n5", 2, 2, 128, 5),
    # two-host runs that pin the two-host updater: without network time (the updaters' collectives busy on
    # the cores) and with 20 ms (an updater waits for its partner), sub-batch 8-128, 1-4 learners per host
    ("h2_l1_b8_n0", 2, 1, 8, 0), ("h2_l1_b128_n20", 2, 1, 128, 20), ("h2_l2_b8_n0", 2, 2, 8, 0),
    ("h2_l2_b64_n0", 2, 2, 64, 0), ("h2_l4_b16_n20", 2, 4, 16, 20), ("h2_l4_b128_n0", 2, 4, 128, 0),
)
# The calibration's runs: configurations of the same ranges that are not in GRID (1-8 learners per host, 1 and 2
# hosts, sub-batch 8-128, network 0-50 ms), three of them with two hosts (they fix the two-host stretch).
CALIBRATION_GRID = (
    ("cal_h1_l1_b32_n0", 1, 1, 32, 0), ("cal_h1_l2_b16_n20", 1, 2, 16, 20), ("cal_h1_l2_b128_n0", 1, 2, 128, 0),
    ("cal_h1_l4_b8_n10", 1, 4, 8, 10), ("cal_h1_l4_b64_n20", 1, 4, 64, 20), ("cal_h1_l8_b16_n50", 1, 8, 16, 50),
    ("cal_h1_l8_b64_n0", 1, 8, 64, 0), ("cal_h2_l1_b64_n10", 2, 1, 64, 10), ("cal_h2_l2_b16_n0", 2, 2, 16, 0),
    ("cal_h2_l4_b32_n50", 2, 4, 32, 50),
)
QUICK_GRID = (("quick_h1_l2", 1, 2, 8, 10), ("quick_h2_l1", 2, 1, 8, 10))
QUICK_OVERRIDES = ("--config.model=tiny", "--config.image_size=8")
QUICK_DURATION_S, QUICK_WARMUP_S = 3.0, 0.5
_OWN_UPDATER = "--config.sprint.updater_device=own"
_SET_BY_GRID = tuple(f"config.sprint.{f}" for f in ("learners_per_host", "sub_batch", "network_time_s", "duration_s",
                                                     "num_updates", "num_epochs", "warmup_s", "checkpoint",
                                                     "eval_every_updates"))  # by run_config
_STARTUP_S = 40.0  # imports, data, compilation and the specs cost table of one run (2 cores, rough)
_METRICS = (("epoch time", "epoch_time_rel_error"), ("mean mini-batch", "mean_minibatch_rel_error"),
            ("mean staleness", "mean_staleness_rel_error"), ("TV mini-batch", "minibatch_tv"),
            ("TV staleness", "staleness_tv"), ("TV mini-batch floor", "minibatch_tv_floor"),
            ("TV staleness floor", "staleness_tv_floor"),
            ("TV mini-batch, two-moment reference", "minibatch_tv_two_moment"))


def _config_overrides() -> list[str]:
    """The ``--config.*`` flags of this command line, passed on to every run (not ``config.validation``'s)."""
    return [a for a in sys.argv[1:] if a.startswith("--config.") and not a.startswith("--config.validation.")]


def plan_duration(tc: float, tu: float, n: int, *, min_gradients: int, min_updates: int, warmup_s: float,
                  max_duration_s: float, margin: float = 1.3) -> float:
    """Run length for ``min_gradients`` gradients (``N / T_c`` per second) and ``min_updates`` updates
    (``1 / T_u`` per second) after the warm-up, with a margin; at most ``max_duration_s``."""
    need = max(min_gradients * tc / n, min_updates * tu)
    return float(min(max_duration_s, warmup_s + margin * need + 1.0))


def _estimates(config, grid, machine) -> dict[str, tuple[float, float]]:
    """Specs estimates of ``(T_c, T_u)`` per configuration (the plan of the durations)."""
    from jaxsprint.calibration import compare

    network = compare.network_cost(config)
    out = {}
    for name, hosts, lph, b, net_ms in grid:
        tc, tu, _, _ = compare.spec_times(network, *machine, learners_per_host=lph, num_hosts=hosts, sub_batch=b,
                                          network_time_s=net_ms / 1e3)
        out[name] = (tc, tu)
    return out


def run_config(entry, workdir: str, *, duration_s: float, warmup_s: float, overrides: list[str],
               timeout_s: float) -> dict:
    """One run of experiments/run_sprint.py --json for a grid entry (two processes for two hosts).

    Returns process 0's JSON. Raises RuntimeError when a process fails (with its last stderr line) or
    outlives ``timeout_s`` (all are killed).
    """
    name, hosts, lph, b, net_ms = entry
    os.makedirs(workdir, exist_ok=True)
    args = [sys.executable, os.path.join(_HERE, "run_sprint.py"), "--json", f"--config={config_flags.get_config_filename(flags.FLAGS['config'])}",
            *overrides, f"--config.sprint.learners_per_host={lph}", f"--config.sprint.sub_batch={b}",
            f"--config.sprint.network_time_s={net_ms / 1e3}", f"--config.sprint.duration_s={duration_s}",
            "--config.sprint.num_updates=0", "--config.sprint.num_epochs=0.0",
            f"--config.sprint.warmup_s={warmup_s}", "--config.sprint.checkpoint=False",
            "--config.sprint.eval_every_updates=0"]
    v = _CONFIG.value.validation
    args.append(f"--machine_file={v.machine_file}" if v.machine_file else f"--machine={v.machine}")
    own = _OWN_UPDATER in overrides  # one more device per process, the updater's
    if own:
        args.append(f"--config.sprint.devices={lph}")
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={lph + 1 if own else lph}")
    port = subprocs.coordinator_port() if hosts > 1 else None
    procs, files = [], []
    try:
        for p in range(hosts):
            extra = [] if hosts == 1 else [f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={hosts}",
                                           f"--process_id={p}"]
            out = open(os.path.join(workdir, f"stdout{p}.txt"), "w")
            err = open(os.path.join(workdir, f"stderr{p}.txt"), "w")
            files += [out, err]
            procs.append(subprocess.Popen(args + [f"--workdir={workdir}"] + extra, stdout=out, stderr=err, env=env))
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"run {name} did not finish within --run_timeout_s={timeout_s} (stopped)") from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for f in files:
            f.close()
    for p, proc in enumerate(procs):
        if proc.returncode != 0:
            with open(os.path.join(workdir, f"stderr{p}.txt")) as fh:
                lines = [ln for ln in fh.read().strip().splitlines() if ln.strip()]
            raise RuntimeError(f"run {name} process {p} failed (exit {proc.returncode}): "
                               f"{lines[-1] if lines else 'no message'}")
    with open(os.path.join(workdir, "stdout0.txt")) as fh:
        line = next((ln for ln in fh.read().splitlines() if ln.startswith("{")), None)
    if line is None:
        raise RuntimeError(f"run {name} printed no JSON (see {workdir}/stdout0.txt)")
    return json.loads(line)


def summarize(rows: list[dict]) -> dict:
    """Median and 90th percentile of each absolute error over the runs, from timings and from specs."""
    from jaxsprint.calibration import compare

    out = {}
    for source in ("timings", "specs"):
        for key, stats in compare.summarize_errors([r.get(f"errors_from_{source}") for r in rows]).items():
            out[f"{source}.{key}"] = stats
    return out


def _csv_rows(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        m = r["measured"]
        row = dict(name=r["name"], hosts=r["hosts"], learners_per_host=r["learners_per_host"], sub_batch=r["sub_batch"],
                   network_ms=r["network_ms"], duration_s=r["duration_s"], t_compute_ms=1e3 * m["t_compute_s"],
                   t_compute_cv=m["t_compute_cv"], t_update_ms=1e3 * m["t_update_s"], t_update_cv=m["t_update_cv"],
                   ratio_tu_tc=m["t_update_s"] / m["t_compute_s"], gradients=m["gradients"], updates=m["updates"],
                   in_flight=m["in_flight"], images_per_s=m["images_per_s"], eval_accuracy=r.get("eval_accuracy"))
        for source in ("timings", "specs"):
            errs = r.get(f"errors_from_{source}") or {}
            for _, key in _METRICS:
                row[f"{source}_{key}"] = errs.get(key)
        out.append(row)
    return out


def _pct(v) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{100 * v:+.1f}%"


def _tv(v) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.3f}"


def markdown(rows: list[dict], summary: dict) -> str:
    """The per-configuration table and the summary (medians, 90th percentiles) in markdown."""
    head = ("| config | T_c ms (cv) | T_u ms (cv) | T_u/T_c | grads | updates | source | epoch | mini-batch | "
            "staleness | TV mini-batch (floor; two-moment) | TV staleness (floor) |")
    lines = [head, "|" + "---|" * 12]
    for r, c in zip(rows, _csv_rows(rows)):
        for source in ("timings", "specs"):
            e = r.get(f"errors_from_{source}") or {}
            lines.append(
                f"| {r['name']} | {c['t_compute_ms']:.2f} ({c['t_compute_cv']:.2f}) | {c['t_update_ms']:.2f} "
                f"({c['t_update_cv']:.2f}) | {c['ratio_tu_tc']:.3g} | {c['gradients']} | {c['updates']} | {source} | "
                f"{_pct(e.get('epoch_time_rel_error'))} | {_pct(e.get('mean_minibatch_rel_error'))} | "
                f"{_pct(e.get('mean_staleness_rel_error'))} | {_tv(e.get('minibatch_tv'))} "
                f"({_tv(e.get('minibatch_tv_floor'))}; {_tv(e.get('minibatch_tv_two_moment'))}) | "
                f"{_tv(e.get('staleness_tv'))} "
                f"({_tv(e.get('staleness_tv_floor'))}) |")
    lines += ["", "| source | statistic | " + " | ".join(label for label, _ in _METRICS) + " |", "|---|---|"
              + "---|" * len(_METRICS)]
    for source in ("timings", "specs"):
        for stat in ("median", "p90"):
            cells = []
            for _, key in _METRICS:
                v = summary[f"{source}.{key}"][stat]
                cells.append(_tv(v) if "_tv" in key else ("-" if not math.isfinite(v) else f"{100 * v:.1f}%"))
            lines.append(f"| {source} | {stat} of the absolute values | " + " | ".join(cells) + " |")
    coupled = [r for r in rows if r.get("count_coupling")]
    if coupled:  # events.count_coupling: what the model's independent learners would give as 1 and 1
        lines += ["", "| config | count slope / arrival rate | count variance: updater cycles | random windows | "
                      "ratio |", "|---|---|---|---|---|"]
        for r in coupled:
            c = r["count_coupling"]
            lines.append(f"| {r['name']} | {c['slope_ratio']:.2f} | {c['var_cycles']:.2f} | {c['var_random']:.2f} | "
                         f"{c['variance_ratio']:.2f} |")
    return "\n".join(lines)


def plot(path: str, rows: list[dict]) -> None:
    """Absolute errors against T_u/T_c, one panel per statistic, from timings and from specs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [m for m in _METRICS if not m[1].endswith(("_floor", "_two_moment"))]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.6))
    ratio = [r["measured"]["t_update_s"] / r["measured"]["t_compute_s"] for r in rows]
    for ax, (label, key) in zip(axes, metrics):
        # References beside the errors: what an exact model would score over the run's updates (gradients),
        # and what a model with the run's own mean and variance would (compare.two_moment_tv).
        for suffix, style in (("_floor", dict(label="sampling floor", marker="_", color="0.4")),
                              ("_two_moment", dict(label="two-moment reference", marker="x", color="0.2",
                                                   linewidths=0.8))):
            ref = [(x, r["errors_from_timings"].get(key + suffix)) for x, r in zip(ratio, rows)
                   if r.get("errors_from_timings")]
            ref = [(x, v) for x, v in ref if v is not None and math.isfinite(v)]
            if ref:
                ax.scatter(*zip(*ref), s=22, **style)
        for source, style in (("timings", dict(color="C1", marker="o")), ("specs", dict(color="C2", marker="s"))):
            pts = [(x, abs(r[f"errors_from_{source}"][key])) for x, r in zip(ratio, rows)
                   if r.get(f"errors_from_{source}") and r[f"errors_from_{source}"][key] is not None]
            if pts:
                ax.scatter(*zip(*pts), label=f"from {source}", s=18, **style)
        ax.set_xscale("log")
        ax.set_xlabel("measured T_u / T_c")
        ax.set_title(label + (" (TV)" if key.endswith("_tv") else " (|relative error|)"), fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _override(config, overrides: list[str]):
    """``config`` with ``--config.a.b=value`` overrides applied (values parsed by the field's type)."""
    config = config.copy_and_resolve_references()
    with config.unlocked():
        for arg in overrides:
            key, _, value = arg[len("--config."):].partition("=")
            *parents, leaf = key.split(".")
            node = config
            for part in parents:
                node = node[part]
            old = node[leaf]
            if isinstance(old, bool):
                node[leaf] = value.lower() in ("1", "true", "yes")
            elif isinstance(old, (int, float)) and not isinstance(old, bool):
                node[leaf] = type(old)(float(value)) if isinstance(old, int) else float(value)
            else:
                node[leaf] = value
    return config


def reanalyse(out: str, config, machine, overrides: list[str] | None = None, specs: str = "preset"
              ) -> tuple[list[dict], list[dict]]:
    """Rows of :func:`main`'s ``results.json`` recomputed from every ``out/runs/<name>/events.npz``.

    Each run: ``events.statistics`` of its log, the model from timings, and from specs (``config`` with
    ``overrides`` and the log's learners per host, hosts, sub-batch and network time) with ``machine`` (a
    ``(Machine, HostFigures)`` pair)
    (``specs="preset"``) or, leave one out, with ``machine`` refitted to the measured cycles of every other
    run (``specs="loo"``, :func:`jaxsprint.calibration.host_fit.cross_validate`). The old
    ``results.json`` (if any) gives each run's duration and evaluation accuracy and the overrides.
    """
    from jaxsprint.calibration import host_fit
    from jaxsprint.calibration import compare
    from jaxsprint.runtime import events

    old_path = os.path.join(out, "results.json")
    old = {}
    if os.path.exists(old_path):
        with open(old_path) as fh:
            old = json.load(fh)
    if overrides is None:
        overrides = list(old.get("overrides", []))
    before = {r["name"]: r for r in old.get("runs", [])}
    runs_dir = os.path.join(out, "runs")
    names = sorted(d for d in os.listdir(runs_dir) if os.path.isfile(os.path.join(runs_dir, d, "events.npz"))) \
        if os.path.isdir(runs_dir) else []
    check(bool(names), "--out", out, "a folder with saved runs (runs/<name>/events.npz)")
    base = _override(config, overrides)
    network = compare.network_cost(base)
    rows, failures = [], []
    stats, coupling = {}, {}
    for name in names:
        try:
            ev = events.load(os.path.join(runs_dir, name, "events.npz"))
            stats[name], coupling[name] = events.statistics(ev), events.count_coupling(ev)
        except Exception as e:  # noqa: BLE001 -- one broken log does not end the re-analysis; it is reported
            print(f"{name}: FAILED: {e}", flush=True)
            failures.append({"name": name, "error": str(e)})
    names = [n for n in names if n in stats]
    machines = {n: machine for n in names}
    if specs == "loo" and len(names) >= 2:
        runs = [host_fit.RuntimeRun.from_record({**stats[n], "hosts": stats[n]["num_hosts"], "label": n})
                for n in names]
        machines = dict(zip(names, host_fit.cross_validate(*machine, network, runs)))
    for name in names:
        try:
            m = stats[name]
            cfg = _override(base, [f"--config.sprint.learners_per_host={m['learners_per_host']}",
                                   f"--config.sprint.sub_batch={m['sub_batch']}",
                                   f"--config.sprint.network_time_s={m['network_time_s']}"])
            preds = {"timings": compare.predict_from_timings(m),
                     "specs": compare.predict_from_specs(*machines[name], network, cfg, num_hosts=m["num_hosts"],
                                                         learners_per_host=m["learners_per_host"],
                                                         dataset_size=m["dataset_size"])}
        except Exception as e:  # noqa: BLE001 -- one broken log does not end the re-analysis; it is reported
            print(f"{name}: FAILED: {e}", flush=True)
            failures.append({"name": name, "error": str(e)})
            continue
        res = compare.report(m, preds)
        prev = before.get(name, {})
        res["eval_accuracy"] = prev.get("eval_accuracy")
        res["count_coupling"] = coupling[name]
        rows.append(dict(name=name, hosts=m["num_hosts"], learners_per_host=m["learners_per_host"],
                         sub_batch=m["sub_batch"], network_ms=1e3 * m["network_time_s"],
                         duration_s=prev.get("duration_s", m["t_stop_s"]), **res))
    return rows, failures


def _write(out: str, rows: list[dict], failures: list[dict], overrides: list[str]) -> None:
    """results.json, results.csv, summary.md and errors.png of the rows; prints the summary."""
    summary = summarize(rows)
    with open(os.path.join(out, "results.json"), "w") as fh:
        json.dump({"runs": rows, "failures": failures, "summary": summary, "overrides": overrides}, fh, indent=1)
    table = _csv_rows(rows)
    with open(os.path.join(out, "results.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    md = markdown(rows, summary)
    with open(os.path.join(out, "summary.md"), "w") as fh:
        fh.write(md + "\n")
    plot(os.path.join(out, "errors.png"), rows)
    print(md)
    for f in failures:
        print(f"FAILED {f['name']}: {f['error']}")
    print(f"wrote {out}/results.json, results.csv, summary.md, errors.png")


def check_runs(config, grid, *, quick: bool, own: bool, warmup_s: float, duration_s: float) -> None:
    """Checks the SPRINT config of every run of `grid` (`run_config`'s settings, at most `duration_s` long) as
    its process will (``runtime.validate_config`` with its devices), before any runs or anything is written.

    Raises:
      ConfigError: naming the first bad field.
    """
    from jaxsprint import runtime

    base = _override(config, list(QUICK_OVERRIDES)) if quick else config  # `config` has the command's overrides
    for _, _, lph, b, net_ms in grid:
        c = copy.deepcopy(base)
        with c.unlocked():
            s = c.sprint
            s.learners_per_host, s.sub_batch, s.network_time_s = lph, b, net_ms / 1e3
            s.duration_s, s.num_updates, s.num_epochs, s.warmup_s = float(duration_s), 0, 0.0, float(warmup_s)
            s.checkpoint, s.eval_every_updates = False, 0
            if own:
                s.updater_device, s.devices = "own", lph
        runtime.validate_config(c, lph + 1 if own else lph)


def main(argv):
    if len(argv) > 1:
        raise ConfigError("arguments", argv[1:], "none besides flags")
    check(bool(_OUT.value), "--out", _OUT.value, "an output folder is required")
    cli.check_output_dir("--out", _OUT.value)
    from jaxsprint.runtime.bounds import MAX_SECONDS

    v = _CONFIG.value.validation
    for name in ("min_gradients", "min_updates"):
        check(isinstance(v[name], int) and v[name] >= 1, f"config.validation.{name}", v[name], "an integer >= 1")
    check(math.isfinite(v.warmup_s) and v.warmup_s >= 0, "config.validation.warmup_s", v.warmup_s, "a number >= 0")
    for name in ("max_duration_s", "run_timeout_s"):
        check(math.isfinite(v[name]) and 0 < v[name] <= MAX_SECONDS, f"config.validation.{name}", v[name],
              f"a number of seconds in (0, {MAX_SECONDS:g}]")
    check(v.warmup_s < v.max_duration_s, "config.validation.warmup_s", v.warmup_s,
          f"less than config.validation.max_duration_s={v.max_duration_s} (a run longer than its warm-up)")
    check(v.run_timeout_s > v.max_duration_s + _STARTUP_S, "config.validation.run_timeout_s", v.run_timeout_s,
          f"more than config.validation.max_duration_s={v.max_duration_s} + {_STARTUP_S:g} s of start-up (the "
          "timeout stops a run's processes)")
    for name, allowed in (("grid", _GRIDS), ("specs", _SPECS_KINDS), ("updater_device", _UPDATER_DEVICES)):
        check(v[name] in allowed, f"config.validation.{name}", v[name], f"one of {', '.join(allowed)}")
    grid = QUICK_GRID if _QUICK.value else CALIBRATION_GRID if v.grid == "calibration" else GRID
    label = "quick" if _QUICK.value else v.grid
    names = [g[0] for g in grid]
    only = cli.text_list("config.validation.only", v.only)
    for n in only:
        check(n in names, "config.validation.only", n, f"names of the {label} grid: {', '.join(names)}")
    grid = [g for g in grid if not only or g[0] in only]
    for arg in _config_overrides():
        key = arg[len("--"):].partition("=")[0]
        check(key not in _SET_BY_GRID, key, arg.partition("=")[2],
              "not an override here: every run's grid entry and planned length set it (config.validation)")
    overrides = (list(QUICK_OVERRIDES) if _QUICK.value else []) + _config_overrides()
    if v.updater_device == "own" and _OWN_UPDATER not in overrides:
        overrides.append(_OWN_UPDATER)
    check_runs(_CONFIG.value, grid, quick=_QUICK.value, own=_OWN_UPDATER in overrides,
               warmup_s=QUICK_WARMUP_S if _QUICK.value else v.warmup_s,
               duration_s=QUICK_DURATION_S if _QUICK.value else v.max_duration_s)
    from jaxsprint.calibration import host
    from jaxsprint.perf import presets

    name = None if v.machine_file else v.machine
    with cli.as_config_fields("config.validation."):
        machine = presets.load_machine(name, v.machine_file)
        machine = (machine, host.load_host(machine, name, v.machine_file))  # with its host figures
    if _REANALYSE.value:
        check(os.path.isdir(os.path.join(_OUT.value, "runs")), "--out", _OUT.value,
              "a folder with saved runs (runs/<name>/events.npz) for --reanalyse")
        rows, failures = reanalyse(_OUT.value, _CONFIG.value, machine, _config_overrides() or None, v.specs)
        check(bool(rows), "--out", _OUT.value, "saved runs that can be re-analysed")
        used = _config_overrides()
        if not used and os.path.exists(os.path.join(_OUT.value, "results.json")):
            with open(os.path.join(_OUT.value, "results.json")) as fh:
                used = json.load(fh).get("overrides", [])
        _write(_OUT.value, rows, failures, used)
        cli.write_config(_OUT.value, _CONFIG.value)
        if failures:
            sys.exit(1)
        return
    if _QUICK.value:
        warmup = QUICK_WARMUP_S
        plan = {g[0]: QUICK_DURATION_S for g in grid}
        est = {}
    else:
        warmup = v.warmup_s
        est = _estimates(_CONFIG.value, grid, machine)
        plan = {g[0]: plan_duration(*est[g[0]], g[1] * g[2], min_gradients=v.min_gradients,
                                    min_updates=v.min_updates, warmup_s=warmup, max_duration_s=v.max_duration_s)
                for g in grid}
    total = sum(plan.values()) + _STARTUP_S * len(grid)
    print(f"{len(grid)} runs, about {total / 60:.0f} minutes (run time {sum(plan.values()):.0f} s plus about "
          f"{_STARTUP_S:.0f} s start-up each; a run that falls short is repeated once, longer)", flush=True)
    for g in grid:
        tc, tu = est.get(g[0], (math.nan, math.nan))
        print(f"  {g[0]:18s} hosts {g[1]} x learners {g[2]}, sub-batch {g[3]:3d}, network {g[4]:3d} ms: "
              f"{plan[g[0]]:6.1f} s (specs: T_c {1e3 * tc:.2f} ms, T_u {1e3 * tu:.2f} ms)", flush=True)
    if _DRY.value:
        return
    os.makedirs(_OUT.value, exist_ok=True)
    cli.write_config(_OUT.value, _CONFIG.value)  # the resolved config (each run also keeps its own)
    rows, failures = [], []
    min_grad = 1 if _QUICK.value else v.min_gradients
    min_upd = 1 if _QUICK.value else v.min_updates
    for g in grid:
        duration = plan[g[0]]
        res = None
        for attempt in range(2):
            t0 = time.monotonic()
            try:
                res = run_config(g, os.path.join(_OUT.value, "runs", g[0]), duration_s=duration, warmup_s=warmup,
                                 overrides=overrides, timeout_s=v.run_timeout_s)
            except RuntimeError as e:  # one failed configuration does not end the grid; it is reported
                print(f"{g[0]}: FAILED: {e}", flush=True)
                failures.append({"name": g[0], "error": str(e)})
                break
            m = res["measured"]
            short = max(min_grad / max(m["gradients"], 1), min_upd / max(m["updates"], 1))
            print(f"{g[0]}: {m['gradients']} gradients, {m['updates']} updates after the warm-up in {duration:.1f} s "
                  f"(wall {time.monotonic() - t0:.0f} s), T_u/T_c {m['t_update_s'] / m['t_compute_s']:.3g}; "
                  f"from timings: {json.dumps(res['errors_from_timings'])}", flush=True)
            if short <= 1 or attempt == 1 or duration >= v.max_duration_s:
                break
            duration = min(v.max_duration_s, warmup + 1.3 * short * (duration - warmup) + 1.0)
            print(f"{g[0]}: too short, again for {duration:.1f} s", flush=True)
        if res is not None:
            rows.append(dict(name=g[0], hosts=g[1], learners_per_host=g[2], sub_batch=g[3], network_ms=g[4],
                             duration_s=duration, **res))
        with open(os.path.join(_OUT.value, "results.json"), "w") as fh:  # kept as it grows
            json.dump({"runs": rows, "failures": failures}, fh)
    if not rows:
        raise ConfigError("grid", [f["name"] for f in failures], f"runs that work: every run failed, the first "
                                                                 f"with {failures[0]['error']}")
    if v.specs == "loo" and len(rows) >= 2:  # the specs predictions, each from a fit to the other runs
        keep = {r["name"]: r for r in rows}
        with open(os.path.join(_OUT.value, "results.json"), "w") as fh:
            json.dump({"runs": rows, "failures": failures, "overrides": overrides}, fh)
        loo_rows, _ = reanalyse(_OUT.value, _CONFIG.value, machine, overrides, "loo")
        rows = [dict(keep[r["name"]], predicted_from_specs=r["predicted_from_specs"],
                     errors_from_specs=r["errors_from_specs"]) for r in loo_rows if r["name"] in keep]
    _write(_OUT.value, rows, failures, overrides)
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    cli.run(main)
