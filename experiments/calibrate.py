r"""Calibrate a machine preset: measure train steps and all-reduces (or read saved ones), fit, save.

    .venv/bin/python experiments/calibrate.py --config=experiments/configs/calibrate.py   # ~3-4 min on 2 cores
    .venv/bin/python experiments/calibrate.py --config.measurements=runs/calibrate/this_machine.json \
        --out=runs/calibrate/refit.json                         # refit saved measurements (~30 s)
    .venv/bin/python experiments/predict.py --machine_file=runs/calibrate/this_machine.json \
        --network=resnet20 --gpus_per_node=2 --sub_batch=64

The settings are the config file's (``experiments/configs/calibrate.py``, the default of ``--config``;
``--config.<field>=...`` overrides one); ``--out`` names the preset. Measures
(:mod:`jaxsprint.calibration.timing`) (1) the train step of this project's own CIFAR ResNets (momentum SGD,
built through the CPU switch ``cpu_kernels`` as training builds it) at several batch sizes, as process CPU time
with the process pinned to one core and XLA:CPU's Eigen single-threaded (one learner per core, as the ``cpu``
preset models), and (2) all-reduces of several sizes over 2-4 local JAX processes joined by
``jax.distributed`` (gloo, localhost ports only, bounded timeouts). It fits the compute figures ``fit_fields``
on the steps not held out and ``network_latency_s``, ``network_bandwidth_bytes_per_s`` and
``updater_overhead_s`` on the all-reduces (:func:`jaxsprint.calibration.model_fit.fit`), prints the fitted
figures with their standard errors and the held-out prediction errors, estimates the compute-time jitter (cv)
and saves the preset with its measurements and the resolved config to ``--out`` (default under ``runs/``).

``measurements`` also reads the small-CNN calibration set ``docs/perf-calibration.json``; the figures of the
``cpu`` preset are fitted from it by the ``command`` stored in its file, ``jaxsprint/perf/data/cpu.json``, which
writes that file (``--config.name=cpu --out=jaxsprint/perf/data/cpu.json``) with each fitted figure's relative
standard error; ``fixed`` holds the figures that set cannot determine at the values of :data:`FIXED`, each with
its reason. Bad input exits with status 2 and one message naming the config field or flag.
"""
from __future__ import annotations

import os
import sys

# One XLA:CPU thread for the step measurements, set before JAX starts (see the docstring).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
                           " intra_op_parallelism_threads=1").strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shlex  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from absl import flags  # noqa: E402

from jaxsprint import cli  # noqa: E402
from jaxsprint.train import cpu  # noqa: E402
from jaxsprint.errors import ConfigError, check  # noqa: E402
from jaxsprint.calibration import model_fit  # noqa: E402
from jaxsprint.perf import machines, presets  # noqa: E402
from jaxsprint.calibration import measurements  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
_CONFIG = cli.define_config_file("config", os.path.join(_HERE, "configs", "calibrate.py"),
                                 "The calibration's ml_collections config (experiments/configs/calibrate.py).")
_OUT = flags.DEFINE_string("out", "runs/calibrate/this_machine.json", "Where to save the fitted preset (with "
                           "its measurements and the resolved config).")

_CIFAR = ("resnet8", "resnet20", "resnet32", "resnet56")  # timed models that have a cost table in the zoo
_NETWORK_FIELDS = ("network_latency_s", "network_bandwidth_bytes_per_s", "updater_overhead_s")
_NETWORK_BOUNDS = {"network_latency_s": (1e-7, 1e-1), "network_bandwidth_bytes_per_s": (1e6, 1e12),
                   "updater_overhead_s": (1e-7, 1e-1)}
_TIED = {"efficiency_bwd_data": "efficiency_fwd"}  # XLA:CPU runs both with the same conv kernel

# Figures the small-CNN set of the cpu preset (docs/perf-calibration.json) cannot determine: fitted with the
# others, each ran onto a bound of the command's config.bounds or got a relative standard error over 100% (not
# determined to within a factor of 2). config.fixed holds them at these values instead. {figure: (value, reason)}; the
# reason becomes the figure's source. See docs/perf-model.md.
_ROOFLINE = ("not fitted: fitted on the small-CNN set it runs onto its upper bound 1 (XLA's own convolutions count "
             "their direct multiply-adds, so the pass cannot beat the peak); the saturation factors in rows, cols and "
             "depth carry the small layers' losses")
FIXED = {
    "efficiency_fwd": (1.0, "fixed at 1, at the roofline (a large forward convolution runs at the measured matmul "
                            "peak, peak_flops_per_s), " + _ROOFLINE),
    "efficiency_bwd_data": (1.0, "fixed at 1 with efficiency_fwd (XLA:CPU runs the input gradient with the forward "
                                 "convolution kernel), at the roofline, " + _ROOFLINE),
    "efficiency_bwd_weight": (1.0, "fixed at 1, at the roofline (a large filter gradient runs at the measured matmul "
                                   "peak), " + _ROOFLINE),
    "cache_miss_slowdown_weight_grad": (10.0, "fixed at 10 (a filter gradient whose working set far outgrows "
                                              "cache_bytes runs up to 11x slower, an order of magnitude: about "
                                              "a core's cache bandwidth over its memory bandwidth), not fitted: the "
                                              "small-CNN set's filter-gradient working sets (0.8-17 MB) are all "
                                              "below cache_bytes, so they show only the slope of the slowdown, "
                                              "k / cache_bytes; fitted, k runs onto its upper bound 10"),
    "cache_bytes": (5.6e7, "fixed at 56 MB, not fitted: the value the fit of the small-CNN set gives with "
                           "cache_miss_slowdown_weight_grad held at 10 (which sets the slope of the filter-gradient "
                           "slowdown the set shows), but with a relative standard error of 250% (it trades off "
                           "against half_efficiency_rows and half_efficiency_depth)"),
    "maxpool_backward_memory_efficiency": (1.0, "fixed at 1, as memory_efficiency (the max-pool backward pass "
                                                "streams at the effective rate), not fitted: the small-CNN set does "
                                                "not determine it (its bytes are a small share of every step: "
                                                "halving it lengthens the steps by 1-1.4%; fitted, it stops short "
                                                "of its upper bound 1 with an unbounded relative standard error)"),
}


def _ints(name: str, values, minimum: int) -> list[int]:
    out = []
    for v in cli.text_list(f"config.{name}", values):
        ok = not isinstance(v, bool) and str(v).strip().lstrip("-").isdigit() and int(v) >= minimum
        check(ok, f"config.{name}", v, f"integers >= {minimum}")
        out.append(int(v))
    return out


def _bounds(values) -> dict[str, tuple[float, float]]:
    out = {}
    for v in cli.text_list("config.bounds", values):
        name, _, rng = str(v).partition("=")
        lo, _, hi = rng.partition(":")
        allowed = "entries name=lo:hi with numbers 0 < lo < hi"
        try:
            out[name] = (float(lo), float(hi))
        except ValueError:
            raise ConfigError("config.bounds", v, allowed) from None
        check(0 < out[name][0] < out[name][1], "config.bounds", v, allowed)
        check(name in machines.FIELDS, "config.bounds", v, "entries name=lo:hi naming machine figures")
    return out


def check_flags() -> dict[str, Any]:
    """Validates the config and --out (before anything is measured)."""
    c = _CONFIG.value
    # The tuples as read (comma-separated text split): every use below and the preset's config see these.
    for name in ("models", "fit_fields", "holdout_models", "fixed"):
        c[name] = tuple(str(v) for v in cli.text_list(f"config.{name}", c[name]))
    for name, minimum in (("batches", 1), ("holdout_batches", 1), ("ranks", 2), ("allreduce_bytes", 4)):
        c[name] = tuple(_ints(name, c[name], minimum))
    for name in ("rounds", "allreduce_reps", "starts", "seed", "holdout_seed"):
        check(isinstance(c[name], int) and not isinstance(c[name], bool), f"config.{name}", c[name], "an integer")
    check(c.cpu_kernels in cpu.MODES, "config.cpu_kernels", c.cpu_kernels, f"one of {', '.join(cpu.MODES)}")
    check(c.loss in model_fit.LOSSES, "config.loss", c.loss, f"one of {', '.join(model_fit.LOSSES)}")
    for m in c.models:
        check(m in _CIFAR, "config.models", m, f"one of {', '.join(_CIFAR)}")
    compute_fields = [f for f in machines.FIELDS if f not in _NETWORK_FIELDS]
    for f in c.fit_fields:
        check(f in compute_fields, "config.fit_fields", f, f"compute figures: {', '.join(compute_fields)}")
    for f in c.fixed:
        check(f in FIXED, "config.fixed", f, f"figures of FIXED: {', '.join(FIXED)}")
        check(f not in c.fit_fields, "config.fixed", f, "figures not also in config.fit_fields")
    for name in ("rounds", "allreduce_reps", "starts"):
        check(c[name] >= 1, f"config.{name}", c[name], "an integer >= 1")
    check(c.allreduce_timeout_s > 0, "config.allreduce_timeout_s", c.allreduce_timeout_s, "a number > 0")
    check(0 <= c.holdout_fraction < 1, "config.holdout_fraction", c.holdout_fraction, "a number >= 0 and < 1")
    for name in ("loss_scale", "min_time_s"):
        value = c[name]
        check(math.isfinite(value) and value > 0, f"config.{name}", value, "a finite number > 0")
    check(c.base in machines.PRESETS, "config.base", c.base, f"one of {', '.join(machines.PRESETS)}")
    cli.check_output_file("--out", _OUT.value)
    base = machines.get(c.base)
    base = machines.with_figures(base, **{f: FIXED[f][0] for f in c.fixed})
    return dict(base=base, batches=_ints("batches", c.batches, 1),
                holdout=set(_ints("holdout_batches", c.holdout_batches, 1)),
                ranks=_ints("ranks", c.ranks, 2), sizes=_ints("allreduce_bytes", c.allreduce_bytes, 4),
                bounds=_bounds(c.bounds))


def measure(cfg: dict[str, Any], all_cpus: set[int] | None) -> dict[str, Any]:
    """Step and all-reduce timings of this machine (JSON-ready records).

    ``all_cpus``: the CPUs to give back to this thread (and so to the all-reduce processes it
    starts) after the steps were timed on one core; None when nothing was pinned.
    """
    c = _CONFIG.value
    from jaxsprint.calibration import timing  # the training stack, only when measuring

    configs = [(m, b) for m in c.models for b in cfg["batches"]]
    timed = timing.measure_train_steps(configs, rounds=c.rounds, min_time_s=c.min_time_s,
                                       cpu_kernels=c.cpu_kernels, log=lambda s: print(s, flush=True))
    if all_cpus is not None:
        os.sched_setaffinity(0, all_cpus)
    steps = []
    for (model, batch), (t, samples) in zip(configs, timed):
        steps.append(dict(model=model, batch=batch, measured_s=t, samples=samples, cpu_kernels=c.cpu_kernels,
                          one_core=all_cpus is not None))
        print(f"step {model} batch {batch}: {1e3 * t:.2f} ms (CPU time)", flush=True)
    allreduces = []
    for r in cfg["ranks"]:
        for a in timing.measure_allreduce(r, cfg["sizes"], reps=c.allreduce_reps,
                                          timeout_s=c.allreduce_timeout_s):
            allreduces.append(dict(bytes=a.message_bytes, ranks=a.ranks, measured_s=a.measured_s))
            print(f"all-reduce {int(a.message_bytes):>9d} B x {r} processes: {1e3 * a.measured_s:.3f} ms",
                  flush=True)
    return dict(steps=steps, allreduces=allreduces)


def _print_stats(name: str, errors) -> dict[str, float]:
    s = model_fit.error_stats(errors)
    print(f"steps {name}: n={s['n']}, median |error| {100 * s['median_abs_error']:.1f}%, "
          f"mean {100 * s['mean_abs_error']:.1f}%, max {100 * s['max_abs_error']:.1f}%")
    return s


def fit_and_report(cfg: dict[str, Any], meas: dict[str, Any]) -> tuple[dict[str, Any], machines.Machine]:
    """Fits the preset and prints the tables; returns the summary saved with the preset and the machine."""
    c = _CONFIG.value
    records = meas["steps"]
    timings = measurements.step_timings(records)
    held = np.asarray([r["batch"] in cfg["holdout"] or r["model"] in c.holdout_models for r in records], bool)
    if c.holdout_fraction and records:
        held |= model_fit.holdout_split(len(records), c.holdout_fraction, c.holdout_seed)
    train = [t for t, h in zip(timings, held) if not h]
    test = [t for t, h in zip(timings, held) if h]
    check(bool(train), "config.holdout_batches", c.holdout_batches, "fewer held-out batches, models or share: "
                                                                   "every step timing is held out")
    ars = measurements.allreduce_timings(meas["allreduces"])
    tied = {k: v for k, v in _TIED.items() if k not in c.fixed and v not in c.fixed}
    fit_kwargs = dict(tied=tied, seed=c.seed, starts=c.starts, bounds=cfg["bounds"], loss=c.loss,
                      loss_scale=c.loss_scale)
    compute = model_fit.fit(cfg["base"], train, fields=c.fit_fields, **fit_kwargs)
    machine, network = compute.machine, None
    if ars:
        network = model_fit.fit(machine, allreduces=ars, fields=_NETWORK_FIELDS, seed=c.seed,
                                bounds=_NETWORK_BOUNDS)
        machine = network.machine
    print(f"\n{'split':9s} {'step':16s} {'measured ms':>11s} {'predicted ms':>12s} {'error':>7s}")
    summary: dict[str, Any] = {"compute_fit": compute.summary()}
    for split, ts in (("fit", train), ("held_out", test)):
        if not ts:
            continue
        pred, _ = model_fit.predict_timings(machine, ts)
        errors = pred / np.asarray([t.measured_s for t in ts]) - 1
        for t, p, e in zip(ts, pred, errors):
            print(f"{split:9s} {t.label:16s} {1e3 * t.measured_s:11.2f} {1e3 * p:12.2f} {100 * e:+6.1f}%")
        summary[f"steps_{split}"] = _print_stats(split, errors)
    print("\ncompute figures (fitted on the steps not held out):")
    print(compute.table())
    models = [r["model"] for r in records]
    if c.leave_one_model_out and len(set(models)) > 1:
        print("\nleave one model out (fit on the other models' steps at every batch, predict this one's):")
        by_model = model_fit.leave_one_group_out(cfg["base"], timings, models, fields=c.fit_fields,
                                                 **fit_kwargs)
        for m, e in by_model.items():
            batches = [r["batch"] for r in records if r["model"] == m]
            print(f"  {m:10s} " + " ".join(f"b{b}:{100 * x:+.1f}%" for b, x in zip(batches, e)))
        summary["steps_leave_one_model_out"] = _print_stats("leave-one-model-out",
                                                            np.concatenate(list(by_model.values())))
    if network is not None:
        summary["network_fit"] = network.summary()
        print("\nall-reduce figures (fitted on all all-reduce timings):")
        print(network.table())
        for a, e in zip(ars, network.allreduce_errors):
            print(f"  {int(a.message_bytes):>9d} B x {a.ranks}: measured {1e3 * a.measured_s:8.3f} ms, "
                  f"error {100 * e:+6.1f}%")
    samples = [r["samples"] for r in records if r.get("samples")]
    summary["compute_cv"] = model_fit.estimate_cv(samples) if samples else None
    if summary["compute_cv"] is not None:
        print(f"\ncompute-time jitter (robust cv of repeated steps, median over steps): {summary['compute_cv']:.4f}")
    return summary, machine


def main(argv: list[str]) -> None:
    c = _CONFIG.value
    if len(argv) > 1:
        raise ConfigError("arguments", argv[1:], "none besides --flags")
    # Before JAX starts its threads (see jaxsprint/train/cpu/hostmem.py); the steps run on one device.
    cfg = check_flags()
    print(cpu.configure_host_memory(c.cpu_kernels), flush=True)
    all_cpus = None
    if not c.measurements and c.one_core and hasattr(os, "sched_setaffinity"):
        # One learner per core: JAX's threads, started after this, all share the first CPU.
        all_cpus = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(all_cpus)})
    if c.measurements:
        meas = measurements.load_measurements(c.measurements, "config.measurements")
    else:
        meas = measure(cfg, all_cpus)
        raw = os.path.splitext(_OUT.value)[0] + "_measurements.json"
        os.makedirs(os.path.dirname(os.path.abspath(raw)), exist_ok=True)
        with open(raw, "w") as fh:  # kept even if the fit fails: refit with config.measurements
            json.dump(dict(measurements=meas, loadavg=os.getloadavg()), fh)
        print(f"wrote {raw}", flush=True)
    summary, machine = fit_and_report(cfg, meas)
    fits = [summary["compute_fit"]] + ([summary["network_fit"]] if "network_fit" in summary else [])
    command = " ".join(["python experiments/calibrate.py"] + [shlex.quote(a) for a in sys.argv[1:]])
    data = c.measurements or "the measurements saved with it"
    sources = dict(machines.get(c.base).sources)
    sources.update({f: FIXED[f][1] for f in c.fixed})
    rel_std_error = {}
    for f in fits:
        for k in f["fitted"]:
            se = f["rel_std_error"][k]
            rel_std_error[k] = se if math.isfinite(se) else None
            se_text = f"{100 * se:.1f}%" if math.isfinite(se) else "not identified"
            sources[k] = f"fitted by `{command}` on {data} (relative standard error {se_text})"
    import jax

    if c.name == c.base:  # a refit of the base preset: the same machine
        description = machines.get(c.base).description
    else:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        description = (f"this machine, calibrated {stamp} by experiments/calibrate.py from the {c.base} preset "
                       f"(jax {jax.__version__})")
    machine = machine.replace(name=c.name, sources=tuple(sources.items()), description=description)
    presets.save_preset(_OUT.value, machine, command=command, fitted=sorted(rel_std_error),
                        fixed={f: FIXED[f][0] for f in c.fixed}, rel_std_error=rel_std_error,
                        compute_cv=summary.pop("compute_cv"), calibration=summary,
                        config=json.loads(c.to_json_best_effort()), measurements=meas)
    print(f"\nwrote {_OUT.value}; use it with --machine_file={_OUT.value} "
          "(experiments/predict.py, experiments/search.py)")


if __name__ == "__main__":
    cli.run(main)
