r"""Validates the SPRINT model against the discrete-event simulator over random configurations.

    .venv/bin/python experiments/validate_model.py \
        --config=experiments/configs/validate_model.py     # about 2-3 minutes on 2 cores
    .venv/bin/python experiments/validate_model.py --config.num_configs=40 --config.num_deterministic=10 \
        --config.num_lognormal=0 --config.speed_configs=100000 --out_json= --plot=   # quick look, ~1 minute

The experiment's settings are the config file's (the default of ``--config``); the flags name outputs only.

Draws configurations (workers 1-4,096 and T_u / T_c 0.01-100 log-uniform, cv uniform on
[0.005, 0.5], sub-batch 1-256 log-uniform, T_c 0.01-1 s), runs the model
(:mod:`jaxsprint.perf.sprint`) and the simulator (:mod:`jaxsprint.perf.simulate`) on each and
prints, separately for cv = 0, cv > 0 (gamma jitter, the model's family) and lognormal jitter:

* relative error of the mean mini-batch and of the mean staleness;
* total-variation distance of both pmfs, at integer resolution and on at most 32 bins, each with
  its sampling-noise floor (the TV of a sample of the same size drawn from the model's pmf);
* relative error of the epoch time.

It also measures speed: configurations per second of one jitted, vmapped model call (summary
statistics; pmfs) and of the simulator. Writes a JSON of the results (with the resolved config under
``"config"``) and a PNG plot.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import flags  # noqa: E402

from jaxsprint import cli  # noqa: E402
from jaxsprint.errors import check  # noqa: E402
from jaxsprint.perf import machines, simulate, sprint, zoo  # noqa: E402

_CONFIG = cli.define_config_file(
    "config", os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "validate_model.py"),
    "The validation's ml_collections config (experiments/configs/validate_model.py).")
_OUT_JSON = flags.DEFINE_string("out_json", "docs/perf-validation.json", "Summary and config (empty: do not write).")
_ROWS_JSON = flags.DEFINE_string("rows_json", "", "Per-configuration results (empty: do not write).")
_PLOT = flags.DEFINE_string("plot", "docs/perf-validation.png", "Plot (empty: do not write).")
_OUTPUTS = {"out_json": _OUT_JSON, "rows_json": _ROWS_JSON, "plot": _PLOT}

DATASET = sprint.IMAGENET_TRAIN_IMAGES
MAX_BINS = 32


def draw(rng: np.random.Generator, n: int, mode: str) -> list[dict]:
    """Random configurations; ``mode`` is "deterministic", "gamma" or "lognormal"."""
    out = []
    for _ in range(n):
        workers = int(round(math.exp(rng.uniform(0.0, math.log(4096)))))
        ratio = math.exp(rng.uniform(math.log(0.01), math.log(100.0)))
        tc = math.exp(rng.uniform(math.log(0.01), math.log(1.0)))
        cv = 0.0 if mode == "deterministic" else float(rng.uniform(0.005, 0.5))
        sub_batch = int(round(math.exp(rng.uniform(0.0, math.log(256)))))
        out.append(dict(workers=workers, ratio=ratio, t_compute_s=tc, t_update_s=ratio * tc, cv=cv,
                        sub_batch=sub_batch, jitter="lognormal" if mode == "lognormal" else "gamma"))
    return out


def sim_cycles(workers: int, ratio: float) -> int:
    """Cycles to simulate: enough cycles and gradients for the histograms, within the budget."""
    per_cycle = workers * ratio
    c = _CONFIG.value
    cycles = max(c.min_cycles, c.min_gradients / per_cycle)
    if per_cycle * cycles > c.event_budget:
        cycles = max(c.event_budget / per_cycle, 200)
    return int(cycles)


def model_pmfs(cfgs: list[dict]) -> list[tuple]:
    """Model pmfs of all configurations, vmapped in chunks with shared window sizes."""
    sizes = [sprint.suggest_windows(c["workers"], c["t_compute_s"], c["t_update_s"], c["cv"])
             for c in cfgs]
    win = {k: max(s[k] for s in sizes) for k in sizes[0]}
    f = jax.jit(jax.vmap(lambda n, tc, tu, cv: sprint.distributions(n, tc, tu, cv, **win)))
    out = []
    chunk = 64
    ones = jnp.ones((chunk,), jnp.float32)
    jax.block_until_ready(f(ones, ones, ones, 0.1 * ones))  # compile outside the timing
    t0 = time.perf_counter()
    for lo in range(0, len(cfgs), chunk):
        part = cfgs[lo: lo + chunk]
        pad = part + [part[-1]] * (chunk - len(part))  # one shape, one compilation
        arr = lambda k: jnp.asarray([c[k] for c in pad], jnp.float32)  # noqa: E731
        d = f(arr("workers"), arr("t_compute_s"), arr("t_update_s"), arr("cv"))
        d = jax.tree_util.tree_map(np.asarray, d)
        for i in range(len(part)):
            out.append((int(d.count_offset[i]), d.count_pmf[i].astype(np.float64),
                        int(d.staleness_offset[i]), d.staleness_pmf[i].astype(np.float64),
                        float(d.var_count[i]), float(d.var_staleness[i])))
    return out, win, time.perf_counter() - t0


def _on_support(offset: int, pmf: np.ndarray, hist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    size = max(offset + pmf.size, hist.size)
    model = np.zeros(size)
    model[offset: offset + pmf.size] = pmf
    emp = np.zeros(size)
    emp[: hist.size] = hist / max(hist.sum(), 1)
    return model, emp


def _bins(model: np.ndarray) -> np.ndarray:
    """Bin edges (integer) over the model's support so that there are at most MAX_BINS bins."""
    cdf = np.cumsum(model)
    lo = int(np.searchsorted(cdf, 1e-4))
    hi = int(np.searchsorted(cdf, 1 - 1e-4)) + 1
    width = max(1, math.ceil((hi - lo) / MAX_BINS))
    inner = np.arange(lo, hi + width, width)
    return np.unique(np.concatenate([[0], inner, [model.size]]))


def tv(model: np.ndarray, emp: np.ndarray, edges: np.ndarray | None = None) -> float:
    if edges is not None:
        model, emp = np.add.reduceat(model, edges[:-1]), np.add.reduceat(emp, edges[:-1])
    return 0.5 * float(np.abs(model - emp).sum())


def noise_floor(rng: np.random.Generator, model: np.ndarray, n: int,
                edges: np.ndarray) -> tuple[float, float]:
    """TV (raw, binned) of an ``n``-sample histogram drawn from the model itself."""
    p = np.clip(model, 0, None)
    sample = rng.multinomial(int(n), p / p.sum()) / max(int(n), 1)
    return tv(model, sample), tv(model, sample, edges)


def evaluate(cfgs: list[dict], seed: int) -> tuple[list[dict], float, float, dict]:
    """Model vs simulator on each configuration; returns rows, model pmf time, simulator time."""
    pmfs, win, t_model = model_pmfs(cfgs)
    rng = np.random.default_rng(seed + 12345)
    rows, t_sim = [], 0.0
    for i, (c, (c_off, c_pmf, s_off, s_pmf, var_c, var_s)) in enumerate(zip(cfgs, pmfs)):
        t0 = time.perf_counter()
        cycles = sim_cycles(c["workers"], c["ratio"])
        s = simulate.simulate(c["workers"], c["t_compute_s"], c["t_update_s"], c["cv"],
                              n_cycles=cycles, jitter=c["jitter"], seed=seed + i)
        epoch_sim = simulate.simulate_epoch_time_s(c["workers"], c["t_compute_s"], c["cv"],
                                                   sub_batch=c["sub_batch"], dataset_size=DATASET,
                                                   jitter=c["jitter"], seed=seed + i)
        t_sim += time.perf_counter() - t0
        p = sprint.predict_from_timings(c["workers"], c["t_compute_s"], c["t_update_s"],
                                        c["sub_batch"], DATASET)
        row = dict(c, cycles=s.n_cycles, gradients=s.n_gradients)
        row["err_mean_minibatch"] = c["sub_batch"] * s.mean_count / float(p.mean_minibatch) - 1
        row["err_mean_staleness"] = s.mean_staleness / float(p.mean_staleness) - 1
        row["err_epoch_time"] = epoch_sim / float(p.epoch_time_s) - 1
        row["err_var_minibatch"] = s.var_count / max(var_c, 1e-12) - 1 if var_c > 1e-6 else 0.0
        row["err_var_staleness"] = s.var_staleness / max(var_s, 1e-12) - 1 if var_s > 1e-6 else 0.0
        for name, off, pmf, hist, n in (("minibatch", c_off, c_pmf, s.count_hist, s.n_cycles),
                                        ("staleness", s_off, s_pmf, s.staleness_hist, s.n_gradients)):
            model, emp = _on_support(off, pmf, hist)
            edges = _bins(model)
            row[f"tv_{name}"] = tv(model, emp)
            row[f"tv_{name}_binned"] = tv(model, emp, edges)
            floor = noise_floor(rng, model, n, edges)
            row[f"tv_{name}_floor"], row[f"tv_{name}_binned_floor"] = floor
        rows.append(row)
        if (i + 1) % 50 == 0:
            print(f"  {i + 1}/{len(cfgs)} configurations, simulator {t_sim:.0f} s", flush=True)
    return rows, t_model, t_sim, win


METRICS = ("err_mean_minibatch", "err_mean_staleness", "err_epoch_time", "tv_minibatch",
           "tv_minibatch_floor", "tv_minibatch_binned", "tv_minibatch_binned_floor", "tv_staleness",
           "tv_staleness_floor", "tv_staleness_binned", "tv_staleness_binned_floor",
           "err_var_minibatch", "err_var_staleness")


def summarize(rows: list[dict]) -> dict[str, dict[str, float]]:
    out = {}
    for m in METRICS:
        v = np.abs([r[m] for r in rows])
        out[m] = dict(median=float(np.median(v)), p95=float(np.percentile(v, 95)),
                      max=float(np.max(v)))
    return out


def print_table(title: str, s: dict, n: int) -> None:
    print(f"\n{title} ({n} configurations)")
    print(f"  {'metric':30s} {'median':>9s} {'p95':>9s} {'max':>9s}")
    for m in METRICS:
        scale, unit = (100.0, "%") if m.startswith("err") else (1.0, "")
        v = s[m]
        print(f"  {m:30s} {scale * v['median']:8.3f}{unit} {scale * v['p95']:8.3f}{unit} "
              f"{scale * v['max']:8.3f}{unit}")


def speed() -> dict[str, float]:
    """Configurations per second of jitted, vmapped model calls."""
    n = _CONFIG.value.speed_configs
    rng = np.random.default_rng(0)
    net, m = zoo.get("resnet50"), machines.get("tsubame_kfc_dl")
    nodes = jnp.asarray(rng.integers(1, 65, n), jnp.float32)
    gpus = jnp.asarray(rng.integers(1, 9, n), jnp.float32)
    sub = jnp.asarray(rng.integers(1, 97, n), jnp.float32)
    f = jax.jit(jax.vmap(lambda a, b, c: sprint.predict(net, m, a, b, c)))

    def best(fn, *args):
        jax.block_until_ready(fn(*args))
        times = []
        for _ in range(3):
            t = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.append(time.perf_counter() - t)
        return min(times)

    out = {"spec_summary_configs_per_s": n / best(f, nodes, gpus, sub)}
    workers = jnp.asarray(rng.integers(1, 4097, n), jnp.float32)
    tc = jnp.asarray(rng.uniform(0.01, 1.0, n), jnp.float32)
    tu = tc * jnp.asarray(np.exp(rng.uniform(math.log(0.01), math.log(100), n)), jnp.float32)
    g = jax.jit(jax.vmap(sprint.predict_from_timings))
    out["timings_summary_configs_per_s"] = n / best(g, workers, tc, tu, sub)
    return out


def plot(path: str, groups: dict[str, list[dict]]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for name, rows in groups.items():
        r = np.array([x["ratio"] for x in rows])
        axes[0].loglog(r, np.maximum(np.abs([x["err_mean_minibatch"] for x in rows]), 1e-6), ".",
                       ms=3, label=f"{name}: mini-batch")
        axes[0].loglog(r, np.maximum(np.abs([x["err_mean_staleness"] for x in rows]), 1e-6), "x",
                       ms=3, label=f"{name}: staleness")
        for k, mark in (("minibatch", "."), ("staleness", "x")):
            axes[1].loglog([x[f"tv_{k}_binned_floor"] + 1e-5 for x in rows],
                           [x[f"tv_{k}_binned"] + 1e-5 for x in rows], mark, ms=3,
                           label=f"{name}: {k}")
    axes[0].axhline(0.02, color="k", lw=0.8, ls="--")
    axes[0].set(xlabel="T_u / T_c", ylabel="|relative error| of the mean", title="means vs simulator")
    lim = [1e-5, 1]
    axes[1].plot(lim, lim, "k-", lw=0.8)
    axes[1].axhline(0.05, color="k", lw=0.8, ls="--")
    axes[1].set(xlabel="sampling-noise floor of TV", ylabel="TV(model, simulator), <= 32 bins",
                title="pmfs vs simulator")
    for ax in axes[:2]:
        ax.legend(fontsize=6)
    rows = groups["cv > 0"]
    axes[2].hist([x["tv_minibatch_binned"] for x in rows], bins=40, alpha=0.6, label="mini-batch")
    axes[2].hist([x["tv_staleness_binned"] for x in rows], bins=40, alpha=0.6, label="staleness")
    axes[2].set(xlabel="TV (cv > 0, <= 32 bins)", ylabel="configurations", title="TV distribution")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# Upper bounds of the counts: each configuration is simulated (seconds each), and the speed test holds a few
# float32 arrays of config.speed_configs entries (10^8: a few GB).
MAX_CONFIGS = 100_000
MAX_SPEED_CONFIGS = 100_000_000


def check_config(c) -> None:
    """Counts, budgets, the seed and the output paths must be usable before anything runs."""
    for name in ("num_configs", "num_deterministic", "num_lognormal", "speed_configs", "min_cycles",
                 "min_gradients", "seed"):
        check(isinstance(c[name], int) and not isinstance(c[name], bool), f"config.{name}", c[name], "an integer")
    for name in ("num_configs", "num_deterministic", "num_lognormal"):
        check(0 <= c[name] <= MAX_CONFIGS, f"config.{name}", c[name],
              f"an integer in [0, {MAX_CONFIGS:,}] (random configurations, each simulated)")
    check(c.num_configs + c.num_deterministic + c.num_lognormal > 0, "config.num_configs", c.num_configs,
          "configurations to validate: config.num_configs, num_deterministic or num_lognormal > 0")
    check(0 <= c.speed_configs <= MAX_SPEED_CONFIGS, "config.speed_configs", c.speed_configs,
          f"an integer in [0, {MAX_SPEED_CONFIGS:,}] (0: no speed test)")
    for name in ("min_cycles", "min_gradients"):
        check(c[name] >= 1, f"config.{name}", c[name], "an integer >= 1")
    check(isinstance(c.event_budget, (int, float)) and math.isfinite(c.event_budget) and c.event_budget > 0,
          "config.event_budget", c.event_budget, "a finite number > 0")
    check(0 <= c.seed < 2**31, "config.seed", c.seed, "an integer in [0, 2^31)")
    for name, flag in _OUTPUTS.items():
        if flag.value:
            cli.check_output_file(f"--{name}", flag.value)


def main(argv):
    check(len(argv) == 1, "arguments", argv[1:], "none besides --flags")
    c = _CONFIG.value
    check_config(c)
    rng = np.random.default_rng(c.seed)
    groups_cfg = {"cv = 0": draw(rng, c.num_deterministic, "deterministic"),
                  "cv > 0": draw(rng, c.num_configs, "gamma"),
                  "lognormal cv > 0": draw(rng, c.num_lognormal, "lognormal")}
    groups, summaries, timing = {}, {}, {}
    for k, (name, cfgs) in enumerate(groups_cfg.items()):
        if not cfgs:
            continue
        print(f"{name}: {len(cfgs)} configurations", flush=True)
        rows, t_model, t_sim, win = evaluate(cfgs, c.seed + 100_000 * k)
        groups[name], summaries[name] = rows, summarize(rows)
        timing[name] = dict(model_pmfs_s=t_model, simulator_s=t_sim, windows=win,
                            model_pmf_configs_per_s=len(cfgs) / t_model,
                            simulator_configs_per_s=len(cfgs) / t_sim)
        print_table(name, summaries[name], len(rows))
    print(f"\nspeed (jax {jax.__version__}, {jax.default_backend()} backend)")
    sp = speed() if c.speed_configs else {}
    for k, v in sp.items():
        print(f"  {k:40s} {v:14,.0f}")
    for name, t in timing.items():
        print(f"  {name}: model pmfs {t['model_pmf_configs_per_s']:,.1f} configs/s (after compiling; "
              f"windows {t['windows']}), simulator {t['simulator_configs_per_s']:,.2f} configs/s")
        if sp:
            print(f"    speed-up of the model over the simulator: summary statistics "
                  f"{sp['timings_summary_configs_per_s'] / t['simulator_configs_per_s']:,.0f}x, "
                  f"pmfs {t['model_pmf_configs_per_s'] / t['simulator_configs_per_s']:,.0f}x")
    if _OUT_JSON.value:
        os.makedirs(os.path.dirname(_OUT_JSON.value) or ".", exist_ok=True)
        with open(_OUT_JSON.value, "w") as f:
            json.dump(dict(summary=summaries, speed=sp, timing=timing, config=json.loads(c.to_json_best_effort())),
                      f, indent=1, default=float)
        print(f"wrote {_OUT_JSON.value}")
    if _ROWS_JSON.value:
        with open(_ROWS_JSON.value, "w") as f:
            json.dump(groups, f, default=float)
        print(f"wrote {_ROWS_JSON.value}")
    if _PLOT.value and "cv > 0" in groups:
        plot(_PLOT.value, groups)
        print(f"wrote {_PLOT.value}")


if __name__ == "__main__":
    cli.run(main)
