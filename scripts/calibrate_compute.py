"""Compute-time prediction on this machine: measure jitted CNN train steps, calibrate, predict.

Builds small VGG-like CNNs (conv 3x3 [+ batch norm] + ReLU [+ max pool], global average pool,
dense) with flax linen, measures a jitted SGD train step for each shape and batch size, fits the
efficiency fields of the ``cpu`` machine preset (:mod:`jaxsprint.perf.machines`) on half of them
and predicts the other half with :func:`jaxsprint.perf.sprint.device_step_time_s` from the same
layer spec (:class:`jaxsprint.perf.networks.Builder`). Prints a table and the fitted figures.

    .venv/bin/python scripts/calibrate_compute.py                 # measure (a few minutes) + fit
    .venv/bin/python scripts/calibrate_compute.py --measurements=docs/perf-calibration.json  # refit

Optional: nothing else depends on running it. The train step is a plain jitted SGD step (not the
project's ``jaxsprint.train`` step), with one CPU device.
"""
from __future__ import annotations

import json
import os
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from scipy import optimize

from jaxsprint.perf import machines, networks, sprint

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_shapes", 32, "CNN shapes x batch sizes to measure (>= 20).")
flags.DEFINE_integer("seed", 0, "Seed of the shape draw and of the calibration/test split.")
flags.DEFINE_string("measurements", None, "Reuse measurements from this JSON instead of measuring.")
flags.DEFINE_string("out", "docs/perf-calibration.json", "Where to write measurements and the fit.")
flags.DEFINE_float("min_time_s", 0.25, "Measure each step for at least this long per round.")
flags.DEFINE_integer("rounds", 3, "Interleaved measurement rounds (the best round's median is kept).")

FIT_FIELDS = ("efficiency_fwd", "efficiency_bwd_data", "efficiency_bwd_weight",
              "half_efficiency_rows", "half_efficiency_cols", "half_efficiency_depth",
              "memory_efficiency", "per_layer_overhead_s", "step_overhead_s")
_LOWER = (1e-4, 1e-4, 1e-4, 1e-2, 1e-2, 1e-2, 1e-3, 1e-9, 1e-7)
_UPPER = (1.0, 1.0, 1.0, 1e6, 1e4, 1e4, 1.0, 1e-2, 1.0)


class SmallCNN(nn.Module):
    """conv3x3 [+BN] + ReLU [+ maxpool 2] per entry of ``widths``, then GAP and a dense layer."""

    widths: tuple[int, ...]
    pools: tuple[bool, ...]
    bn: bool
    num_classes: int = 10

    @nn.compact
    def __call__(self, x, train: bool = True):
        for w, p in zip(self.widths, self.pools):
            x = nn.Conv(w, (3, 3), padding="SAME", use_bias=not self.bn)(x)
            if self.bn:
                x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
            x = nn.relu(x)
            if p:
                x = nn.max_pool(x, (2, 2), (2, 2))
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes)(x)


def spec_of(shape: dict) -> networks.NetworkCost:
    """The layer spec of :class:`SmallCNN` for the cost model."""
    b = networks.Builder((shape["size"], shape["size"], 3))
    for w, p in zip(shape["widths"], shape["pools"]):
        b.conv(w, 3, bias=not shape["bn"])
        if shape["bn"]:
            b.bn()
        b.relu()
        if p:
            b.pool(2, 2)
    b.global_avg_pool().dense(10)
    return b.build((shape["size"], shape["size"], 3), "small_cnn")


def draw_shapes(n: int, seed: int) -> list[dict]:
    """CNN shapes and batch sizes whose train step takes roughly 5-500 ms here."""
    rng = np.random.default_rng(seed)
    shapes = []
    while len(shapes) < n:
        size = int(rng.choice([16, 24, 32]))
        depth = int(rng.integers(2, 6))
        base = int(rng.choice([8, 16, 24, 32, 48]))
        pools = tuple(bool(i % 2 == 1) for i in range(depth))
        widths, w = [], base
        for p in pools:
            widths.append(w)
            if p:
                w = min(2 * w, 128)
        batch = int(rng.choice([8, 16, 32, 64, 128]))
        shape = dict(size=size, widths=tuple(widths), pools=pools, bn=bool(rng.random() < 0.5),
                     batch=batch)
        flops = float(spec_of(shape).total_train_flops) * batch
        if 2e7 <= flops <= 2e9 and shape not in shapes:
            shapes.append(shape)
    return shapes


def make_step(shape: dict):
    """A jitted SGD train step (forward, backward, update) of the shape, and its inputs."""
    model = SmallCNN(tuple(shape["widths"]), tuple(shape["pools"]), shape["bn"])
    x = jnp.ones((shape["batch"], shape["size"], shape["size"], 3), jnp.float32)
    y = jnp.zeros((shape["batch"],), jnp.int32)
    variables = model.init(jax.random.PRNGKey(0), x[:1])
    params, stats = variables["params"], variables.get("batch_stats", {})

    def loss_fn(p, s, x, y):
        if shape["bn"]:
            logits, new = model.apply({"params": p, "batch_stats": s}, x, mutable=["batch_stats"])
            s = new["batch_stats"]
        else:
            logits = model.apply({"params": p}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), s

    @jax.jit
    def step(p, s, x, y):
        (loss, s), g = jax.value_and_grad(loss_fn, has_aux=True)(p, s, x, y)
        return jax.tree_util.tree_map(lambda a, b: a - 0.01 * b, p, g), s, loss

    state = [params, stats]
    for _ in range(2):  # compile and warm up
        state[0], state[1], loss = step(state[0], state[1], x, y)
    jax.block_until_ready(loss)

    def run_once() -> float:
        t = time.perf_counter()
        state[0], state[1], loss = step(state[0], state[1], x, y)
        jax.block_until_ready(loss)
        return time.perf_counter() - t

    return run_once


def measure_all(shapes: list[dict], min_time_s: float, rounds: int) -> list[float]:
    """Seconds per step of each shape: the minimum over interleaved rounds of per-round medians.

    The machine is shared, so a round can be slowed down by other work; interleaving the shapes
    and keeping the best round's median makes the numbers repeatable to a few percent.
    """
    steps = []
    for i, shape in enumerate(shapes):
        steps.append(make_step(shape))
        print(f"compiled {i + 1}/{len(shapes)}", flush=True)
    best = [float("inf")] * len(shapes)
    for rnd in range(rounds):
        for i, run_once in enumerate(steps):
            times, start = [], time.perf_counter()
            while time.perf_counter() - start < min_time_s or len(times) < 5:
                times.append(run_once())
            best[i] = min(best[i], float(np.median(times)))
        print(f"round {rnd + 1}/{rounds} done", flush=True)
    return best


def predict_s(fig: dict, net: networks.NetworkCost, batch: int) -> float:
    """Model time of a train step: forward + backward + the SGD update (3 passes over 4P bytes)."""
    m = machines.with_figures(machines.get("cpu"), **fig)
    sgd = 3.0 * networks.BYTES_PER_VALUE * net.total_params / m.memory_bandwidth_bytes_per_s
    return float(sprint.device_step_time_s(net, m, batch) + sgd)


def fit(records: list[dict]) -> dict:
    """Least squares on log(predicted / measured) over the efficiency fields (in log space)."""
    base = machines.CPU_CALIBRATION
    x0 = np.log([base[f] for f in FIT_FIELDS])
    nets = [spec_of(r["shape"]) for r in records]

    def resid(x):
        fig = dict(zip(FIT_FIELDS, np.exp(x)))
        return [np.log(predict_s(fig, n, r["shape"]["batch"]) / r["measured_s"])
                for n, r in zip(nets, records)]

    x0 = np.clip(x0, np.log(_LOWER) + 1e-6, np.log(_UPPER) - 1e-6)
    sol = optimize.least_squares(resid, x0, bounds=(np.log(_LOWER), np.log(_UPPER)),
                                 diff_step=1e-3)
    return dict(zip(FIT_FIELDS, (float(v) for v in np.exp(sol.x))))


def main(argv):
    del argv
    if FLAGS.measurements:
        with open(FLAGS.measurements) as f:
            records = json.load(f)["records"]
    else:
        shapes = draw_shapes(FLAGS.num_shapes, FLAGS.seed)
        times = measure_all(shapes, FLAGS.min_time_s, FLAGS.rounds)
        records = [dict(shape=s, measured_s=t) for s, t in zip(shapes, times)]
    rng = np.random.default_rng(FLAGS.seed + 1)
    order = rng.permutation(len(records))
    cal = [records[i] for i in order[: len(records) // 2]]
    test = [records[i] for i in order[len(records) // 2:]]
    fig = fit(cal)
    rows = []
    for split, recs in (("calibrate", cal), ("test", test)):
        for r in recs:
            net = spec_of(r["shape"])
            pred = predict_s(fig, net, r["shape"]["batch"])
            err = pred / r["measured_s"] - 1.0
            rows.append((split, r["shape"], r["measured_s"], pred, err))
    print(f"\n{'split':10s} {'size':>4s} {'bn':>3s} {'batch':>5s} {'widths':24s} "
          f"{'GFLOP':>7s} {'measured ms':>11s} {'predicted ms':>12s} {'error':>7s}")
    for split, s, meas, pred, err in rows:
        gflop = float(spec_of(s).total_train_flops) * s["batch"] / 1e9
        print(f"{split:10s} {s['size']:4d} {int(s['bn']):3d} {s['batch']:5d} {str(s['widths']):24s} "
              f"{gflop:7.3f} {1e3 * meas:11.2f} {1e3 * pred:12.2f} {100 * err:+6.1f}%")
    summary = {}
    for split in ("calibrate", "test"):
        e = np.abs([r[4] for r in rows if r[0] == split])
        summary[split] = dict(n=int(e.size), median_abs_error=float(np.median(e)),
                              mean_abs_error=float(np.mean(e)), max_abs_error=float(np.max(e)))
        print(f"{split}: n={e.size} median |error| {100 * np.median(e):.1f}%, "
              f"mean {100 * np.mean(e):.1f}%, max {100 * np.max(e):.1f}%")
    print("\nfitted figures (paste into machines.CPU_CALIBRATION):")
    print(json.dumps({k: float(f"{v:.4g}") for k, v in fig.items()}, indent=2))
    if FLAGS.out:
        os.makedirs(os.path.dirname(FLAGS.out) or ".", exist_ok=True)
        with open(FLAGS.out, "w") as f:
            json.dump(dict(records=records, fit=fig, summary=summary,
                           machine="2-core AMD EPYC, JAX CPU, jax " + jax.__version__), f, indent=1)
        print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
    app.run(main)
