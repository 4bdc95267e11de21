r"""Measures and fits the runtime figures of this machine: one calibration per machine, a preset file.

  python experiments/calibrate_runtime.py --out=PRESET.json     # at most 10 minutes on a quiet 2-core machine
  python experiments/calibrate_runtime.py --config.calibration.fit_only=True --out=PRESET.json  # refit
  python experiments/calibrate_runtime.py --config.calibration.check_speed=True  # the lone steps again: still?
  python experiments/run_sprint.py --config=experiments/configs/sprint.py --machine_file=PRESET.json ...

The config (``experiments/configs/calibrate_runtime.py``, the default of ``--config``) is the SPRINT config
(network, data, optimizer) with ``config.calibration``, what is measured and fitted. The calibration set:
  1. one learner's gradient step (the runtime's own jitted gradient, wall time, under the runs' host
     allocator policy) at ``sub_batches``, every sample kept (the fit takes their mean), timed again after
     the design's runs (``rounds_after``: the mean then covers the machine's speed over the whole calibration;
     a change of more than 10% is reported), the cores that step keeps busy, and its input draw (host work
     per sample);
  2. all-reduces over 2 local processes (gloo) of four sizes around the network's ``4P`` bytes;
  3. runtime runs: with ``runs=design`` (the default) the runs a greedy D-optimal design picks from the
     figures' sensitivities within ``budget_s`` (``jaxsprint.calibration.design``: 1-2 hosts, 1-8 learners,
     sub-batch 8-128, network 0-100 ms, both updater placements, one run of every regime first, shorter runs
     where those would not fit), the runs of one process layout in a row in the same processes
     (``experiments.design_runs``); where the series take longer than planned, the runs left are dropped or
     shortened (``design.squeeze``) to keep ``budget_s`` and ``total_s``, the whole calibration's wall clock;
     the lone step at ``probe_sub_batch`` before the first series and after each (the machine's speed through
     the runs: each run's ``probe_s``, the design's ``probes``);
     ``runs=grid`` the one-host runs of ``learners`` x ``network_times`` at ``run_sub_batch`` in this process;
     ``runs_from`` a validate_runtime.py ``results.json`` instead (stored, so that ``fit_only`` refits the same).
``jaxsprint.calibration.host_fit.fit_all`` fits the compute, network, sharing and updater figures (and both cvs),
optionally with a prior on each (``prior_factor``, off by default: within that factor of
``host_fit.RUNTIME_START``), and with ``fix_undetermined`` holds every figure the runs do not determine at its
neutral value. The measurements
(and the design) go to ``measurements``, read back by ``fit_only``; the preset, every figure with its source and
relative standard error, the fit's summary and the command, to ``--out``: a ``--machine_file`` of ``run_sprint.py``,
``validate_runtime.py``, ``predict.py``, ``search.py`` and ``plan.py``.
"""
import math
import os
import sys
import time

_STARTED = time.monotonic()  # the calibration's wall clock (config.calibration.total_s) counts from here

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):  # before JAX starts
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402

from jaxsprint import cli  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
_CONFIG = cli.define_config_file("config", os.path.join(_HERE, "configs", "calibrate_runtime.py"),
                                 "The SPRINT config (network, data, optimizer) with config.calibration, what is "
                                 "measured and fitted (experiments/configs/calibrate_runtime.py).")
_OUT = flags.DEFINE_string("out", "runs/runtime-preset.json", "The fitted preset (JSON, a --machine_file).")

from jaxsprint.perf.presets import RUNTIME_CALIBRATION_FORMAT as FORMAT  # noqa: E402  (the measurement file)


def _numbers(name, values, kind, lo):
    from jaxsprint.errors import check, is_int

    out = []
    for v in cli.text_list(f"config.calibration.{name}", values):
        try:  # an integer field takes integers only (1.5 is not 1), a number field finite numbers
            x = None if isinstance(v, bool) or (kind is int and not (is_int(v) or isinstance(v, str))) else kind(v)
        except (TypeError, ValueError):
            x = None
        check(x is not None and math.isfinite(x) and x >= lo, f"config.calibration.{name}", v,
              f"a tuple (or comma-separated text) of finite {kind.__name__}s >= {lo}")
        out.append(x)
    check(bool(out), f"config.calibration.{name}", values, "a non-empty tuple")
    return out


def _read_json(field, path, what):
    """The JSON object in the file `path`, or ConfigError named `field` saying `what` it must be."""
    import json

    from jaxsprint.errors import ConfigError, check

    check(bool(path) and os.path.isfile(path), field, path, what)
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(field, path, f"{what} (it is not readable JSON: {e})") from None
    check(isinstance(data, dict), field, path, f"{what} (a JSON object)")
    return data


# A lone step whose trimmed mean exceeds its best round's median this much was timed on a busy machine.
_BUSY = 1.15
_RETRIES = 2  # times a disturbed lone-step timing is measured again
_DRIFT = 0.10  # lone steps after the runs this much slower or faster than before: the machine's speed moved
# The calibration's field behind each SPRINT field a measurement sets (the errors name the user's field).
_RUN_FIELDS = {"config.sprint.learners_per_host": "learners", "config.sprint.sub_batch": "run_sub_batch",
               "config.sprint.network_time_s": "network_times", "config.sprint.duration_s": "duration_s",
               "config.sprint.warmup_s": "warmup_s"}


def check_plan(config, sub_batches, learners, network_times):
    """Checks what measuring will start, before anything is measured or written: the planned time (at most
    ``runtime.bounds.MAX_SECONDS``), and the SPRINT config of the largest runtime run and of the lone gradient
    step at the largest sub-batch as ``runtime.validate_config`` checks them (this host's bounds included).

    Raises:
      ConfigError: naming the config field (``config.calibration.<field>`` for what the calibration sets).
    """
    import copy

    import jax

    from jaxsprint import runtime
    from jaxsprint.errors import ConfigError, check, is_int, is_real
    from jaxsprint.runtime.bounds import MAX_SECONDS

    k = config.calibration
    check(is_int(k.run_sub_batch) and k.run_sub_batch >= 1, "config.calibration.run_sub_batch", k.run_sub_batch,
          "an integer >= 1")
    check(is_real(k.warmup_s) and k.warmup_s >= 0, "config.calibration.warmup_s", k.warmup_s, "a finite number >= 0")
    check(is_real(k.duration_s) and k.duration_s > k.warmup_s, "config.calibration.duration_s", k.duration_s,
          f"a finite number of seconds longer than config.calibration.warmup_s={k.warmup_s}")
    check(is_real(k.step_time_s) and 0 < k.step_time_s <= MAX_SECONDS, "config.calibration.step_time_s",
          k.step_time_s, f"a number of seconds in (0, {MAX_SECONDS:g}]")
    check(is_int(k.rounds) and k.rounds >= 1, "config.calibration.rounds", k.rounds, "an integer >= 1")
    check(is_int(k.rounds_after) and 0 <= k.rounds_after <= 10, "config.calibration.rounds_after", k.rounds_after,
          "an integer in [0, 10]")
    # the timing rounds, the cores measurement, the rounds after the runs
    steps_s = (2 * k.rounds + k.rounds_after) * len(sub_batches) * k.step_time_s
    check(steps_s <= MAX_SECONDS, "config.calibration.rounds", k.rounds,
          f"a count for which the gradient-step timing ({len(sub_batches)} sub-batches x step_time_s="
          f"{k.step_time_s} s, twice, and rounds_after={k.rounds_after} rounds more) takes at most {MAX_SECONDS:g} s")
    check(len(learners) * len(network_times) * k.duration_s <= MAX_SECONDS, "config.calibration.duration_s",
          k.duration_s, f"a length for which the {len(learners) * len(network_times)} runtime runs take at most "
                        f"{MAX_SECONDS:g} s")
    check(k.runs in ("design", "grid"), "config.calibration.runs", k.runs, "design or grid")
    check(isinstance(k.fix_undetermined, bool), "config.calibration.fix_undetermined", k.fix_undetermined,
          "True or False")
    if k.runs == "design":
        for name, lo in (("budget_s", 1.0), ("total_s", 1.0), ("fit_s", 0.0), ("run_max_duration_s", 1.0),
                         ("run_startup_s", 0.0), ("run_segment_s", 0.0), ("run_compile_s", 0.0),
                         ("run_timeout_s", 1.0)):
            v = k[name]
            check(is_real(v) and lo <= v <= MAX_SECONDS, f"config.calibration.{name}", v,
                  f"a number of seconds in [{lo:g}, {MAX_SECONDS:g}]")
        check(k.run_max_duration_s > k.warmup_s, "config.calibration.run_max_duration_s", k.run_max_duration_s,
              f"longer than config.calibration.warmup_s={k.warmup_s}")
        check(is_real(k.run_min_measure_s) and 0 <= k.run_min_measure_s <= k.run_max_duration_s - k.warmup_s,
              "config.calibration.run_min_measure_s", k.run_min_measure_s,
              f"a number of seconds in [0, run_max_duration_s - warmup_s = {k.run_max_duration_s - k.warmup_s:g}]")
        check(k.run_timeout_s > k.run_max_duration_s + k.run_startup_s, "config.calibration.run_timeout_s",
              k.run_timeout_s, "longer than config.calibration.run_max_duration_s + run_startup_s")
        check(is_real(k.run_scale_min) and 0.1 <= k.run_scale_min <= 1, "config.calibration.run_scale_min",
              k.run_scale_min, "a share in [0.1, 1]")
        check(is_real(k.run_scale_floor) and 0.1 <= k.run_scale_floor <= k.run_scale_min,
              "config.calibration.run_scale_floor", k.run_scale_floor,
              f"a share in [0.1, run_scale_min = {k.run_scale_min:g}]")
        for name in ("run_min_gradients", "run_min_updates"):
            check(is_int(k[name]) and 1 <= k[name] <= 10**7, f"config.calibration.{name}", k[name],
                  "an integer in [1, 10000000]")
        check(is_int(k.probe_sub_batch) and (k.probe_sub_batch == 0 or k.probe_sub_batch in sub_batches),
              "config.calibration.probe_sub_batch", k.probe_sub_batch,
              f"0 (no probes) or one of config.calibration.sub_batches {tuple(sub_batches)}")
    probes = [(1, max(sub_batches), 0.0, "sub_batches")]  # the lone step
    if learners:  # the grid's largest run (its fields are checked whichever runs are measured)
        probes.append((max(learners), k.run_sub_batch, max(network_times), None))
    if learners and k.runs == "design":  # the design's largest run (8 learners, sub-batch 128, 100 ms)
        probes.append((8, 128, 0.1, None))
    for n, b, nt, field in probes:
        c = copy.deepcopy(config)
        with c.unlocked():
            s = c.sprint
            s.learners_per_host, s.sub_batch, s.network_time_s = int(n), int(b), float(nt)
            s.duration_s, s.warmup_s = float(k.duration_s), float(k.warmup_s)
            s.num_updates, s.num_epochs, s.checkpoint, s.eval_every_updates = 0, 0.0, False, 0
        try:
            runtime.validate_config(c, len(jax.local_devices()))
        except ConfigError as e:
            name = field if e.field == "config.sprint.sub_batch" and field else _RUN_FIELDS.get(e.field)
            if name is None:
                raise
            raise ConfigError(f"config.calibration.{name}", getattr(k, name), f"{e.allowed} (as {e.field} of "
                                                                              "the measurement)") from None


def runs_from(path):
    """The runtime-run records of a validate_runtime.py ``results.json`` (one per run, as :func:`measure` makes)."""
    from experiments import runtime_runs
    from jaxsprint.errors import ConfigError, check

    data = _read_json("config.calibration.runs_from", path, "a results.json of experiments/validate_runtime.py")
    runs = data.get("runs")
    check(isinstance(runs, list) and len(runs) > 0, "config.calibration.runs_from", path,
          "a results.json of experiments/validate_runtime.py with at least one run")
    out = []
    for r in runs:
        m = r.get("measured") if isinstance(r, dict) else None
        check(isinstance(m, dict) and all(k in m for k in runtime_runs.RECORD)
              and all(k in r for k in ("name", "learners_per_host", "hosts", "sub_batch")),
              "config.calibration.runs_from", path, "runs with a name, learners_per_host, hosts, sub_batch and "
              "measured cycle statistics (validate_runtime.py's results.json)")
        try:
            out.append(dict(label=r["name"], learners_per_host=int(r["learners_per_host"]), hosts=int(r["hosts"]),
                            sub_batch=int(r["sub_batch"]), updater_device=str(r.get("updater_device") or "own"),
                            **runtime_runs.record(m)))
        except (TypeError, ValueError):
            raise ConfigError("config.calibration.runs_from", path, "runs whose learners_per_host, hosts and "
                              "sub_batch are integers (validate_runtime.py's results.json)") from None
    return out


def check_speed(config, meas_path, log=print):
    """Times the lone steps of a calibration's measurement file again, as it timed them, and prints how far this
    machine's speed has moved since: a preset predicts from specs at the speed it was calibrated at
    (docs/calibration.md). Writes nothing; returns the median change over the sub-batches."""
    import statistics

    from jaxsprint.calibration import measurements, timing
    from jaxsprint.errors import check, is_int, is_real
    from jaxsprint.runtime.bounds import MAX_SECONDS

    k = config.calibration
    check(is_real(k.step_time_s) and 0 < k.step_time_s <= MAX_SECONDS, "config.calibration.step_time_s",
          k.step_time_s, f"a number of seconds in (0, {MAX_SECONDS:g}]")
    check(is_int(k.rounds_after) and 0 <= k.rounds_after <= 10, "config.calibration.rounds_after", k.rounds_after,
          "an integer in [0, 10] (the check's rounds; 0: one)")
    what = f"a measurement file of this script (format {FORMAT!r}) with its lone steps, to check the speed against"
    data = _read_json("config.calibration.measurements", meas_path, what)
    steps = data.get("measurements", {}).get("gradient_steps") if isinstance(data.get("measurements"), dict) else None
    check(data.get("format") == FORMAT and isinstance(steps, list) and len(steps) > 0
          and all(isinstance(g, dict) and is_int(g.get("sub_batch")) and g["sub_batch"] >= 1
                  and is_real(g.get("measured_s")) and g["measured_s"] > 0 for g in steps),
          "config.calibration.measurements", meas_path, what)
    then = {int(g["sub_batch"]): measurements.gradient_step_seconds(g) for g in steps}  # both timings' samples
    batches = sorted(then)
    now = timing.measure_gradient_steps(config, batches, rounds=max(1, int(k.rounds_after)),
                                        min_time_s=k.step_time_s)
    changes = []
    log(f"lone step: sub-batch, at the calibration ({meas_path}), now, change")
    for b, (t, samples) in zip(batches, now):
        cur = measurements.gradient_step_seconds(dict(measured_s=t, samples=samples))
        changes.append(cur / then[b] - 1.0)
        log(f"  b{b:<4d} {1e3 * then[b]:9.3f} ms {1e3 * cur:9.3f} ms {100 * changes[-1]:+7.1f}%")
    med = statistics.median(changes)
    log(f"speed: the lone steps take {100 * med:+.1f}% (median) as long as at the calibration")
    if abs(med) > _DRIFT:
        log(f"WARNING: this machine's speed has moved by more than {100 * _DRIFT:.0f}% since the calibration: its "
            "predictions from specs carry the change; calibrate again (experiments/calibrate_runtime.py)")
    return med


def measure(config, sub_batches, learners, network_times, log=print, runs=None):
    """The calibration set as JSON-able records (module docstring)."""
    k = config.calibration
    import copy
    import shutil
    import tempfile

    from experiments import design_runs, runtime_runs
    from jaxsprint import runtime
    from jaxsprint.calibration import measurements, timing
    from jaxsprint.perf.networks import BYTES_PER_VALUE
    from jaxsprint.runtime import events
    from ml_collections import config_flags

    def lone_steps(batches, rounds=k.rounds):
        steps = timing.measure_gradient_steps(config, batches, rounds=rounds, min_time_s=k.step_time_s, log=log)
        return [dict(sub_batch=b, measured_s=t, mean_s=float(sum(s) / len(s)), samples=s)
                for b, (t, s) in zip(batches, steps)]

    def disturbance(g):  # the fit takes the (trimmed) mean: a burst of other work during the timing moves it
        return measurements.gradient_step_seconds(g) / g["measured_s"]

    gradient_steps = lone_steps(sub_batches)
    # The wall clock the runs must end by: total_s, less the lone steps' rounds after them and the fit.
    after_s = (time.monotonic() - _STARTED) * k.rounds_after / k.rounds
    deadline = _STARTED + k.total_s - after_s - k.fit_s
    for _ in range(_RETRIES):  # a disturbed timing is measured again; the quieter of the two is kept
        busy = [g["sub_batch"] for g in gradient_steps if disturbance(g) > _BUSY]
        if not busy:
            break
        log(f"the lone steps at sub-batch {busy} took on average more than {_BUSY:g} x their best round's median "
            "(other work on this machine): measuring them again")
        again = {g["sub_batch"]: g for g in lone_steps(busy)}
        gradient_steps = [min(g, again.get(g["sub_batch"], g), key=disturbance) for g in gradient_steps]
    cores = timing.measure_gradient_cores(config, sub_batches, min_time_s=k.step_time_s)
    step_cores = [dict(sub_batch=b, cores=c) for b, c in zip(sub_batches, cores)]
    draws = timing.measure_input_draws(config, sub_batches, rounds=k.rounds)
    input_draws = [dict(sub_batch=b, samples=s) for b, s in zip(sub_batches, draws)]
    log("lone step: " + ", ".join(f"b{g['sub_batch']} {1e3 * g['mean_s']:.2f} ms (median of the best round "
                                  f"{1e3 * g['measured_s']:.2f}), {c['cores']:.2f} cores"
                                  for g, c in zip(gradient_steps, step_cores)))
    log("input draw: " + ", ".join(f"b{d['sub_batch']} {1e3 * sum(d['samples']) / len(d['samples']):.3f} ms"
                                   for d in input_draws))
    busy = [g["sub_batch"] for g in gradient_steps if disturbance(g) > _BUSY]
    if busy:
        log(f"WARNING: the lone steps at sub-batch {busy} took on average more than {_BUSY:g} x their best round's "
            f"median, {_RETRIES + 1} times: other work on this machine disturbed the timing; a calibration is only "
            "as good as its quietest minutes, so measure again when the machine is quiet")
    allreduces = []
    if k.allreduce:
        p4 = int(BYTES_PER_VALUE * float(timing.runtime_network(config).total_params))
        for a in timing.measure_allreduce(2, [max(4, p4 // 16), max(4, p4 // 4), p4, 4 * p4], reps=20, rounds=3):
            allreduces.append(dict(bytes=a.message_bytes, ranks=a.ranks, measured_s=a.measured_s))
    out = dict(gradient_steps=gradient_steps, step_cores=step_cores, input_draws=input_draws, allreduces=allreduces)
    if runs is not None:  # given (calibration.runs_from): none measured here
        runs, learners = list(runs), []
    elif k.runs == "design":
        overrides = [a for a in sys.argv[1:] if a.startswith("--config.") and not a.startswith("--config.calibration.")]
        config_file = config_flags.get_config_filename(flags.FLAGS["config"])
        probe = (timing.lone_step_probe(config, k.probe_sub_batch, min_time_s=k.step_time_s)
                 if k.probe_sub_batch else None)
        runs, chosen = design_runs.measure(config, out, config_file=config_file, overrides=overrides, log=log,
                                           deadline=deadline, probe=probe)
        if k.rounds_after:  # the machine's speed may have moved during the runs: the fit takes both timings
            after = lone_steps(sub_batches, k.rounds_after)
            out["gradient_steps"] = timing.merge_lone_steps(gradient_steps, after)
            drift = [g["drift"] for g in out["gradient_steps"]]
            log("lone step after the runs: " + ", ".join(f"b{g['sub_batch']} {1e3 * g['after_s']:.2f} ms "
                                                          f"({100 * g['drift']:+.0f}%)" for g in out["gradient_steps"]))
            if max(abs(d) for d in drift) > _DRIFT:
                log(f"WARNING: the lone steps took {100 * min(drift):+.0f}% to {100 * max(drift):+.0f}% as long "
                    "after the runs as before them: this machine's speed changed during the calibration (other "
                    "work on it); the fit takes both, but a calibration on a quiet machine repeats itself better")
        return dict(out, runs=runs, design=chosen)
    else:
        runs = []
    for n in learners:
        for nt in network_times:
            c = copy.deepcopy(config)
            with c.unlocked():
                c.sprint.learners_per_host, c.sprint.sub_batch = int(n), int(k.run_sub_batch)
                c.sprint.network_time_s, c.sprint.duration_s = float(nt), float(k.duration_s)
                c.sprint.num_updates, c.sprint.num_epochs = 0, 0.0
                c.sprint.warmup_s, c.sprint.checkpoint, c.sprint.eval_every_updates = float(k.warmup_s), False, 0
            workdir = tempfile.mkdtemp(prefix="jaxsprint-calibrate-runtime-")
            try:
                st = events.statistics(runtime.run(c, workdir).events)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            rec = dict(learners_per_host=int(n), hosts=1, sub_batch=int(k.run_sub_batch), network_time_s=float(nt),
                       **{k: st[k] for k in ("t_compute_s", "t_compute_cv", "t_update_s", "t_update_cv",
                                             "images_per_s", "gradients", "updates", "mean_staleness")},
                       **{k: (st[k] if math.isfinite(st[k]) else None) for k in runtime_runs.SPLIT})
            runs.append(rec)
            log(f"run: {n} learners, network {nt} s: T_c {1e3 * rec['t_compute_s']:.2f} ms (cv "
                f"{rec['t_compute_cv']:.2f}), T_u {1e3 * rec['t_update_s']:.2f} ms (cv {rec['t_update_cv']:.2f}), "
                f"{rec['gradients']} gradients")
    return dict(out, runs=runs)




def fit(config, measurements):
    """The :class:`~jaxsprint.calibration.host_fit.RuntimeFit` of stored measurements, from cpu_runtime."""
    from experiments import design_runs
    from jaxsprint.calibration import host_fit

    net, steps, ars, cores, draws, start, host = design_runs.start(config, measurements)
    runs = [host_fit.RuntimeRun.from_record(r) for r in measurements["runs"]]
    k = config.calibration
    fixed = {f: host_fit.FIXED[f] for f in (host_fit.FIXED if not k.fix_undetermined else host_fit.ALWAYS_FIXED)}
    return host_fit.fit_all(start, host, net, steps=steps, allreduces=ars, runs=runs, step_cores=cores,
                            input_draws=draws, fixed=fixed, fix_undetermined=bool(k.fix_undetermined),
                            prior_factor=float(k.prior_factor) or None)


def save_preset(path, result, command, measurements_path):
    """Writes the fitted machine and host as a preset (module docstring): fitted figures to 4 significant digits,
    each with its source (the command and the data; fixed ones their reason; the rest the start preset's)."""
    import math

    from jaxsprint.calibration import host, host_fit
    from jaxsprint.perf import machines, presets

    fitted = {f: float(f"{v:.4g}") for f, v in result.fitted.items()}
    cvs = ("learner_cv", "updater_cv")
    fixed = {f: (d["value"], d["reason"]) for f, d in result.stages.get("fixed", {}).items()}

    def source(f, old):
        if f in fixed:
            return fixed[f][1]
        if f not in fitted:
            return old
        if f in cvs:
            return f"median over the runs of {measurements_path}, by `{command}`"
        se = result.rel_std_error.get(f, math.inf)
        if f == host_fit.INPUT_FIELD:
            return (f"measured by `{command}`: the slope of a learner's input draw over the sub-batches of "
                    f"{measurements_path} (relative standard error {se:.2g})")
        return f"fitted by `{command}` on {measurements_path} (relative standard error {se:.2g})"

    m = machines.with_figures(result.machine, **{f: v for f, v in fitted.items() if f in machines.FIELDS})
    m = m.replace(sources=tuple((f, source(f, s)) for f, s in m.sources))
    h = host.with_figures(result.host, **{f: v for f, v in fitted.items() if f in host.FIELDS})
    h = h.replace(sources=tuple((f, source(f, s)) for f, s in h.sources))
    rse = {f: result.rel_std_error.get(f, math.inf) for f in fitted if f not in cvs}
    presets.save_preset(path, m, host=host.host_json(h), command=command, measurements=measurements_path,
                        fitted=sorted(fitted), fixed={f: v for f, (v, _) in fixed.items()},
                        rel_std_error={f: (v if math.isfinite(v) else None) for f, v in rse.items()},
                        fit=result.summary())


def main(argv):
    from experiments import studies
    from jaxsprint.errors import ConfigError, check, is_real
    from jaxsprint.calibration import model_fit

    if len(argv) > 1:
        raise ConfigError("arguments", argv[1:], "none besides flags")
    config = _CONFIG.value
    k = config.calibration
    out, meas_path = _OUT.value, k.measurements
    from jaxsprint.train import cpu

    # The runs' allocator policy for the lone steps too, before JAX starts its threads: with glibc's defaults a
    # large step's buffers are fresh pages every time and its timing jumps (docs/calibration.md).
    print(cpu.configure_host_memory(config.cpu_kernels), flush=True)
    if k.check_speed:  # measures the lone steps only, writes nothing
        check(not k.fit_only and not k.runs_from, "config.calibration.check_speed", True,
              "False with fit_only or runs_from (it times this machine against stored measurements)")
        check_speed(config, meas_path)
        return
    check(is_real(k.prior_factor) and (k.prior_factor == 0 or 1 < k.prior_factor <= 1e6),
          "config.calibration.prior_factor", k.prior_factor, "0 (no prior) or a factor in (1, 1e6]")
    cli.check_output_file("--out", out)
    given_runs = runs_from(k.runs_from) if k.runs_from else None  # read and checked before anything
    if not k.fit_only or given_runs is not None:  # the measurements are written
        cli.check_output_file("config.calibration.measurements", meas_path)
    if k.fit_only:
        what = f"a file written by this script (format {FORMAT!r}) to refit with config.calibration.fit_only"
        data = _read_json("config.calibration.measurements", meas_path, what)
        check(data.get("format") == FORMAT and "measurements" in data, "config.calibration.measurements", meas_path,
              what)
        meas = data["measurements"]
        if given_runs is not None:
            meas = dict(meas, runs=given_runs)
            studies.save_json(meas_path, dict(format=FORMAT, measurements=meas))  # a later fit_only: the same set
    else:
        sub_batches = _numbers("sub_batches", k.sub_batches, int, 1)
        learners = _numbers("learners", k.learners, int, 1)
        network_times = _numbers("network_times", k.network_times, float, 0.0)
        check_plan(config, sub_batches, [] if given_runs is not None else learners, network_times)
        k.sub_batches, k.learners, k.network_times = tuple(sub_batches), tuple(learners), tuple(network_times)
        meas = measure(config, sub_batches, learners, network_times, runs=given_runs)
        studies.save_json(meas_path, dict(format=FORMAT, measurements=meas))  # the data first, whatever the fit does
    result = fit(config, meas)
    save_preset(out, result, " ".join(["python experiments/calibrate_runtime.py"] + sys.argv[1:]), meas_path)
    print(f"stage errors: compute {result.stages.get('compute', {}).get('steps')}, "
          f"network {result.stages.get('network', {}).get('allreduces')}")
    print(f"runs: T_c {model_fit.error_stats(result.compute_errors)}, "
          f"T_u {model_fit.error_stats(result.update_errors)}")
    for f, v in result.fitted.items():
        se = result.rel_std_error.get(f)
        print(f"  {f:36s} {v:12.4g}  " + (f"relative standard error {se:.3g}" if se is not None else "(median)")
              + ("  AT A BOUND" if f in result.at_bound else ""))
    print(f"preset: {out}")


if __name__ == "__main__":
    cli.run(main)
