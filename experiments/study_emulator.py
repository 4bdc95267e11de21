r"""Does the delayed-gradient emulator stand in for real asynchrony? The runtime against the emulator.

  python experiments/study_emulator.py --config=experiments/configs/emulator_study.py --out=docs/emulator-study
  python experiments/study_emulator.py --config=experiments/configs/emulator_study.py --out=/tmp/e --quick

For every configuration of ``config.study`` (learners, emulated network time) and seed:
  1. **runtime**: ``jaxsprint.runtime.run`` for ``study.num_updates`` published versions; its event log gives
     the measured staleness pmf (per gradient) and count pmf (gradients per update), without the warm-up
     (``jaxsprint.runtime.events.statistics``), and its final test accuracy;
  2. **emulator**: the same network, data, augmentation, optimizer and peak learning rate trained by
     ``jaxsprint.train.trainer`` with ``config.async_emulation`` drawing each update's delay from that run's measured
     staleness pmf (``sampler="pmf"``) and its sub-batch count from the measured count pmf conditioned on
     K >= 1 (``num_sub_batches`` = the largest count seen, ``k_pmf``), BatchNorm over groups of one sub-batch,
     for as many updates as the runtime run applied (its non-empty cycles: an empty cycle changes nothing).
Writes OUT.json (every run; resumable), OUT.md (accuracy mean ± std over seeds per configuration and mode) and
OUT.config.json (the resolved config).
``--quick`` runs one small configuration and one seed (a few updates) to check the pipeline.

Differences that remain by construction (say them with the numbers): the emulator delays a whole update by
one draw where the runtime's gradients in one update carry their own staleness; the emulator's BatchNorm
running statistics are updated every step from all sub-batches (the runtime's from the applied ones); the
data order differs.
"""
import copy
import os
import shutil
import sys
import tempfile
import time

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):  # before JAX starts
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxsprint import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Study config (experiments/configs/emulator_study.py).")
_OUT = flags.DEFINE_string("out", "docs/emulator-study", "Output prefix for .json and .md.")
_QUICK = flags.DEFINE_bool("quick", False, "One small configuration, one seed, a few updates (a pipeline check).")

MODES = ("runtime", "emulator")


def quick_config(base):
    """The ``--quick`` study: 2 learners, 10 ms network, 6 updates, seed 0, no warm-up cut."""
    c = copy.deepcopy(base)
    with c.unlocked():
        c.study.names, c.study.learners, c.study.network_times = ("quick",), (2,), (0.01,)
        c.study.num_updates, c.study.seeds = 6, (0,)
        if c.study.get("sub_batches") is not None:
            c.study.sub_batches = (int(c.sprint.sub_batch),)
        c.sprint.warmup_s = 0.0
    return c


def validate_study(base, num_devices: int) -> None:
    """Checks the study block and every runtime configuration before anything runs or is written.

    Raises:
      ConfigError: naming the first bad field.
    """
    from experiments import studies
    from jaxsprint import runtime
    from jaxsprint.errors import ConfigError, check, is_int, is_real
    from jaxsprint.train import trainer

    studies.require_study(base, ("names", "learners", "network_times", "seeds"))
    s = base.study
    n = len(s.names)
    check(len(s.learners) == n and all(is_int(v) and v >= 1 for v in s.learners), "config.study.learners",
          s.learners, f"one integer >= 1 per name in config.study.names ({n})")
    check(len(s.network_times) == n and all(is_real(v) and v >= 0 for v in s.network_times),
          "config.study.network_times", s.network_times, f"one finite number of seconds >= 0 per name ({n})")
    check(len(set(s.names)) == n, "config.study.names", s.names, "distinct names")
    subs = s.get("sub_batches")
    check(subs is None or (len(subs) == n and all(is_int(b) and b >= 1 for b in subs)),
          "config.study.sub_batches", subs, f"None (config.sprint.sub_batch for all) or one integer >= 1 per name "
                                            f"({n})")
    check(is_int(s.num_updates) and s.num_updates >= 1, "config.study.num_updates", s.num_updates,
          "an integer >= 1")
    for seed in s.seeds:
        check(is_int(seed) and 0 <= seed < 2**31, "config.study.seeds", seed, "integers in [0, 2^31)")
    # Each configuration's runtime run, and its emulation (from stand-in statistics), as they will be checked.
    fields = {"config.sprint.learners_per_host": "config.study.learners",
              "config.sprint.network_time_s": "config.study.network_times",
              "config.sprint.num_updates": "config.study.num_updates", "config.sprint.seed": "config.study.seeds"}
    if subs is not None:
        fields["config.sprint.sub_batch"] = "config.study.sub_batches"
    stand_in = {"staleness_pmf": {"0": 1.0}, "count_pmf": {"1": 1.0}}
    for i in range(n):
        try:
            runtime.validate_config(runtime_config(base, i, s.seeds[0]), num_devices)
        except ConfigError as e:
            if e.field not in fields:
                raise
            value = base.study[fields[e.field].rpartition(".")[2]]
            raise ConfigError(fields[e.field], value, f"{e.allowed} (as {e.field} of configuration "
                                                      f"{s.names[i]!r})") from None
        trainer.validate_config(emulator_config(base, i, s.seeds[0], stand_in, s.num_updates), 1)


def sub_batch(base, i: int) -> int:
    """Configuration ``i``'s sub-batch: ``study.sub_batches[i]`` where given, else ``sprint.sub_batch``."""
    subs = base.study.get("sub_batches")
    return int(subs[i]) if subs is not None else int(base.sprint.sub_batch)


def runtime_config(base, i: int, seed: int):
    """The SPRINT config of configuration ``i`` and ``seed``: ``study.num_updates`` versions, no other stop."""
    c = copy.deepcopy(base)
    with c.unlocked():
        c.sprint.learners_per_host = int(base.study.learners[i])
        c.sprint.sub_batch = sub_batch(base, i)
        c.sprint.network_time_s = float(base.study.network_times[i])
        c.sprint.num_updates, c.sprint.duration_s, c.sprint.num_epochs = int(base.study.num_updates), 0.0, 0.0
        c.sprint.seed = int(seed)
        c.sprint.eval_every_updates = 0
        c.sprint.checkpoint = False
    return c


def _peak_lr(base, i: int) -> float:
    """The runtime's peak rate of configuration ``i``: linear scaling for the nominal mini-batch sub_batch x
    learners."""
    nominal = sub_batch(base, i) * int(base.study.learners[i])
    return float(base.lr.base * nominal / base.lr.reference_batch if base.lr.scaling == "linear" else base.lr.base)


def emulator_config(base, i: int, seed: int, stats, applied_updates: int):
    """The training config that emulates configuration ``i``'s runtime run from its measured statistics."""
    import numpy as np

    b = sub_batch(base, i)
    # In non-empty updates: the emulator's ring stands still on an empty update (events.effective_staleness).
    stale = {int(k): float(v) for k, v in (stats.get("effective_staleness_pmf") or stats["staleness_pmf"]).items()}
    count = {int(k): float(v) for k, v in stats["count_pmf"].items() if int(k) >= 1}
    if not stale:
        stale = {0: 1.0}
    if not count:
        count = {1: 1.0}
    max_s, n_sub = max(stale), max(count)
    pmf = np.zeros(max_s + 1)
    for k, v in stale.items():
        pmf[k] = v
    k_pmf = np.zeros(n_sub + 1)
    for k, v in count.items():
        k_pmf[k] = v
    c = copy.deepcopy(base)
    with c.unlocked():
        del c["study"]
        c.seed = int(seed)
        c.num_devices = 1
        c.batch_size = b * n_sub
        c.grad_accum_steps = 1
        c.bn.reduction, c.bn.group_size = "group", b
        c.lr.scaling, c.lr.base = "none", _peak_lr(base, i)
        c.num_train_steps = max(1, int(applied_updates))
        c.eval_every_epochs, c.checkpoint_every_epochs, c.progress_bar = 0.0, 0.0, False
        c.polish.mode = "none"
        a = c.async_emulation
        a.enabled, a.sampler, a.mitigation = True, "pmf", "none"
        a.max_staleness, a.pmf = int(max_s), tuple(float(x) for x in pmf / pmf.sum())
        a.num_sub_batches, a.k_pmf = int(n_sub), tuple(float(x) for x in k_pmf / k_pmf.sum())
    return c


def run_runtime(config):
    """One runtime run in a scratch directory: its accuracy, measured statistics and applied updates."""
    import numpy as np

    from jaxsprint import runtime
    from jaxsprint.runtime import events

    workdir = tempfile.mkdtemp(prefix="jaxsprint-emulator-study-")
    try:
        r = runtime.run(config, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    st = events.statistics(r.events)
    keep = ("mean_staleness", "std_staleness", "mean_effective_staleness", "mean_count", "mean_minibatch",
            "t_compute_s", "t_update_s", "t_update_cv", "t_compute_cv", "gradients", "updates", "in_flight")
    out = {k: st[k] for k in keep}
    out.update(staleness_pmf={str(k): v for k, v in st["staleness_pmf"].items()},
               effective_staleness_pmf={str(k): v for k, v in st["effective_staleness_pmf"].items()},
               count_pmf={str(k): v for k, v in st["count_pmf"].items()},
               applied_updates=int(np.count_nonzero(np.asarray(r.events["update_count"]) > 0)),
               published_updates=int(r.updates), eval_accuracy=float(r.eval["accuracy"]),
               eval_loss=float(r.eval.get("loss", float("nan"))), diverged=False)
    return out


def main(argv):
    import jax

    from jaxsprint.errors import ConfigError

    if len(argv) > 1:
        raise ConfigError("arguments", argv[1:], "none besides flags")

    from experiments import studies
    from jaxsprint.train import trainer

    logging.set_verbosity(logging.WARNING)
    base = _CONFIG.value
    if _QUICK.value and base is not None:
        base = quick_config(base)
    validate_study(base, len(jax.local_devices()))
    studies.check_out(_OUT.value)
    path = _OUT.value + ".json"
    results = studies.load_json(path, dict)
    studies.write_config(_OUT.value, base)
    s = base.study
    for i, name in enumerate(s.names):
        for seed in s.seeds:
            key = f"{name}_s{seed}"
            if f"{key}_runtime" not in results:
                t = time.time()
                r = run_runtime(runtime_config(base, i, seed))
                r["seconds"] = time.time() - t
                results[f"{key}_runtime"] = r
                studies.save_json(path, results)
                print(f"{key} runtime: {100 * r['eval_accuracy']:.2f}%, mean staleness {r['mean_staleness']:.2f}, "
                      f"mean mini-batch {r['mean_minibatch']:.1f}, {r['applied_updates']} applied updates "
                      f"({r['seconds']:.0f} s)", flush=True)
            if f"{key}_emulator" not in results:
                rt = results[f"{key}_runtime"]
                cfg = emulator_config(base, i, seed, rt, rt["applied_updates"])
                trainer.validate_config(cfg, 1)
                t = time.time()
                r = studies.run_cell(cfg)
                r = {k: v for k, v in r.items() if k != "loss_curve"}
                r["seconds"] = time.time() - t
                results[f"{key}_emulator"] = r
                studies.save_json(path, results)
                status = "diverged" if r["diverged"] else f"{100 * r['eval_accuracy']:.2f}%"
                print(f"{key} emulator: {status} ({r['seconds']:.0f} s)", flush=True)
    write_report(base, results)


def _vals(results, base, name, mode, field="eval_accuracy"):
    return [results[k].get(field, float("nan")) for k in (f"{name}_s{s}_{mode}" for s in base.study.seeds)
            if k in results]


def write_report(base, results):
    """OUT.md: one row per configuration, the measured asynchrony and both modes' accuracy."""
    from experiments import studies

    s = base.study
    rows = []
    for i, name in enumerate(s.names):
        ms, _, _ = studies.mean_std(_vals(results, base, name, "runtime", "mean_staleness"))
        me, _, _ = studies.mean_std(_vals(results, base, name, "runtime", "mean_effective_staleness"))
        mb, _, _ = studies.mean_std(_vals(results, base, name, "runtime", "mean_minibatch"))
        up, _, _ = studies.mean_std(_vals(results, base, name, "runtime", "applied_updates"))
        rt, em = _vals(results, base, name, "runtime"), _vals(results, base, name, "emulator")
        d, _, _ = studies.mean_std(em)
        r, _, _ = studies.mean_std(rt)
        rows.append([name, s.learners[i], sub_batch(base, i), f"{1e3 * s.network_times[i]:g}", f"{ms:.2f}",
                     f"{me:.2f}", f"{mb:.1f}", f"{up:.0f}", studies.fmt_cell(rt), studies.fmt_cell(em), f"{100 * (d - r):+.2f}"])
    table = studies.markdown_table(["config", "learners", "sub-batch", "network ms", "mean staleness",
                                    "in non-empty updates", "mean mini-batch",
                                    "applied updates", "runtime top-1 %", "emulator top-1 %",
                                    "emulator - runtime"], rows)
    minutes = sum(r.get("seconds", 0) for r in results.values()) / 60
    text = (f"Model {base.model} on {base.dataset} at {base.image_size}x{base.image_size}, "
            f"{s.num_updates} published versions per runtime run, "
            f"{base.optimizer.name} momentum {base.optimizer.momentum}, lr schedule {base.lr.schedule}, seeds "
            f"{list(s.seeds)}. The emulator draws each update's delay (in non-empty updates: its delay buffer "
            f"stands still on an empty cycle) and sub-batch count from the measured pmfs "
            f"of the runtime run of the same seed and trains for its applied updates. Mean ± std over seeds. "
            f"Total run time {minutes:.0f} min.\n\n" + table + "\n")
    studies.write_markdown(_OUT.value + ".md", text)


if __name__ == "__main__":
    cli.run(main)
