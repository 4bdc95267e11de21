"""Compute-time prediction on this machine: measure jitted CNN train steps, calibrate, predict.

Builds small VGG-like CNNs (conv 3x3 [+ batch norm] + ReLU [+ max pool], global average pool,
dense) with flax linen, measures a jitted SGD train step for each shape and batch size, fits the
efficiency fields of the ``cpu`` machine preset (:mod:`jaxsprint.perf.machines`) on half of them
and predicts the other half with :func:`jaxsprint.perf.sprint.device_step_time_s` from the same
layer spec (:class:`jaxsprint.perf.networks.Builder`). Prints a table and the fitted figures.

    .venv/bin/python scripts/calibrate_compute.py                 # measure (a few minutes) + fit
    .venv/bin/python scripts/calibrate_compute.py --measurements=docs/perf-calibration.json  # refit

Optional: nothing else depends on running it. The train step is a plain jitted SGD step (not the
project's ``jaxsprint.train`` step) on one CPU device with XLA single-threaded, and the time is the
process CPU time of a step: the machine is shared with other work, which inflates wall-clock
times unpredictably but hardly changes the CPU time of a single-threaded step. The ``cpu``
preset therefore models one learner per core (peak 78.5 GFLOP/s = 157 / 2).
"""
from __future__ import annotations

import json
import os
import time

# One XLA:CPU thread, set before JAX starts (see the module docstring).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
                           " intra_op_parallelism_threads=1").strip()

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from scipy import optimize

from jaxsprint.perf import machines, networks, sprint

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_shapes", 40, "CNN shapes x batch sizes to measure (>= 20).")
flags.DEFINE_integer("seed", 0, "Seed of the shape draw and of the calibration/test split.")
flags.DEFINE_list("measurements", None, "Reuse measurements from these JSON files instead of "
                  "measuring (several runs: the per-shape minimum is kept).")
flags.DEFINE_string("out", "docs/perf-calibration.json", "Where to write measurements and the fit.")
flags.DEFINE_float("min_time_s", 0.25, "Measure each step for at least this long per round.")
flags.DEFINE_list("project_models", ["resnet8", "resnet20"],
                  "This project's flax models (jaxsprint.models) whose train step "
                  "(jaxsprint.train.make_train_step) is measured and predicted as an extra held-out "
                  "check (empty: skip).")
flags.DEFINE_list("project_batches", ["16", "64"], "Batch sizes of the project-model check.")
flags.DEFINE_integer("rounds", 4, "Interleaved measurement rounds (the best round's median is kept).")

# (field, lower bound, upper bound) of the fitted figures; the others keep the preset's values.
# The input-gradient pass runs the forward convolution kernel on XLA:CPU (per-layer measurements
# give the same speed), so its efficiency is tied to the forward one; the forward pass showed no
# working-set slowdown, and the saturation exponent is fixed at 2. Nine figures are fitted.
FIT = (("efficiency_fwd", 1e-2, 1.0), ("efficiency_bwd_weight", 1e-2, 1.0),
       ("half_efficiency_rows", 1.0, 1e4), ("half_efficiency_cols", 0.1, 1e3),
       ("half_efficiency_depth", 0.1, 1e3), ("cache_bytes", 1e5, 1e9),
       ("cache_miss_slowdown_weight_grad", 1e-3, 10.0), ("norm_memory_efficiency", 1e-3, 1.0),
       ("maxpool_backward_memory_efficiency", 1e-3, 1.0))
TIED = {"efficiency_bwd_data": "efficiency_fwd"}
FIXED = {"efficiency_sharpness": 2.0, "cache_miss_slowdown": 0.0, "memory_efficiency": 1.0,
         "per_layer_overhead_s": 2e-6, "step_overhead_s": 2e-5}
FIT_FIELDS = tuple(f for f, _, _ in FIT)
_LOWER = tuple(lo for _, lo, _ in FIT)
_UPPER = tuple(hi for _, _, hi in FIT)


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
        t = time.process_time()
        state[0], state[1], loss = step(state[0], state[1], x, y)
        jax.block_until_ready(loss)
        return time.process_time() - t

    return run_once


def measure_all(shapes: list[dict], min_time_s: float, rounds: int) -> list[float]:
    """CPU seconds per step of each shape: the minimum over interleaved rounds of round medians.

    Interleaving the shapes and keeping the best round's median makes the numbers repeatable to a
    few percent even while other processes share the cores.
    """
    steps = []
    for i, shape in enumerate(shapes):
        steps.append(make_step(shape))
        print(f"compiled {i + 1}/{len(shapes)}", flush=True)
    best = [float("inf")] * len(shapes)
    for rnd in range(rounds):
        for i, run_once in enumerate(steps):
            times, start = [], time.perf_counter()
            while time.perf_counter() - start < min_time_s or len(times) < 7:
                times.append(run_once())
            best[i] = min(best[i], float(np.median(times)))
        print(f"round {rnd + 1}/{rounds} done", flush=True)
    return best


@jax.jit
def _step_time_s(machine: machines.Machine, net: networks.NetworkCost, batch: jax.Array) -> jax.Array:
    sgd = 3.0 * networks.BYTES_PER_VALUE * net.total_params / machine.memory_bandwidth_bytes_per_s
    return sprint.device_step_time_s(net, machine, batch) + sgd


def project_model_check(fig: dict) -> list[tuple[str, int, float, float]]:
    """Measures this project's own train step for its CIFAR ResNets and predicts it (held out).

    Returns ``[(model, batch, measured_s, predicted_s)]``.
    """
    from jaxsprint import models as project_models
    from jaxsprint import train as project_train

    out = []
    for name in FLAGS.project_models:
        model = project_models.create_model(name, num_classes=10)
        step = jax.jit(project_train.make_train_step(model=model, num_classes=10))
        net = networks.get(name)
        for batch in map(int, FLAGS.project_batches):
            state = project_train.create_train_state(jax.random.PRNGKey(0), model,
                                                     optax.sgd(0.1, momentum=0.9), (1, 32, 32, 3))
            x = jnp.ones((batch, 32, 32, 3), jnp.float32)
            y = jnp.zeros((batch,), jnp.int32)
            holder = [state]

            def run_once() -> float:
                t = time.process_time()
                holder[0], metrics = step(holder[0], x, y)
                jax.block_until_ready(metrics)
                return time.process_time() - t

            run_once(), run_once()  # compile, warm up
            best = min(float(np.median([run_once() for _ in range(5)])) for _ in range(FLAGS.rounds))
            # The project's step also runs the momentum update: 5 passes over 4P bytes.
            pred = predict_s(fig, net, batch)
            out.append((name, batch, best, pred))
            print(f"project {name} batch {batch}: measured {1e3 * best:.1f} ms, predicted "
                  f"{1e3 * pred:.1f} ms ({100 * (pred / best - 1):+.1f}%)", flush=True)
    return out


def predict_s(fig: dict, net: networks.NetworkCost, batch: int) -> float:
    """Model time of a train step: forward + backward + the SGD update (3 passes over 4P bytes)."""
    m = machines.with_figures(machines.get("cpu"), **fig)
    return float(_step_time_s(m, net, jnp.float32(batch)))


def fit(records: list[dict]) -> dict:
    """Least squares on log(predicted / measured) over the efficiency fields (in log space).

    The residuals and their exact Jacobian come from JAX (the model is pure jnp); a few starting
    points guard against local minima.
    """
    nets = [spec_of(r["shape"]) for r in records]
    batches = [float(r["shape"]["batch"]) for r in records]
    log_measured = jnp.log(jnp.asarray([r["measured_s"] for r in records], jnp.float32))
    base = machines.get("cpu")

    def resid(x):
        m = base.replace(**_figures(x))
        pred = jnp.stack([_step_time_s(m, n, jnp.float32(b)) for n, b in zip(nets, batches)])
        return jnp.log(pred) - log_measured

    resid_jit, jac_jit = jax.jit(resid), jax.jit(jax.jacfwd(resid))
    lo, hi = np.log(_LOWER), np.log(_UPPER)
    rng = np.random.default_rng(0)
    best = None
    x_preset = np.log([float(getattr(base, f)) for f in FIT_FIELDS])
    base = base.replace(**{k: jnp.float32(v) for k, v in FIXED.items()})
    for start in range(6):
        x0 = x_preset if start == 0 else rng.uniform(lo + 0.1 * (hi - lo), hi - 0.1 * (hi - lo))
        x0 = np.clip(x0, lo + 1e-6, hi - 1e-6)
        sol = optimize.least_squares(
            lambda x: np.asarray(resid_jit(jnp.asarray(x, jnp.float32)), np.float64), x0,
            jac=lambda x: np.asarray(jac_jit(jnp.asarray(x, jnp.float32)), np.float64),
            bounds=(lo, hi), loss="soft_l1", f_scale=0.1)
        if best is None or sol.cost < best.cost:
            best = sol
    return {k: float(v) for k, v in _figures(best.x).items()}


def _figures(log_x) -> dict:
    """All calibrated figures from the fitted log-values (plus the tied and fixed ones)."""
    fig = {f: jnp.exp(log_x[i]) for i, f in enumerate(FIT_FIELDS)}
    fig.update({k: fig[v] for k, v in TIED.items()})
    fig.update({k: jnp.float32(v) for k, v in FIXED.items()})
    return fig


def main(argv):
    del argv
    if FLAGS.measurements:
        best: dict[str, dict] = {}
        for path in FLAGS.measurements:
            with open(path) as f:
                for r in json.load(f)["records"]:
                    key = json.dumps(r["shape"], sort_keys=True)
                    if key not in best or r["measured_s"] < best[key]["measured_s"]:
                        best[key] = r
        records = list(best.values())
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
    project = project_model_check(fig) if FLAGS.project_models else []
    if project:
        e = np.abs([p / m - 1 for _, _, m, p in project])
        summary["project_models"] = dict(n=int(e.size), median_abs_error=float(np.median(e)),
                                         rows=[list(r) for r in project])
        print(f"project models (held out): n={e.size} median |error| {100 * np.median(e):.1f}%")
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
