r"""Final Polishing study: top-1 vs global batch for polish modes none / recompute / no_augment_epochs / both.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/study_polish.py \
      --config=experiments/configs/polish_study.py --out=docs/polish-study

Writes OUT.json (every run, resumable: finished cells are not rerun), OUT.md (mean ± std of top-1 over seeds
per cell), OUT.png (accuracy vs batch size, one line per mode) and OUT.config.json (the resolved config).
Every cell's config is checked before the first runs: a bad value ends the study at once with exit status 2.
"""
import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxsprint import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Study config (experiments/configs/polish_study.py).")
_OUT = flags.DEFINE_string("out", "docs/polish-study", "Output prefix for .json, .md and .png.")

MODES = ("none", "recompute", "no_augment_epochs", "both")
# Each training run serves two modes: "none" and "recompute" differ only after training (the recompute pass;
# "none" is the same run's EMA statistics), and so do "no_augment_epochs" and "both".
TRAIN_MODES = ("recompute", "both")


def validate_study(base) -> None:
    """Checks the study block: positive integer batch sizes, integer seeds.

    Raises:
      ConfigError: naming the first bad ``config.study`` field.
    """
    from experiments import studies
    from jaxsprint.errors import check

    studies.require_study(base, ("batch_sizes", "seeds"))
    for b in base.study.batch_sizes:
        check(isinstance(b, int) and not isinstance(b, bool) and b > 0, "config.study.batch_sizes", b,
              "allowed: positive integers")
    for seed in base.study.seeds:
        check(isinstance(seed, int) and not isinstance(seed, bool), "config.study.seeds", seed, "allowed: integers")


def cells(base):
    """Yields (key, training config) of every training run: batch x seed x TRAIN_MODES."""
    for b in base.study.batch_sizes:
        for seed in base.study.seeds:
            for train_mode in TRAIN_MODES:
                c = copy.deepcopy(base)
                with c.unlocked():
                    c.batch_size = int(b)
                    c.eval_batch_size = 512
                    c.seed = int(seed)
                    c.polish.mode = train_mode
                yield f"b{b}_s{seed}_{train_mode}", c


def main(argv):
    from experiments import studies
    from jaxsprint.errors import check

    check(len(argv) == 1, "arguments", argv[1:], "none besides flags")

    logging.set_verbosity(logging.WARNING)
    base = _CONFIG.value
    validate_study(base)
    def describe(key, r):
        if r["diverged"]:
            return f"{key}: diverged at step {r['diverged_step']} ({r['seconds']:.0f} s)"
        return (f"{key}: EMA {100 * r['eval_accuracy']:.2f}%  polished {100 * r['eval_polished_accuracy']:.2f}%"
                f"  ({r['seconds']:.0f} s)")

    results = studies.run_cells(_OUT.value, base, list(cells(base)), describe)
    write_report(base, results)


def cell_values(results, b, seeds, mode):
    train_mode = "recompute" if mode in ("none", "recompute") else "both"
    field = "eval_accuracy" if mode in ("none", "no_augment_epochs") else "eval_polished_accuracy"
    return [results[f"b{b}_s{s}_{train_mode}"][field] for s in seeds if f"b{b}_s{s}_{train_mode}" in results]


def write_report(base, results):
    from experiments import studies
    from jaxsprint.train import parallel

    devices = parallel.make_mesh(base.num_devices).size
    seeds, batches = list(base.study.seeds), list(base.study.batch_sizes)
    rows = []
    for b in batches:
        rows.append([str(b), str(b // devices)] + [studies.fmt_cell(cell_values(results, b, seeds, m))
                                                  for m in MODES])
    table = studies.markdown_table(["global batch", "per device (ghost BN)"] + [f"{m} top-1 %" for m in MODES],
                                   rows)
    minutes = sum(r.get("seconds", 0) for r in results.values()) / 60
    text = (f"Model {base.model} at {base.image_size}x{base.image_size}, {base.num_epochs} epochs, "
            f"{base.optimizer.name}, ghost BN per device on {devices} devices, seeds {seeds}; polishing pass over "
            f"the whole training set (iterated to convergence); no-augmentation epochs: "
            f"{base.polish.no_augment_epochs}. Test set: 297 images (one image = 0.34 points). "
            f"Total run time {minutes:.0f} min.\n\n" + table + "\n")
    studies.write_markdown(_OUT.value + ".md", text)
    plt = studies.pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for m in MODES:
        ms = [studies.mean_std(cell_values(results, b, seeds, m)) for b in batches]
        ax.errorbar(batches, [100 * x[0] for x in ms], yerr=[100 * x[1] for x in ms], marker="o", capsize=3,
                    label=m)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("global batch size")
    ax.set_ylabel("test top-1 (%)")
    ax.set_title("Final Polishing on digits (mean ± std over seeds)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(_OUT.value + ".png", dpi=120)


if __name__ == "__main__":
    cli.run(main)
