r"""The SPRINT model judged against the real runtime over a grid of configurations.

  python experiments/validate_runtime.py --config=experiments/configs/validate_runtime.py \
      --out=runs/validate_runtime                                  # the grid: about 30-40 minutes
  python experiments/validate_runtime.py --out=runs/validate_runtime --dry_run  # the plan and its time only
  python experiments/validate_runtime.py --out=/tmp/vr_quick --quick            # 2 tiny runs, about a minute
  python experiments/validate_runtime.py --out=runs/validate_runtime --reanalyse  # saved runs, current model
  python experiments/validate_runtime.py --config.validation.grid=random --config.validation.machine_file=P.json \
      --out=runs/held_out          # 12 configurations drawn at random (held out from P's calibration), ~17 min
  python experiments/validate_runtime.py ...the same... --config.validation.repeat_of=runs/held_out \
      --out=runs/held_out_again    # the same draw again, each run also against its earlier measurement

The config (``experiments/configs/validate_runtime.py``) is the SPRINT config of every run with
``config.validation``: the grid and the predictions. Each configuration (hosts x learners per host, sub-batch,
emulated network time; T_u/T_c about 0.1 to 10) is one run of experiments/run_sprint.py --json (two processes on
loopback for two hosts, jax.distributed with gloo; one fake CPU device per learner and, with
``updater_device=own``, one more for the updater), long enough for ``min_gradients`` gradients and
``min_updates`` updates after the warm-up by the ``machine`` preset's estimate (a run that falls short is
repeated once, longer). Writes to --out: ``runs/<name>/`` (workdir, stdout, stderr), ``results.json``,
``results.csv``, ``summary.md`` (errors per configuration, medians and 90th percentiles from timings and from
specs, per placement with ``grid=random``, and the learner cycle from specs over all runs), ``errors.png`` and
``config.json``. Quiet machine only.

The specs prediction (``specs``): ``loo`` (the default) predicts each run with the preset refitted to the OTHER
runs of the grid (:func:`jaxsprint.calibration.host_fit.cross_validate`); ``preset`` (the default of
``grid=random``: ``jaxsprint.calibration.grids.draw``) uses the preset as it is. ``--reanalyse`` re-reads every
saved ``runs/<name>/events.npz`` under --out and recomputes both predictions with the current model and preset.
``repeat_of`` (an earlier --out of the same grid) adds the source ``repeat``: each run against the earlier
measurement of its configuration. The ``--config.<field>`` overrides outside ``config.validation`` are passed to
every run (not the fields a grid entry sets), and every run's config is checked before the first starts.
"""
import copy
import csv
import json
import math
import os
import shutil
import sys
import tempfile
import time

os.environ["JAX_PLATFORMS"] = "cpu"  # every run is on XLA:CPU (run_config), so are this process's checks and costs
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from experiments import runtime_runs  # noqa: E402
from experiments.runtime_runs import plan_duration  # noqa: E402
from jaxsprint import cli  # noqa: E402
from jaxsprint.calibration import grids  # noqa: E402
from jaxsprint.errors import ConfigError, check, is_int  # noqa: E402

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
_GRIDS, _SPECS_KINDS, _UPDATER_DEVICES = ("validation", "calibration", "random"), ("loo", "preset"), grids.PLACEMENTS

QUICK_OVERRIDES = ("--config.model=tiny", "--config.image_size=8")
QUICK_DURATION_S, QUICK_WARMUP_S = 3.0, 0.5
_OWN_UPDATER = "--config.sprint.updater_device=own"
_SET_BY_GRID = runtime_runs.SET_BY_ENTRY
_STARTUP_S = 40.0  # imports, data, compilation and the specs cost table of one run (2 cores, rough)
# Where each row's errors come from: the model from the run's timings, from specs, and the same configuration
# measured by an earlier draw (config.validation.repeat_of: the machine's own repeatability, the floor).
_SOURCES = ("timings", "specs", "repeat")
_METRICS = (("epoch time", "epoch_time_rel_error"), ("mean mini-batch", "mean_minibatch_rel_error"),
            ("mean staleness", "mean_staleness_rel_error"), ("TV mini-batch", "minibatch_tv"),
            ("TV staleness", "staleness_tv"), ("TV mini-batch floor", "minibatch_tv_floor"),
            ("TV staleness floor", "staleness_tv_floor"),
            ("TV mini-batch, two-moment reference", "minibatch_tv_two_moment"))


def _config_overrides() -> list[str]:
    """The ``--config.*`` flags of this command line, passed on to every run (not ``config.validation``'s)."""
    return [a for a in sys.argv[1:] if a.startswith("--config.") and not a.startswith("--config.validation.")]


def _estimates(config, grid, machine) -> dict[str, tuple[float, float]]:
    """Specs estimates of ``(T_c, T_u)`` per configuration (the plan of the durations)."""
    from jaxsprint.calibration import compare

    times = compare.spec_cycles(compare.network_cost(config), *machine, grid)
    return {e.name: t for e, t in zip(grid, times)}


def run_config(entry: grids.Entry, workdir: str, *, duration_s: float, warmup_s: float, overrides: list[str],
               timeout_s: float, compile_cache_dir: str | None = None) -> dict:
    """:func:`experiments.runtime_runs.run_entry` with this command's config file and machine preset."""
    v = _CONFIG.value.validation
    return runtime_runs.run_entry(entry, workdir, config_file=config_flags.get_config_filename(flags.FLAGS["config"]),
                                  overrides=overrides, machine_args=[f"--machine_file={v.machine_file}" if
                                                                     v.machine_file else f"--machine={v.machine}"],
                                  duration_s=duration_s, warmup_s=warmup_s, timeout_s=timeout_s,
                                  compile_cache_dir=compile_cache_dir)


def _sources(rows: list[dict]) -> tuple[str, ...]:
    """The sources of :data:`_SOURCES` some row has errors from."""
    return tuple(s for s in _SOURCES if any(r.get(f"errors_from_{s}") for r in rows))


def add_repeat(rows: list[dict], earlier: dict[str, dict]) -> None:
    """Each row whose configuration ``earlier`` (name -> measured statistics) holds gets ``errors_from_repeat``:
    the earlier measurement as if it were the prediction (:func:`jaxsprint.calibration.compare.compare`)."""
    from jaxsprint.calibration import compare

    for r in rows:
        if r["name"] in earlier:
            r["errors_from_repeat"] = compare.compare(r["measured"], earlier[r["name"]])


def read_repeat(path: str, names: list[str] | None) -> dict[str, dict]:
    """The measured statistics by run name of an earlier --out of this grid (``config.validation.repeat_of``).

    Raises:
      ConfigError: no readable results.json there, or none of ``names`` (None: any) in it.
    """
    field, what = "config.validation.repeat_of", "an earlier --out of the same draw (its results.json with runs)"
    try:
        with open(os.path.join(path, "results.json")) as fh:
            runs = json.load(fh)["runs"]
        earlier = {str(r["name"]): r["measured"] for r in runs}
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(field, path, what) from None
    if names is not None:
        check(any(n in earlier for n in names), field, path,
              f"{what}: one with runs of these names ({', '.join(names)})")
    return earlier


def summarize(rows: list[dict]) -> dict:
    """Median and 90th percentile of each absolute error over the runs, from timings, from specs and against the
    repeat where there is one (``n``: the runs counted)."""
    from jaxsprint.calibration import compare

    out = {}
    for source in _sources(rows):
        for key, stats in compare.summarize_errors([r.get(f"errors_from_{source}") for r in rows]).items():
            out[f"{source}.{key}"] = stats
    return out


def summarize_by_placement(rows: list[dict]) -> dict | None:
    """:func:`summarize` of the runs of each updater placement (``shared``, ``own``), where the rows hold both
    (a random grid's); else None."""
    where = [p for p in grids.PLACEMENTS if any(r.get("updater_device") == p for r in rows)]
    return {p: summarize([r for r in rows if r.get("updater_device") == p]) for p in where} if len(where) > 1 \
        else None


def _csv_rows(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        m = r["measured"]
        row = dict(name=r["name"], hosts=r["hosts"], learners_per_host=r["learners_per_host"], sub_batch=r["sub_batch"],
                   network_ms=r["network_ms"], updater_device=r.get("updater_device"), duration_s=r["duration_s"], t_compute_ms=1e3 * m["t_compute_s"],
                   t_compute_cv=m["t_compute_cv"], t_update_ms=1e3 * m["t_update_s"], t_update_cv=m["t_update_cv"],
                   ratio_tu_tc=m["t_update_s"] / m["t_compute_s"], gradients=m["gradients"], updates=m["updates"],
                   in_flight=m["in_flight"], images_per_s=m["images_per_s"], eval_accuracy=r.get("eval_accuracy"))
        for source in _sources(rows):
            errs = r.get(f"errors_from_{source}") or {}
            for _, key in _METRICS:
                row[f"{source}_{key}"] = errs.get(key)
        out.append(row)
    return out


def _pct(v) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{100 * v:+.1f}%"


def _tv(v) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.3f}"


def _stat_cells(summary: dict, source: str, stat: str) -> str:
    cells = []
    for _, key in _METRICS:
        v = summary[f"{source}.{key}"][stat]
        cells.append(_tv(v) if "_tv" in key else ("-" if not math.isfinite(v) else f"{100 * v:.1f}%"))
    return " | ".join(cells)


def markdown(rows: list[dict], summary: dict, by_placement: dict | None = None, shift: float = math.nan) -> str:
    """The per-configuration table and the summary (medians, 90th percentiles) in markdown, the learner cycle's
    ``shift`` from specs (``compare.cycle_shift``) where finite, then the summary of each updater placement
    (`by_placement`, :func:`summarize_by_placement`) where given."""
    head = ("| config | T_c ms (cv) | T_u ms (cv) | T_u/T_c | grads | updates | source | epoch | mini-batch | "
            "staleness | TV mini-batch (floor; two-moment) | TV staleness (floor) |")
    lines = [head, "|" + "---|" * 12]
    for r, c in zip(rows, _csv_rows(rows)):
        for source in _sources(rows):
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
    for source in _sources(rows):
        for stat in ("median", "p90"):
            lines.append(f"| {source} | {stat} of the absolute values | {_stat_cells(summary, source, stat)} |")
    if math.isfinite(shift):
        lines += ["", f"From specs, the learner cycle over all runs: {_pct(shift)} (geometric mean of predicted over "
                      "measured; a change of the machine's speed since the calibration moves every run alike)."]
    if by_placement:
        lines += ["", "| updater placement (runs) | source | statistic | " + " | ".join(label for label, _ in _METRICS)
                  + " |", "|---|---|---|" + "---|" * len(_METRICS)]
        for where, part in by_placement.items():
            for source in _sources(rows):
                n = part[f"{source}.epoch_time_rel_error"]["n"]
                for stat in ("median", "p90"):
                    lines.append(f"| {where} ({n}) | {source} | {stat} of the absolute values | "
                                 f"{_stat_cells(part, source, stat)} |")
    coupled = [r for r in rows if r.get("count_coupling")]
    if coupled:  # events.count_coupling: what the model's independent learners would give as 1 and 1
        lines += ["", "| config | count slope / arrival rate | count variance: updater cycles | random windows | "
                      "ratio | learner compute lag-1 autocorrelation |", "|---|---|---|---|---|---|"]
        for r in coupled:
            c = r["count_coupling"]
            lines.append(f"| {r['name']} | {c['slope_ratio']:.2f} | {c['var_cycles']:.2f} | {c['var_random']:.2f} | "
                         f"{c['variance_ratio']:.2f} | {c.get('compute_lag1', math.nan):.2f} |")
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


def _placement(run_dir: str, row: dict, overrides: list[str]) -> str:
    """The updater placement of a saved run: its workdir's config.json, else its row of the old results.json,
    else the grid's overrides (``own`` with :data:`_OWN_UPDATER`, else the config's default, ``shared``)."""
    try:
        with open(os.path.join(run_dir, "config.json")) as fh:
            where = json.load(fh)["sprint"]["updater_device"]
        if where in grids.PLACEMENTS:
            return where
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return row.get("updater_device") or ("own" if _OWN_UPDATER in overrides else "shared")


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
    where = {n: _placement(os.path.join(runs_dir, n), before.get(n, {}), overrides) for n in names}
    machines = {n: machine for n in names}
    if specs == "loo" and len(names) >= 2:
        runs = [host_fit.RuntimeRun.from_record({**stats[n], "hosts": stats[n]["num_hosts"], "label": n,
                                                 "updater_device": where[n]}) for n in names]
        machines = dict(zip(names, host_fit.cross_validate(*machine, network, runs)))
    for name in names:
        try:
            m = stats[name]
            cfg = _override(base, [f"--config.sprint.learners_per_host={m['learners_per_host']}",
                                   f"--config.sprint.sub_batch={m['sub_batch']}",
                                   f"--config.sprint.network_time_s={m['network_time_s']}",
                                   f"--config.sprint.updater_device={where[name]}"])
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
                         updater_device=where[name],
                         duration_s=prev.get("duration_s", m["t_stop_s"]), **res))
    return rows, failures


def _write(out: str, rows: list[dict], failures: list[dict], overrides: list[str]) -> None:
    """results.json, results.csv, summary.md and errors.png of the rows; prints the summary."""
    from jaxsprint.calibration import compare

    summary, by_placement, (shift, _) = summarize(rows), summarize_by_placement(rows), compare.cycle_shift(rows)
    data = {"runs": rows, "failures": failures, "summary": summary, "overrides": overrides,
            "specs_learner_cycle_shift": shift if math.isfinite(shift) else None}
    if by_placement:
        data["summary_by_placement"] = by_placement
    with open(os.path.join(out, "results.json"), "w") as fh:
        json.dump(data, fh, indent=1)
    table = _csv_rows(rows)
    with open(os.path.join(out, "results.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    md = markdown(rows, summary, by_placement, shift)
    with open(os.path.join(out, "summary.md"), "w") as fh:
        fh.write(md + "\n")
    plot(os.path.join(out, "errors.png"), rows)
    print(md)
    for f in failures:
        print(f"FAILED {f['name']}: {f['error']}")
    print(f"wrote {out}/results.json, results.csv, summary.md, errors.png")


def check_runs(config, grid, *, quick: bool, warmup_s: float, duration_s: float) -> None:
    """Checks the SPRINT config of every run of `grid` (`run_config`'s settings and each entry's updater
    placement, at most `duration_s` long) as its process will (``runtime.validate_config`` with its devices), before any runs or anything is written.

    Raises:
      ConfigError: naming the first bad field.
    """
    from jaxsprint import runtime

    base = _override(config, list(QUICK_OVERRIDES)) if quick else config  # `config` has the command's overrides
    for _, _, lph, b, net_ms, where in grid:
        own = where == "own"
        c = copy.deepcopy(base)
        with c.unlocked():
            s = c.sprint
            s.learners_per_host, s.sub_batch, s.network_time_s = lph, b, net_ms / 1e3
            s.duration_s, s.num_updates, s.num_epochs, s.warmup_s = float(duration_s), 0, 0.0, float(warmup_s)
            s.checkpoint, s.eval_every_updates = False, 0
            s.updater_device = where
            if own:
                s.devices = lph
        runtime.validate_config(c, lph + 1 if own else lph)


def _grid(v, placement: str) -> tuple[list[grids.Entry], str]:
    """The entries this command runs, each with its updater placement (a fixed grid's: `placement`), and a
    line on what the random draw leaves out (``""`` for a fixed grid)."""
    if v.grid != "random":
        grid = grids.QUICK_GRID if _QUICK.value else grids.CALIBRATION_GRID if v.grid == "calibration" \
            else grids.VALIDATION_GRID
        return [g._replace(updater_device=placement) for g in grid], ""
    from jaxsprint.perf import machines

    shipped = os.path.join(machines.DATA_DIR, f"{v.machine}.json") if v.machine else None
    recorded = grids.preset_calibration_runs(v.machine_file or (shipped if shipped and os.path.isfile(shipped)
                                                                else None))
    exclude = list(grids.CALIBRATION_GRID) + list(recorded[1] if recorded else ())
    with cli.as_config_fields("config.validation."):
        grid = grids.draw(v.num_random, random_seed=v.random_seed, exclude=exclude)
    extra = len(set(recorded[1]) - {grids.key(g) for g in grids.CALIBRATION_GRID}) if recorded else 0
    what = (f"the {len(recorded[1])} runs of {recorded[0]} (the preset's calibration runs; {extra} of them not "
            "in the calibration grid)" if recorded else
            "none the preset records (it names no readable measurement file with runs)")
    return list(grid), (f"random grid: {len(grid)} configurations drawn with random_seed={v.random_seed}; "
                        f"excluded: the calibration grid ({len(grids.CALIBRATION_GRID)} runs) and {what}")


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
    for name, allowed in (("grid", _GRIDS), ("updater_device", _UPDATER_DEVICES)):
        check(v[name] in allowed, f"config.validation.{name}", v[name], f"one of {', '.join(allowed)}")
    check(v.specs is None or v.specs in _SPECS_KINDS, "config.validation.specs", v.specs,
          f"one of {', '.join(_SPECS_KINDS)} (unset: loo, preset with grid=random)")
    random = v.grid == "random"
    check(not (random and v.specs == "loo"), "config.validation.specs", v.specs,
          "preset with config.validation.grid=random (held out: the preset was fitted elsewhere; loo would refit "
          "it to the drawn runs)")
    v.specs = v.specs or ("preset" if random else "loo")  # resolved: config.json records it
    for name, lo in (("num_random", 1), ("random_seed", 0)):
        check(is_int(v[name]) and v[name] >= lo, f"config.validation.{name}", v[name], f"an integer >= {lo}")
    overrides = (list(QUICK_OVERRIDES) if _QUICK.value else []) + _config_overrides()
    set_by_grid = _SET_BY_GRID + (("config.sprint.updater_device", "config.sprint.devices") if random else ())
    for arg in _config_overrides():
        key = arg[len("--"):].partition("=")[0]
        check(key not in set_by_grid, key, arg.partition("=")[2],
              "not an override here: every run's grid entry and planned length set it (config.validation)")
    if not random and v.updater_device == "own" and _OWN_UPDATER not in overrides:
        overrides.append(_OWN_UPDATER)
    grid, note = _grid(v, "own" if _OWN_UPDATER in overrides else "shared")
    label = "quick" if _QUICK.value and not random else v.grid
    names = [g.name for g in grid]
    only = cli.text_list("config.validation.only", v.only)
    for n in only:
        check(n in names, "config.validation.only", n, f"names of the {label} grid: {', '.join(names)}")
    grid = [g for g in grid if not only or g.name in only]
    earlier = read_repeat(v.repeat_of, None if _REANALYSE.value else [g.name for g in grid]) if v.repeat_of else {}
    check_runs(_CONFIG.value, grid, quick=_QUICK.value, warmup_s=QUICK_WARMUP_S if _QUICK.value else v.warmup_s,
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
        add_repeat(rows, earlier)
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
        plan = {g.name: QUICK_DURATION_S for g in grid}
        est = {}
    else:
        warmup = v.warmup_s
        est = _estimates(_CONFIG.value, grid, machine)
        plan = {g.name: plan_duration(*est[g.name], g.hosts * g.learners_per_host, min_gradients=v.min_gradients,
                                    min_updates=v.min_updates, warmup_s=warmup, max_duration_s=v.max_duration_s)
                for g in grid}
    if note:
        print(note, flush=True)
    total = sum(plan.values()) + _STARTUP_S * len(grid)
    print(f"{len(grid)} runs, about {total / 60:.0f} minutes (run time {sum(plan.values()):.0f} s plus about "
          f"{_STARTUP_S:.0f} s start-up each; a run that falls short is repeated once, longer)", flush=True)
    for g in grid:
        tc, tu = est.get(g.name, (math.nan, math.nan))
        print(f"  {g.name:18s} hosts {g.hosts} x learners {g.learners_per_host}, sub-batch {g.sub_batch:3d}, "
              f"network {g.network_ms:3d} ms: {plan[g.name]:6.1f} s (specs: T_c {1e3 * tc:.2f} ms, T_u {1e3 * tu:.2f} ms)", flush=True)
    if _DRY.value:
        return
    os.makedirs(_OUT.value, exist_ok=True)
    cli.write_config(_OUT.value, _CONFIG.value)  # the resolved config (each run also keeps its own)
    rows, failures = [], []
    min_grad = 1 if _QUICK.value else v.min_gradients
    min_upd = 1 if _QUICK.value else v.min_updates
    cache = tempfile.mkdtemp(prefix="jaxsprint-validate-cache-")  # the runs' shared compilation cache
    try:
        for g in grid:
            duration = plan[g.name]
            res = None
            for attempt in range(2):
                t0 = time.monotonic()
                try:
                    res = run_config(g, os.path.join(_OUT.value, "runs", g.name), duration_s=duration, warmup_s=warmup,
                                     overrides=overrides, timeout_s=v.run_timeout_s,
                                     compile_cache_dir=cache)
                except RuntimeError as e:  # one failed configuration does not end the grid; it is reported
                    print(f"{g.name}: FAILED: {e}", flush=True)
                    failures.append({"name": g.name, "error": str(e)})
                    break
                m = res["measured"]
                short = max(min_grad / max(m["gradients"], 1), min_upd / max(m["updates"], 1))
                print(f"{g.name}: {m['gradients']} gradients, {m['updates']} updates after the warm-up in {duration:.1f} s "
                      f"(wall {time.monotonic() - t0:.0f} s), T_u/T_c {m['t_update_s'] / m['t_compute_s']:.3g}; "
                      f"from timings: {json.dumps(res['errors_from_timings'])}", flush=True)
                if short <= 1 or attempt == 1 or duration >= v.max_duration_s:
                    break
                duration = min(v.max_duration_s, warmup + 1.3 * short * (duration - warmup) + 1.0)
                print(f"{g.name}: too short, again for {duration:.1f} s", flush=True)
            if res is not None:
                rows.append(dict(name=g.name, hosts=g.hosts, learners_per_host=g.learners_per_host,
                                 sub_batch=g.sub_batch, network_ms=g.network_ms, updater_device=g.updater_device,
                                 duration_s=duration, **res))
            with open(os.path.join(_OUT.value, "results.json"), "w") as fh:  # kept as it grows
                json.dump({"runs": rows, "failures": failures}, fh)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
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
    add_repeat(rows, earlier)
    _write(_OUT.value, rows, failures, overrides)
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    cli.run(main)
