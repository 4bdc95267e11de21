r"""Steps to a target accuracy at several batch sizes, predicted from the measured gradient noise scale.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/study_noise.py \
      --config=experiments/configs/noise_study.py --out=docs/noise-study

Every batch x seed trains to the target (``config.stop_at_accuracy``); the runs with 2 or more devices
measure B_simple on the way. Then McCandlish et al.'s ``steps = S_min (1 + B_noise / B)``:
  * from the measurement: B_noise is the mean over seeds of B_simple in the last quarter of the reference
    batch's runs (the target's stage of training), and S_min alone is fitted (`jaxsprint.plan.law.fit_law`
    with `measured_noise_prior`);
  * fitted: S_min and B_noise both from the steps, to set the fitted B_noise beside the measured one.
Writes OUT.json (every run, resumable), OUT.md (the tables), OUT.png (steps against batch, both laws) and
OUT.config.json. Every cell's config is checked before the first run: a bad value exits with status 2.
"""
import copy
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxsprint import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Study config (experiments/configs/noise_study.py).")
_OUT = flags.DEFINE_string("out", "docs/noise-study", "Output prefix for .json, .md and .png.")


def validate_study(base) -> None:
    """The study block: batch sizes that are multiples of ``examples_per_device``, the reference batch among
    them with 2 or more devices (it measures), integer seeds, positive intervals.

    Raises:
      ConfigError: naming the first bad ``config.study`` field.
    """
    from experiments import studies
    from jaxsprint.errors import check, is_int

    studies.require_study(base, ("batch_sizes", "seeds"))
    st = base.study
    check(is_int(st.examples_per_device) and st.examples_per_device >= 1, "config.study.examples_per_device",
          st.examples_per_device, "an integer >= 1")
    for b in st.batch_sizes:
        check(is_int(b) and b > 0 and b % st.examples_per_device == 0, "config.study.batch_sizes", b,
              f"positive multiples of config.study.examples_per_device ({st.examples_per_device})")
    for seed in st.seeds:
        check(is_int(seed), "config.study.seeds", seed, "integers")
    check(st.reference_batch in st.batch_sizes and st.reference_batch >= 2 * st.examples_per_device,
          "config.study.reference_batch", st.reference_batch,
          f"one of config.study.batch_sizes, at least 2 x {st.examples_per_device} (two devices measure)")
    for name in ("warmup_steps", "eval_every_examples"):
        check(is_int(st[name]) and st[name] >= (name == "eval_every_examples"), f"config.study.{name}", st[name],
              "an integer >= 0" if name == "warmup_steps" else "an integer >= 1")
    check(0 < base.stop_at_accuracy <= 1, "config.stop_at_accuracy", base.stop_at_accuracy,
          "the target: a fraction in (0, 1]")


def cells(base):
    """Yields (key, training config) per batch x seed."""
    from jaxsprint.train import data as data_lib
    from jaxsprint.train import optim

    num_train = data_lib.load_dataset(base).num_train
    st = base.study
    for b in st.batch_sizes:
        for seed in st.seeds:
            c = copy.deepcopy(base)
            with c.unlocked():
                c.batch_size, c.seed = int(b), int(seed)
                c.num_devices = min(8, b // st.examples_per_device)
                c.noise_scale.enabled = c.num_devices * c.grad_accum_steps >= 2
                c.lr.warmup_epochs = st.warmup_steps * b / num_train
                spe = optim.derive_hparams(c, num_train).steps_per_epoch
                c.eval_every_epochs = max(1, round(st.eval_every_examples / b)) / spe
            yield f"b{b}_s{seed}", c


def main(argv):
    from experiments import studies
    from jaxsprint.errors import check

    check(len(argv) == 1, "arguments", argv[1:], "none besides flags")
    logging.set_verbosity(logging.WARNING)
    base = _CONFIG.value
    validate_study(base)
    def finish(config, r):
        r["reached"] = reached(config, r)

    def describe(key, r):
        b_simple = r.get("noise_scale", {}).get("windows", [{}])[-1].get("b_simple", math.nan)
        return (f"{key}: {'reached' if r['reached'] else 'NOT reached'} at step {r.get('steps')}, "
                f"B_simple (last quarter) {b_simple:.4g} ({r['seconds']:.0f} s)")

    results = studies.run_cells(_OUT.value, base, list(cells(base)), describe, finish)
    write_report(base, results)


def reached(config, r) -> bool:
    """Whether the run stopped at the target (the trainer's own rule over its evaluations)."""
    from jaxsprint.train import trainer

    return not r["diverged"] and trainer.reached_target(config, [a for _, a in r["eval_curve"]])


def analyse(base, results) -> dict:
    """Per batch: steps over seeds and B_simple; the law from the measured B_noise and the fitted one."""
    import numpy as np

    from jaxsprint.plan import law

    st, rows = base.study, []
    for b in st.batch_sizes:
        runs = [results[f"b{b}_s{s}"] for s in st.seeds if f"b{b}_s{s}" in results]
        steps = [float(r["steps"]) for r in runs if r["reached"]]
        last = [r["noise_scale"]["windows"][-1] for r in runs if r.get("noise_scale")]
        rows.append({"batch": b, "runs": len(runs), "reached": len(steps), "steps": steps,
                     "log_steps": float(np.mean(np.log(steps))) if steps else math.nan,
                     "log_var": float(np.var(np.log(steps), ddof=1) / len(steps)) if len(steps) > 1 else 0.0,
                     "b_simple": [w["b_simple"] for w in last], "b_simple_se": [w["b_simple_se"] for w in last]})
    ref = next(r for r in rows if r["batch"] == st.reference_batch)
    if not ref["b_simple"] or not any(r["steps"] for r in rows):
        return {"rows": rows}
    b_noise = float(np.mean(ref["b_simple"]))
    se = float(max(np.sqrt(np.sum(np.square(ref["b_simple_se"]))) / len(ref["b_simple"]),
                   np.std(ref["b_simple"], ddof=1) / np.sqrt(len(ref["b_simple"])) if len(ref["b_simple"]) > 1 else 0))
    fit_rows = [r for r in rows if r["steps"]]  # a batch no seed brought to the target is reported, not fitted
    args = ([r["batch"] for r in fit_rows], [0.0] * len(fit_rows), [r["log_steps"] for r in fit_rows],
            [r["log_var"] for r in fit_rows])
    measured = law.fit_law(*args, b_ref=st.reference_batch,
                           prior=law.measured_noise_prior(b_noise, se, st.reference_batch))
    fitted = law.fit_law(*args, b_ref=st.reference_batch)
    prior = law.measured_noise_prior(b_noise, se, st.reference_batch)
    for i, r in enumerate(fit_rows):  # held out in the batch too: S_min from the other batch sizes only
        rest = [j for j in range(len(fit_rows)) if j != i]
        f = law.fit_law(*([a[j] for j in rest] for a in args), b_ref=st.reference_batch, prior=prior)
        r["error_measured_loo"] = float(np.exp(law.predict_log_updates(f, r["batch"], 0.0)[0][0])
                                        / math.exp(r["log_steps"]) - 1)
    for r in rows:
        for name, f in (("measured", measured), ("fitted", fitted)):
            r[f"predicted_{name}"] = float(np.exp(law.predict_log_updates(f, r["batch"], 0.0)[0][0]))
        r["error_measured"] = (r["predicted_measured"] / math.exp(r["log_steps"]) - 1) if r["steps"] else math.nan
    errors = [abs(r["error_measured"]) for r in fit_rows]
    loo = [abs(r["error_measured_loo"]) for r in fit_rows]
    return {"rows": rows, "b_noise_measured": b_noise, "b_noise_measured_se": se,
            "law_measured": measured.as_dict(), "law_fitted": fitted.as_dict(),
            "median_abs_error_measured": float(np.median(errors)), "max_abs_error_measured": float(np.max(errors)),
            "median_abs_error_measured_loo": float(np.median(loo))}


def write_report(base, results):
    from experiments import studies

    a = analyse(base, results)
    studies.save_json(_OUT.value + ".analysis.json", a)
    st = base.study

    def fmt(xs, digits=4):
        return " / ".join(f"{x:.{digits}g}" for x in xs) or "-"

    rows = [[r["batch"], min(r["batch"] // st.examples_per_device, 8), f"{r['reached']}/{r['runs']}",
             fmt(r["steps"]), f"{math.exp(r['log_steps']):.4g}" if r["steps"] else "-",
             " / ".join(f"{b:.3g} ± {e:.2g}" for b, e in zip(r["b_simple"], r["b_simple_se"])) or "-",
             f"{r.get('predicted_measured', math.nan):.4g}",
             f"{100 * r['error_measured']:+.1f}%" if math.isfinite(r.get("error_measured", math.nan)) else "-",
             f"{r.get('predicted_fitted', math.nan):.4g}"] for r in a["rows"]]
    table = studies.markdown_table(
        ["batch", "devices", "reached", "steps per seed", "geo. mean", "B_simple, last quarter (per seed)",
         "from measured B_noise", "error", "2-parameter fit"], rows)
    minutes = sum(r.get("seconds", 0) for r in results.values()) / 60
    text = (f"{base.model} on {base.dataset} ({base.image_size}x{base.image_size}), target top-1 "
            f"{base.stop_at_accuracy} (mean of the last {base.stop_evals} evaluations), {base.optimizer.name} "
            f"momentum {base.optimizer.momentum}, lr {base.lr.base} x B / {base.lr.reference_batch} after a "
            f"{st.warmup_steps}-step warmup, BN groups of {base.bn.group_size}, seeds {list(st.seeds)}. "
            f"Total run time {minutes:.0f} min.\n\n" + table + "\n")
    if "law_measured" in a:
        m, f = a["law_measured"], a["law_fitted"]
        text += (f"\nMeasured B_noise (batch {st.reference_batch}, last quarter, mean over seeds): "
                 f"{a['b_noise_measured']:.4g} ± {a['b_noise_measured_se']:.2g}; with it, fitted S_min = "
                 f"{m['s_min']:.4g}. Steps predicted from the measured B_noise: median error "
                 f"{100 * a['median_abs_error_measured']:.1f}%, largest {100 * a['max_abs_error_measured']:.1f}%; "
                 f"with S_min fitted to the other batch sizes only (leave one out), median "
                 f"{100 * a['median_abs_error_measured_loo']:.1f}%.\n"
                 f"Both fitted: S_min = {f['s_min']:.4g}, B_noise = {f['b_noise']:.4g} "
                 f"(log sd {f['param_sd']['log_b_noise']:.2f}).\n")
    studies.write_markdown(_OUT.value + ".md", text)
    plot(a)


def plot(a):
    from experiments import studies

    plt = studies.pyplot()
    if plt is None or "law_measured" not in a:
        return
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for r in a["rows"]:
        ax.scatter([r["batch"]] * len(r["steps"]), r["steps"], color="k", s=12)
    bs = np.geomspace(min(r["batch"] for r in a["rows"]), max(r["batch"] for r in a["rows"]), 50)
    for name, label in (("law_measured", f"measured B_noise {a['b_noise_measured']:.0f}"),
                        ("law_fitted", f"fitted B_noise {a['law_fitted']['b_noise']:.0f}")):
        ax.plot(bs, a[name]["s_min"] * (1 + a[name]["b_noise"] / bs), label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("global batch B")
    ax.set_ylabel("steps to target")
    ax.set_title("S_min (1 + B_noise / B)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(_OUT.value + ".png", dpi=120)


if __name__ == "__main__":
    cli.run(main)
