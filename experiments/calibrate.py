r"""Calibrate the "this machine" preset: measure train steps and all-reduces, fit, save.

    .venv/bin/python experiments/calibrate.py                  # ~3-4 minutes on 2 cores
    .venv/bin/python experiments/calibrate.py --measurements=runs/calibrate/this_machine.json \
        --out=runs/calibrate/refit.json                         # refit saved measurements (~30 s)
    .venv/bin/python experiments/predict.py --machine_file=runs/calibrate/this_machine.json \
        --network=resnet20 --gpus_per_node=2 --sub_batch=64
    .venv/bin/python experiments/search.py --machine_file=runs/calibrate/this_machine.json \
        --network=resnet20 --target_minibatch=256 --max_nodes=4

Measures (1) the train step of this project's own CIFAR ResNets (``jaxsprint.train``, momentum
SGD, the fast convolution and XLA options training uses on one CPU device, host memory retained as
in ``jaxsprint/hostmem.py``) at several batch sizes, as process CPU time with the process pinned to
one core and XLA:CPU's Eigen single-threaded (one learner per core, as the ``cpu`` preset models;
on one core CPU time equals wall time when nothing else runs, and is steadier when something does),
and (2) all-reduces of several sizes over 2-4 local JAX processes joined by
``jax.distributed`` (gloo, localhost ports only, bounded timeouts). It fits the compute
efficiencies on the steps not held out and ``network_latency_s``, ``network_bandwidth_bytes_per_s``
and ``updater_overhead_s`` on the all-reduces (:func:`jaxsprint.perf.calibrate.fit`), prints the
fitted figures with their standard errors and the held-out prediction errors, estimates the
compute-time jitter (cv) and saves the preset with its measurements to ``--out`` (default under
``runs/``, not in the package). Bad input exits with status 2 and one message naming the flag.
"""
from __future__ import annotations

import os

# One XLA:CPU thread for the step measurements, set before JAX starts (see the docstring).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
                           " intra_op_parallelism_threads=1").strip()

import datetime  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from jaxsprint.cli import parse_flags  # noqa: F401  (app.run below; in-process tests)

from jaxsprint import cpu, timing  # noqa: E402
from jaxsprint.errors import JaxsprintError  # noqa: E402
from jaxsprint.perf import calibrate, machines, networks  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "runs/calibrate/this_machine.json", "Where to save the fitted preset "
                    "(with its measurements).")
flags.DEFINE_string("measurements", None, "Refit the measurements saved in this preset file "
                    "instead of measuring.")
flags.DEFINE_string("base", "cpu", f"Preset the fit starts from: {', '.join(machines.PRESETS)}.")
flags.DEFINE_list("models", ["resnet8", "resnet20", "resnet32", "resnet56"], "This project's models to time "
                  "(jaxsprint.models names with a cost table in jaxsprint.perf.networks).")
flags.DEFINE_list("batches", ["4", "8", "16", "32", "64"], "Batch sizes of the step timings.")
flags.DEFINE_list("holdout_batches", ["8", "32"], "Batch sizes held out of the fit (predicted).")
flags.DEFINE_list("holdout_models", [], "Models held out of the fit (predicted).")
flags.DEFINE_enum("cpu_kernels", "auto", list(cpu.MODES), "CPU switch of the timed steps (config.cpu_kernels "
                  "of training; auto is what training runs on CPU, off is XLA's own convolution and BatchNorm).")
flags.DEFINE_integer("rounds", 4, "Interleaved timing rounds (each step's best round median is kept).")
flags.DEFINE_float("min_time_s", 0.2, "Time each step at least this long per round.")
flags.DEFINE_list("ranks", ["2", "3", "4"], "Process counts of the all-reduce timings (empty: skip).")
flags.DEFINE_list("allreduce_bytes", ["4096", "65536", "1048576", "4194304", "16777216"],
                  "Message sizes of the all-reduce timings, bytes per rank.")
flags.DEFINE_integer("allreduce_reps", 10, "All-reduces timed per size and round.")
flags.DEFINE_float("allreduce_timeout_s", 120.0, "Stop the all-reduce processes after this long.")
flags.DEFINE_list("fit_fields", ["efficiency_fwd", "efficiency_bwd_weight", "cache_miss_slowdown_weight_grad",
                                "half_efficiency_rows", "half_efficiency_batch", "per_layer_overhead_s",
                                "half_efficiency_depth", "norm_memory_efficiency"],
                  "Compute figures fitted to the step timings: by default the two pass efficiencies, "
                  "the weight-gradient cache slowdown (the --base preset's was fitted to XLA's own "
                  "filter gradient, which the fast convolution replaces), the saturation in batch x "
                  "pixels, in the batch itself and in the reduction depth, the per-layer overhead and "
                  "the BatchNorm memory efficiency (the last two since the native CPU kernels: their "
                  "shallow stem and their BatchNorm share differ from XLA's; see docs/perf-search.md).")
flags.DEFINE_integer("seed", 0, "Seed of the fit's random starts.")
flags.DEFINE_bool("one_core", True, "Time the steps with this process pinned to one CPU (one learner per "
                  "core, as the cpu preset models; without it XLA overlaps independent ops on other cores and "
                  "CPU time counts that work too).")
flags.DEFINE_bool("leave_one_model_out", True, "Also refit once per model with that model's steps held "
                  "out and report the errors of predicting them (a network the fit has not seen).")
flags.DEFINE_integer("starts", 6, "Starting points of each fit (the preset's values and random ones).")

_CIFAR_TABLES = {"resnet8": lambda: networks.resnet_cifar(1), "resnet20": lambda: networks.resnet_cifar(3),
                 "resnet32": lambda: networks.resnet_cifar(5), "resnet56": lambda: networks.resnet_cifar(9)}
_NETWORK_FIELDS = ("network_latency_s", "network_bandwidth_bytes_per_s", "updater_overhead_s")
_TIED = {"efficiency_bwd_data": "efficiency_fwd"}  # XLA:CPU runs both with the same conv kernel
_UPDATE_PASSES = 5.0  # momentum SGD: read gradient, read + write momentum, read + write weights


class LauncherError(JaxsprintError):
    """A bad flag value (the message names the flag)."""


def _ints(name: str, values: list[str], minimum: int) -> list[int]:
    out = []
    for v in values:
        try:
            i = int(v)
        except ValueError:
            raise LauncherError(f"{name}={v!r} is not an integer; allowed: integers >= {minimum}") from None
        if i < minimum:
            raise LauncherError(f"{name}={i} is not allowed; allowed: integers >= {minimum}")
        out.append(i)
    return out


def check_flags() -> dict[str, Any]:
    """Validates the flags (before anything is measured)."""
    for m in FLAGS.models:
        if m not in _CIFAR_TABLES:
            raise LauncherError(f"models={m!r} is not allowed; allowed: {', '.join(_CIFAR_TABLES)}")
    base = machines.get(FLAGS.base)
    for f in FLAGS.fit_fields:
        if f not in machines._FIELDS or f in _NETWORK_FIELDS:
            raise LauncherError(f"fit_fields={f!r} is not allowed; allowed: compute figures of "
                                f"{', '.join(f2 for f2 in machines._FIELDS if f2 not in _NETWORK_FIELDS)}")
    if FLAGS.rounds < 1 or FLAGS.allreduce_reps < 1 or FLAGS.starts < 1:
        raise LauncherError(f"rounds={FLAGS.rounds}, allreduce_reps={FLAGS.allreduce_reps}, starts={FLAGS.starts}: "
                            "allowed: integers >= 1")
    if not FLAGS.allreduce_timeout_s > 0:
        raise LauncherError(f"allreduce_timeout_s={FLAGS.allreduce_timeout_s} is not allowed; "
                            "allowed: a number > 0")
    return dict(base=base, batches=_ints("batches", FLAGS.batches, 1),
                holdout=set(_ints("holdout_batches", FLAGS.holdout_batches, 1)),
                ranks=_ints("ranks", FLAGS.ranks, 2),
                sizes=_ints("allreduce_bytes", FLAGS.allreduce_bytes, 4))


def measure(cfg: dict[str, Any], all_cpus: set[int] | None) -> dict[str, Any]:
    """Step and all-reduce timings of this machine (JSON-ready records).

    ``all_cpus``: the CPUs to give back to this thread (and so to the all-reduce processes it
    starts) after the steps were timed on one core; None when nothing was pinned.
    """
    configs = [(m, b) for m in FLAGS.models for b in cfg["batches"]]
    timed = timing.measure_train_steps(configs, rounds=FLAGS.rounds, min_time_s=FLAGS.min_time_s,
                                       cpu_kernels=FLAGS.cpu_kernels, log=lambda s: print(s, flush=True))
    if all_cpus is not None:
        os.sched_setaffinity(0, all_cpus)
    steps = []
    for (model, batch), (t, samples) in zip(configs, timed):
        steps.append(dict(model=model, batch=batch, measured_s=t, samples=samples, cpu_kernels=FLAGS.cpu_kernels,
                          one_core=all_cpus is not None))
        print(f"step {model} batch {batch}: {1e3 * t:.2f} ms (CPU time)", flush=True)
    allreduces = []
    for r in cfg["ranks"]:
        for a in timing.measure_allreduce(r, cfg["sizes"], reps=FLAGS.allreduce_reps,
                                             timeout_s=FLAGS.allreduce_timeout_s):
            allreduces.append(dict(bytes=a.message_bytes, ranks=a.ranks, measured_s=a.measured_s))
            print(f"all-reduce {int(a.message_bytes):>9d} B x {r} processes: "
                  f"{1e3 * a.measured_s:.3f} ms", flush=True)
    return dict(steps=steps, allreduces=allreduces)


def load_measurements(path: str) -> dict[str, Any]:
    """Measurements saved by this launcher: a preset file or its ``*_measurements.json``."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError) as e:
        raise LauncherError(f"measurements={path!r} cannot be read ({e}); allowed: a file saved "
                            "by experiments/calibrate.py") from None
    meas = data.get("measurements") if isinstance(data, dict) else None
    if not isinstance(meas, dict) or "steps" not in meas or "allreduces" not in meas:
        raise LauncherError(f"measurements={path!r} holds no measurements; allowed: a file saved "
                            "by experiments/calibrate.py")
    return meas


def fit_and_report(cfg: dict[str, Any], meas: dict[str, Any]) -> dict[str, Any]:
    """Fits the preset, prints the tables; returns the summary saved with the preset."""
    tables = {m: _CIFAR_TABLES[m]() for m in {s["model"] for s in meas["steps"]}}
    holdout_models = set(FLAGS.holdout_models)
    timings = [calibrate.StepTiming(tables[s["model"]], s["batch"], s["measured_s"], _UPDATE_PASSES,
                                    f"{s['model']} b{s['batch']}") for s in meas["steps"]]
    held = [s["batch"] in cfg["holdout"] or s["model"] in holdout_models for s in meas["steps"]]
    train = [t for t, h in zip(timings, held) if not h]
    test = [t for t, h in zip(timings, held) if h]
    ars = [calibrate.AllreduceTiming(a["bytes"], a["ranks"], a["measured_s"]) for a in meas["allreduces"]]
    if not train:
        raise LauncherError("every step timing is held out; allowed: hold out fewer batches/models")
    base = cfg["base"]
    compute = calibrate.fit(base, train, fields=FLAGS.fit_fields, tied=_TIED, seed=FLAGS.seed, starts=FLAGS.starts)
    machine = compute.machine
    network = None
    if ars:
        network = calibrate.fit(machine, allreduces=ars, fields=_NETWORK_FIELDS, seed=FLAGS.seed,
                                bounds={"network_latency_s": (1e-7, 1e-1),
                                        "network_bandwidth_bytes_per_s": (1e6, 1e12),
                                        "updater_overhead_s": (1e-7, 1e-1)})
        machine = network.machine
    pred_train, _ = calibrate.predict_timings(machine, train)
    pred_test, _ = calibrate.predict_timings(machine, test) if test else (np.zeros(0), None)
    print(f"\n{'split':9s} {'step':16s} {'measured ms':>11s} {'predicted ms':>12s} {'error':>7s}")
    for split, ts, ps in (("fit", train, pred_train), ("held out", test, pred_test)):
        for t, p in zip(ts, ps):
            print(f"{split:9s} {t.label:16s} {1e3 * t.measured_s:11.2f} {1e3 * p:12.2f} "
                  f"{100 * (p / t.measured_s - 1):+6.1f}%")
    err = lambda ts, ps: np.abs(np.asarray(ps) / np.asarray([t.measured_s for t in ts]) - 1)  # noqa: E731
    summary: dict[str, Any] = {"compute_fit": compute.summary()}
    for split, ts, ps in (("fit", train, pred_train), ("held_out", test, pred_test)):
        if ts:
            e = err(ts, ps)
            summary[f"steps_{split}"] = dict(n=int(e.size), median_abs_error=float(np.median(e)),
                                             mean_abs_error=float(np.mean(e)), max_abs_error=float(np.max(e)))
            print(f"steps {split}: n={e.size}, median |error| {100 * np.median(e):.1f}%, "
                  f"mean {100 * np.mean(e):.1f}%, max {100 * np.max(e):.1f}%")
    print("\ncompute figures (fitted on the steps not held out):")
    print(compute.table())
    models = sorted({s["model"] for s in meas["steps"]})
    if FLAGS.leave_one_model_out and len(models) > 1:
        # A second held-out protocol: predict every step of a network the fit has not seen.
        print("\nleave one model out (fit on the other models' steps at every batch, predict this one's):")
        errors = []
        for m in models:
            out = [t for t, s in zip(timings, meas["steps"]) if s["model"] == m]
            rest = [t for t, s in zip(timings, meas["steps"]) if s["model"] != m]
            r = calibrate.fit(base, rest, fields=FLAGS.fit_fields, tied=_TIED, seed=FLAGS.seed, starts=FLAGS.starts)
            pred, _ = calibrate.predict_timings(r.machine, out)
            e = np.asarray(pred) / np.asarray([t.measured_s for t in out]) - 1
            errors += list(np.abs(e))
            print(f"  {m:10s} " + " ".join(f"{t.label.split()[-1]}:{100 * x:+.1f}%" for t, x in zip(out, e)))
        e = np.asarray(errors)
        summary["steps_leave_one_model_out"] = dict(n=int(e.size), median_abs_error=float(np.median(e)),
                                                    mean_abs_error=float(np.mean(e)), max_abs_error=float(np.max(e)))
        print(f"steps leave-one-model-out: n={e.size}, median |error| {100 * np.median(e):.1f}%, "
              f"mean {100 * np.mean(e):.1f}%, max {100 * np.max(e):.1f}%")
    if network is not None:
        summary["network_fit"] = network.summary()
        print("\nall-reduce figures (fitted on all all-reduce timings):")
        print(network.table())
        print("all-reduce fit: median |error| "
              f"{100 * float(np.median(np.abs(network.allreduce_errors))):.1f}%, max "
              f"{100 * float(np.max(np.abs(network.allreduce_errors))):.1f}%")
        for a, e in zip(ars, network.allreduce_errors):
            print(f"  {int(a.message_bytes):>9d} B x {a.ranks}: measured {1e3 * a.measured_s:8.3f} ms, "
                  f"error {100 * e:+6.1f}%")
    samples = [s["samples"] for s in meas["steps"] if s.get("samples")]
    cv = calibrate.estimate_cv(samples) if samples else None
    if cv is not None:
        print(f"\ncompute-time jitter (robust cv of repeated steps, median over steps): {cv:.4f}")
    summary["compute_cv"] = cv
    summary["machine"] = machine
    return summary


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        print(f"error: unexpected arguments {argv[1:]}; all options are --flags", file=sys.stderr)
        sys.exit(2)
    try:
        # Before JAX starts its threads (see jaxsprint/cpu/hostmem.py); the steps run on one device.
        print(cpu.configure_host_memory(FLAGS.cpu_kernels), flush=True)
        all_cpus = None
        if not FLAGS.measurements and FLAGS.one_core and hasattr(os, "sched_setaffinity"):
            # One learner per core: JAX's threads, started after this, all share the first CPU.
            all_cpus = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {min(all_cpus)})
        cfg = check_flags()
        if FLAGS.measurements:
            meas = load_measurements(FLAGS.measurements)
        else:
            meas = measure(cfg, all_cpus)
            raw = os.path.splitext(FLAGS.out)[0] + "_measurements.json"
            os.makedirs(os.path.dirname(os.path.abspath(raw)), exist_ok=True)
            with open(raw, "w") as fh:  # kept even if the fit fails: refit with --measurements
                json.dump(dict(measurements=meas, loadavg=os.getloadavg()), fh)
            print(f"wrote {raw}", flush=True)
        summary = fit_and_report(cfg, meas)
    except JaxsprintError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    machine = summary.pop("machine")
    fitted = {**summary["compute_fit"]["fitted"], **summary.get("network_fit", {}).get("fitted", {})}
    ses = {**summary["compute_fit"]["rel_std_error"],
           **summary.get("network_fit", {}).get("rel_std_error", {})}
    sources = dict(machines.get(FLAGS.base).sources)
    sources.update({f: f"fitted by experiments/calibrate.py (relative standard error "
                       f"{100 * ses[f]:.1f}%)" for f in fitted})
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    machine = machine.replace(name="this_machine", sources=tuple(sources.items()),
                              description=f"this machine, calibrated {stamp} by experiments/calibrate.py "
                                          f"from the {FLAGS.base} preset (jax {jax.__version__})")
    calibrate.save_preset(FLAGS.out, machine, compute_cv=summary.pop("compute_cv"),
                          calibration=summary, measurements=meas)
    print(f"\nwrote {FLAGS.out}; use it with --machine_file={FLAGS.out} "
          "(experiments/predict.py, experiments/search.py)")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
