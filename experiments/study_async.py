r"""Asynchronous-SGD study: final accuracy and loss curves vs mean staleness, per distribution and mitigation.

  python experiments/study_async.py --config=experiments/configs/async_study.py --out=docs/async-study

Writes OUT.json (every run; resumable), OUT.md (mean ± std top-1 over seeds) and OUT.png (final accuracy vs
staleness, and loss curves for the constant-staleness runs), and OUT.config.json (the resolved config, with
every --config.<field> override). Every cell's config is checked before the first
runs: a bad value (an unknown distribution or mitigation too) ends the study at once with exit status 2.
"""
import copy
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxsprint import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Study config (experiments/configs/async_study.py).")
_OUT = flags.DEFINE_string("out", "docs/async-study", "Output prefix for .json, .md and .png.")

# Distributions of the staleness a cell can ask for (config.study.kinds), mapped to the emulator's samplers.
KINDS = ("constant", "geometric")


def validate_study(base) -> None:
    """Checks the study block: known distributions and mitigations, staleness >= 0 (whole for "constant"),
    integer seeds.

    Raises:
      ConfigError: naming the first bad ``config.study`` field.
    """
    from experiments import studies
    from jaxsprint.emulation import staleness
    from jaxsprint.errors import check

    studies.require_study(base, ("mean_staleness", "kinds", "mitigations", "seeds"))
    for kind in base.study.kinds:
        check(kind in KINDS, "config.study.kinds", kind, f"allowed: {', '.join(KINDS)}")
    for mit in base.study.mitigations:
        check(mit in staleness.MITIGATIONS, "config.study.mitigations", mit,
              f"allowed: {', '.join(staleness.MITIGATIONS)}")
    for mean in base.study.mean_staleness:
        check(isinstance(mean, (int, float)) and not isinstance(mean, bool) and math.isfinite(mean) and mean >= 0,
              "config.study.mean_staleness", mean, "allowed: finite numbers >= 0")
        check(float(mean).is_integer() or "constant" not in base.study.kinds, "config.study.mean_staleness", mean,
              "allowed: whole numbers when config.study.kinds has 'constant'")
    for seed in base.study.seeds:
        check(isinstance(seed, int) and not isinstance(seed, bool), "config.study.seeds", seed, "allowed: integers")


def cell_config(base, mean, kind, mitigation, seed):
    """The training config of one cell: constant staleness `mean`, or geometric with that mean (truncated at
    4x the mean, at most 64)."""
    c = copy.deepcopy(base)
    with c.unlocked():
        a = c.async_emulation
        c.seed = int(seed)
        a.mitigation = mitigation
        if kind == "constant" or mean == 0:
            a.sampler, a.staleness, a.max_staleness = "constant", int(mean), int(mean)
        else:
            a.sampler, a.mean_staleness, a.max_staleness = "geometric", float(mean), int(min(4 * mean, 64))
    return c


def cells(base):
    """Yields (key, (mean, kind, mitigation, seed)) of every cell, staleness 0 once for all distributions."""
    for mean in base.study.mean_staleness:
        for kind in base.study.kinds:
            if mean == 0 and kind != base.study.kinds[0]:
                continue  # staleness 0 is the same run for every distribution
            for mit in base.study.mitigations:
                for seed in base.study.seeds:
                    yield f"tau{mean}_{kind}_{mit}_s{seed}", (mean, kind, mit, seed)


def main(argv):
    from experiments import studies
    from jaxsprint.errors import check

    check(len(argv) == 1, "arguments", argv[1:], "none besides flags")

    logging.set_verbosity(logging.WARNING)
    base = _CONFIG.value
    validate_study(base)
    def describe(key, r):
        status = f"diverged at step {r['diverged_step']}" if r["diverged"] else f"{100 * r['eval_accuracy']:.2f}%"
        return f"{key}: {status} ({r['seconds']:.0f} s)"

    todo = [(key, cell_config(base, *args)) for key, args in cells(base)]
    results = studies.run_cells(_OUT.value, base, todo, describe)
    write_report(base, results)


def values(results, base, mean, kind, mit, field="eval_accuracy"):
    kind = base.study.kinds[0] if mean == 0 else kind
    return [results[k][field] for k in (f"tau{mean}_{kind}_{mit}_s{s}" for s in base.study.seeds) if k in results]


def write_report(base, results):
    from experiments import studies

    rows = []
    for mean in base.study.mean_staleness:
        for kind in base.study.kinds:
            if mean == 0 and kind != base.study.kinds[0]:
                continue
            rows.append([str(mean), "any" if mean == 0 else kind] +
                        [studies.fmt_cell(values(results, base, mean, kind, m)) for m in base.study.mitigations])
    table = studies.markdown_table(["mean staleness", "distribution"] +
                                   [f"{m} top-1 %" for m in base.study.mitigations], rows)
    minutes = sum(r.get("seconds", 0) for r in results.values()) / 60
    text = (f"Model {base.model} at {base.image_size}x{base.image_size}, batch {base.batch_size}, "
            f"{base.num_train_steps} updates, {base.optimizer.name} momentum {base.optimizer.momentum}, peak lr "
            f"{base.lr.base * base.batch_size / base.lr.reference_batch:g} (cosine), seeds "
            f"{list(base.study.seeds)}; geometric staleness truncated at 4x its mean (max 64); DC-ASGD lambda "
            f"{base.async_emulation.dc_lambda}. Test set: 297 images. Total run time {minutes:.0f} min.\n\n"
            + table + "\n")
    studies.write_markdown(_OUT.value + ".md", text)
    plt = studies.pyplot()
    if plt is None:
        return
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    means = list(base.study.mean_staleness)
    for kind in base.study.kinds:
        for mit in base.study.mitigations:
            ms = [studies.mean_std(values(results, base, m, kind, mit)) for m in means]
            ax1.errorbar([max(m, 0.5) for m in means], [100 * x[0] for x in ms], yerr=[100 * x[1] for x in ms],
                         marker="o" if kind == "constant" else "s", capsize=3,
                         linestyle="-" if kind == "constant" else "--", label=f"{kind}, {mit}")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("mean staleness (0 drawn at 0.5)")
    ax1.set_ylabel("test top-1 (%)")
    ax1.set_title("Final accuracy (mean ± std over seeds; missing = diverged)")
    ax1.legend(fontsize=7)
    ax1.grid(alpha=0.3)
    cmap = plt.get_cmap("viridis")
    for i, mean in enumerate(means):
        for mit, style in zip(base.study.mitigations, ("-", "--", ":", "-.")):
            key = f"tau{mean}_{base.study.kinds[0]}_{mit}_s{base.study.seeds[0]}"
            curve = results.get(key, {}).get("loss_curve", [])
            if curve:
                x, y = zip(*curve)
                ax2.plot(x, np.minimum(y, 10.0), style, color=cmap(i / max(len(means) - 1, 1)),
                         label=f"tau={mean}, {mit}" if mit == base.study.mitigations[0] or i == 0 else None)
    ax2.set_xlabel("update")
    ax2.set_ylabel("train loss (clipped at 10)")
    ax2.set_title(f"Loss curves, {base.study.kinds[0]} staleness, seed {base.study.seeds[0]}")
    ax2.legend(fontsize=7, ncol=2)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(_OUT.value + ".png", dpi=110)


if __name__ == "__main__":
    cli.run(main)
