r"""Final Polishing of an existing run: recompute BN statistics from un-augmented training images, evaluate.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/polish.py \
      --config=experiments/configs/default.py --workdir=runs/demo-... [--config.polish.num_samples=-1]

Reads the latest checkpoint in --workdir (trained with the same --config), prints top-1 accuracy and loss
with the EMA statistics and with the recomputed ones, side by side, and writes both to
WORKDIR/polish.json and the polished statistics to WORKDIR/polished_batch_stats/ (orbax). The run's own
checkpoints are left as they are.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxsprint.errors import JaxsprintError  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "The run's ml_collections config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "The run's directory (with checkpoints/).")


def main(argv):
    del argv
    quiet = not flags.FLAGS["verbosity"].present
    try:
        import jax
        import orbax.checkpoint as ocp

        from jaxsprint import hostmem, train

        hostmem.configure()  # before JAX starts its threads (see jaxsprint/hostmem.py)

        if quiet:
            logging.set_verbosity(logging.WARNING)
        if _CONFIG.value is None or not _WORKDIR.value:
            raise JaxsprintError("--config and --workdir are required")
        ckpt_dir = os.path.join(_WORKDIR.value, "checkpoints")
        if not os.path.isdir(ckpt_dir):
            raise JaxsprintError(f"invalid --workdir={_WORKDIR.value!r}: it holds no checkpoints/ directory")
        exp = train.build_experiment(_CONFIG.value)
        state = exp.init_state()
        manager = train._checkpoint_manager(_WORKDIR.value, _CONFIG.value.keep_checkpoints)
        template = {"polished_batch_stats": state.batch_stats, "polished": jax.numpy.zeros((), jax.numpy.int32)}
        restored = train.restore_checkpoint(manager, state, template)
        if restored is None:
            raise JaxsprintError(f"invalid --workdir={_WORKDIR.value!r}: no checkpoint found in {ckpt_dir}")
        state, _, step = restored
        before = exp.evaluate({"params": state.params, "batch_stats": state.batch_stats})
        t0 = time.time()
        info = {}
        stats = train.run_polish(exp, state, info)
        seconds = time.time() - t0
        after = exp.evaluate({"params": state.params, "batch_stats": stats})
    except JaxsprintError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    result = {"step": int(step), "ema_accuracy": before["accuracy"], "ema_loss": before["loss"],
              "polished_accuracy": after["accuracy"], "polished_loss": after["loss"], "polish_time_s": seconds,
              "num_samples": _CONFIG.value.polish.num_samples, "num_passes": info["passes"], "last_change": info["change"]}
    out_dir = os.path.abspath(os.path.join(_WORKDIR.value, "polished_batch_stats"))
    if jax.process_index() == 0:
        with open(os.path.join(_WORKDIR.value, "polish.json"), "w") as f:
            json.dump(result, f, indent=2)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(out_dir, jax.device_get(stats), force=True)
    ckptr.wait_until_finished()
    print(train._summary_table([
        ("checkpoint step", str(step)),
        ("eval top-1, EMA statistics", f"{100 * before['accuracy']:.2f}%"),
        ("eval top-1, polished statistics", f"{100 * after['accuracy']:.2f}%"),
        ("eval loss, EMA / polished", f"{before['loss']:.4f} / {after['loss']:.4f}"),
        ("polishing", f"{info['passes']} passes, {seconds:.1f} s"),
    ]))


if __name__ == "__main__":
    from jaxsprint.cli import parse_flags

    app.run(main, flags_parser=parse_flags)
