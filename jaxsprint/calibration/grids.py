"""The configurations the runtime's validation runs: fixed grids, and a seeded draw from the whole space.

A configuration (:class:`Entry`) is hosts x learners per host, sub-batch, emulated network time (ms) and the
updater's placement (``shared``: on a learner's device; ``own``: one device more per process; ``None`` in a
fixed grid: the one placement of the whole grid). :data:`VALIDATION_GRID` is the fixed grid the model is
judged on, :data:`CALIBRATION_GRID` the runs ``experiments/calibrate_runtime.py`` fits the preset to (none of
them in the validation grid), :data:`QUICK_GRID` a smoke test.

:func:`draw` is the held-out protocol: ``num_random`` distinct configurations from the whole space (1-2 hosts,
1-8 learners per host, sub-batch 8-128, network 0-100 ms, both placements), none a calibration run, so that
a preset fitted to its calibration runs is judged on configurations nobody chose. The distribution:

- hosts and learners per host uniform over their integers;
- sub-batch a multiple of 8, with probability proportional to ``1 / b`` (a discrete log-uniform: each octave
  8-16, 16-32, ... about as likely as the others);
- network time exactly 0 with probability ``zero_network_share`` (1/4: no network is a regime of its own,
  where the updaters cycle back to back), else a whole number of ms, uniform over the rest of the range;
- placements balanced (half of the draws each, the odd one and the order at random), the configurations
  (hosts, learners, sub-batch, network) distinct: no configuration runs twice, with either placement.

The configurations are drawn without replacement from that distribution (``numpy`` ``Generator.choice``,
PCG64 seeded with ``random_seed``), the excluded ones (any placement) left out. :func:`preset_calibration_runs`
reads the runs a calibrated preset file was fitted to (its ``measurements`` file's ``runs``), to exclude too.
"""
from __future__ import annotations

import json
import math
import os
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from jaxsprint.errors import check, is_int

__all__ = ["CALIBRATION_GRID", "Entry", "PLACEMENTS", "QUICK_GRID", "VALIDATION_GRID", "draw", "key",
           "preset_calibration_runs", "sub_batches"]

PLACEMENTS = ("shared", "own")


class Entry(NamedTuple):
    """One configuration of a validation grid (``updater_device`` None: the grid's one placement)."""
    name: str
    hosts: int
    learners_per_host: int
    sub_batch: int
    network_ms: int
    updater_device: str | None = None


def _grid(*rows) -> tuple[Entry, ...]:
    return tuple(Entry(*r) for r in rows)


# Chosen for T_u/T_c from about 0.1 to 10 on 2 cores (learners beyond the cores time-share them, so T_c grows
# with all processes' learners).
VALIDATION_GRID = _grid(
    ("h1_l1_b8_n20", 1, 1, 8, 20), ("h1_l1_b128_n5", 1, 1, 128, 5), ("h1_l2_b8_n50", 1, 2, 8, 50),
    ("h1_l2_b64_n10", 1, 2, 64, 10), ("h1_l4_b32_n30", 1, 4, 32, 30), ("h1_l4_b16_n100", 1, 4, 16, 100),
    ("h1_l8_b32_n10", 1, 8, 32, 10), ("h1_l8_b128_n50", 1, 8, 128, 50), ("h1_l8_b8_n20", 1, 8, 8, 20),
    ("h2_l1_b32_n0", 2, 1, 32, 0), ("h2_l1_b8_n50", 2, 1, 8, 50), ("h2_l2_b32_n20", 2, 2, 32, 20),
    ("h2_l4_b64_n100", 2, 4, 64, 100), ("h2_l2_b128_n5", 2, 2, 128, 5),
    # two-host runs that pin the two-host updater: without network time (the updaters' collectives busy on
    # the cores) and with 20 ms (an updater waits for its partner), sub-batch 8-128, 1-4 learners per host
    ("h2_l1_b8_n0", 2, 1, 8, 0), ("h2_l1_b128_n20", 2, 1, 128, 20), ("h2_l2_b8_n0", 2, 2, 8, 0),
    ("h2_l2_b64_n0", 2, 2, 64, 0), ("h2_l4_b16_n20", 2, 4, 16, 20), ("h2_l4_b128_n0", 2, 4, 128, 0),
)
# The calibration's runs: configurations of the same ranges that are not in VALIDATION_GRID (1-8 learners per
# host, 1 and 2 hosts, sub-batch 8-128, network 0-50 ms), three of them with two hosts (the two-host stretch).
CALIBRATION_GRID = _grid(
    ("cal_h1_l1_b32_n0", 1, 1, 32, 0), ("cal_h1_l2_b16_n20", 1, 2, 16, 20), ("cal_h1_l2_b128_n0", 1, 2, 128, 0),
    ("cal_h1_l4_b8_n10", 1, 4, 8, 10), ("cal_h1_l4_b64_n20", 1, 4, 64, 20), ("cal_h1_l8_b16_n50", 1, 8, 16, 50),
    ("cal_h1_l8_b64_n0", 1, 8, 64, 0), ("cal_h2_l1_b64_n10", 2, 1, 64, 10), ("cal_h2_l2_b16_n0", 2, 2, 16, 0),
    ("cal_h2_l4_b32_n50", 2, 4, 32, 50),
)
QUICK_GRID = _grid(("quick_h1_l2", 1, 2, 8, 10), ("quick_h2_l1", 2, 1, 8, 10))


def key(entry: Entry) -> tuple[int, int, int, int]:
    """``(hosts, learners_per_host, sub_batch, network_ms)``: the configuration without name and placement."""
    return (int(entry.hosts), int(entry.learners_per_host), int(entry.sub_batch), int(entry.network_ms))


def _range(field: str, bounds: Sequence[int], lo: int) -> tuple[int, int]:
    ok = (isinstance(bounds, (tuple, list)) and len(bounds) == 2 and all(is_int(b) for b in bounds)
          and lo <= bounds[0] <= bounds[1])
    check(ok, field, bounds, f"a pair (low, high) of integers with {lo} <= low <= high")
    return int(bounds[0]), int(bounds[1])


def sub_batches(bounds: Sequence[int] = (8, 128)) -> tuple[int, ...]:
    """The multiples of 8 in ``[low, high]``, the sub-batches :func:`draw` draws from.

    Raises:
      ConfigError: bounds that are not integers ``1 <= low <= high``, or hold no multiple of 8.
    """
    lo, hi = _range("sub_batch", bounds, 1)
    out = tuple(range(8 * math.ceil(lo / 8), hi + 1, 8))
    check(bool(out), "sub_batch", tuple(bounds), "bounds that hold a multiple of 8")
    return out


def draw(num_random: int, *, random_seed: int = 0, hosts: Sequence[int] = (1, 2),
         learners_per_host: Sequence[int] = (1, 8), sub_batch: Sequence[int] = (8, 128),
         network_ms: Sequence[int] = (0, 100), zero_network_share: float = 0.25,
         placements: Sequence[str] = PLACEMENTS, exclude: Iterable[Entry | tuple] = CALIBRATION_GRID
         ) -> tuple[Entry, ...]:
    """``num_random`` distinct configurations drawn at random (the module docstring gives the distribution).

    Args:
      num_random: How many (>= 1).
      random_seed: The seed (an integer >= 0); the same seed and arguments give the same draws.
      hosts, learners_per_host, sub_batch, network_ms: ``(low, high)`` bounds, both included.
      zero_network_share: The probability of exactly 0 ms when ``network_ms`` holds 0 and more, in [0, 1).
      placements: The updater placements, balanced over the draws.
      exclude: Configurations never drawn (entries, or ``(hosts, learners, sub_batch, network_ms)``), with
        either placement: by default the calibration grid.

    Returns:
      Entries in draw order, named by it and what was drawn: ``r03_h2_l5_b24_n40_own``.

    Raises:
      ConfigError: a bad argument, or bounds with fewer than ``num_random`` configurations left.
    """
    check(is_int(num_random) and num_random >= 1, "num_random", num_random, "an integer >= 1")
    check(is_int(random_seed) and random_seed >= 0, "random_seed", random_seed, "an integer >= 0")
    check(isinstance(zero_network_share, (int, float)) and 0 <= zero_network_share < 1, "zero_network_share",
          zero_network_share, "a probability in [0, 1)")
    check(len(placements) >= 1 and len(set(placements)) == len(placements) and set(placements) <= set(PLACEMENTS),
          "placements", tuple(placements), f"distinct values of {', '.join(PLACEMENTS)}")
    h_lo, h_hi = _range("hosts", hosts, 1)
    l_lo, l_hi = _range("learners_per_host", learners_per_host, 1)
    n_lo, n_hi = _range("network_ms", network_ms, 0)
    bs = np.asarray(sub_batches(sub_batch), dtype=np.float64)
    hs, ls, ns = np.arange(h_lo, h_hi + 1), np.arange(l_lo, l_hi + 1), np.arange(n_lo, n_hi + 1)
    p_net = np.full(ns.shape, 1.0 / len(ns))
    if n_lo == 0 and n_hi > 0:
        p_net = np.where(ns == 0, zero_network_share, (1.0 - zero_network_share) / (len(ns) - 1))
    grid = np.stack(np.meshgrid(hs, ls, bs, ns, indexing="ij"), -1).reshape(-1, 4).astype(np.int64)
    p = np.einsum("i,j,k,l->ijkl", np.full(hs.shape, 1.0), np.full(ls.shape, 1.0), 1.0 / bs, p_net).ravel()
    banned = {key(e) if isinstance(e, Entry) else tuple(int(x) for x in e) for e in exclude}
    keep = np.array([tuple(int(x) for x in row) not in banned for row in grid], dtype=bool)
    keep &= p > 0
    available = int(keep.sum())
    check(num_random <= available, "num_random", num_random,
          f"at most {available}: the distinct configurations of hosts {hosts}, learners per host "
          f"{tuple(learners_per_host)}, sub-batch {tuple(sub_batch)} (multiples of 8), network "
          f"{tuple(network_ms)} ms, less the {len(grid) - available} excluded")
    rng = np.random.Generator(np.random.PCG64(random_seed))
    rows = grid[keep][rng.choice(available, size=num_random, replace=False, p=p[keep] / p[keep].sum())]
    where = list(placements) * -(-num_random // len(placements))
    where = [where[i] for i in rng.permutation(len(where))[:num_random]]
    width = max(2, len(str(num_random - 1)))
    return tuple(Entry(f"r{i:0{width}d}_h{h}_l{lph}_b{b}_n{n}_{u}", int(h), int(lph), int(b), int(n), u)
                 for i, ((h, lph, b, n), u) in enumerate(zip(rows.tolist(), where)))


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's root


def preset_calibration_runs(preset_file: str | None) -> tuple[str, tuple[tuple[int, int, int, int], ...]] | None:
    """The runs a calibrated preset file was fitted to: ``(measurements file, keys)`` (see :func:`key`), or
    None where the preset records none that can be read.

    ``experiments/calibrate_runtime.py`` writes the path of its measurement file (``"measurements"``, as given
    to it, relative to where it ran: this checkout's root for the shipped presets) into the preset, and every
    runtime run it fitted (``runs_from``'s too) into that file's ``measurements.runs``. The path is tried as it
    is, then under the checkout's root. A missing or unreadable file gives None (the launcher that loads the
    preset reports a bad preset file).
    """
    if not preset_file:
        return None
    try:
        with open(preset_file) as fh:
            meas = json.load(fh).get("measurements")
        if not isinstance(meas, str):
            return None
        path = next((p for p in (meas, os.path.join(_ROOT, meas)) if os.path.isfile(p)), None)
        if path is None:
            return None
        with open(path) as fh:
            runs = json.load(fh)["measurements"]["runs"]
        keys = tuple(sorted({(int(r["hosts"]), int(r["learners_per_host"]), int(r["sub_batch"]),
                              int(round(1e3 * float(r["network_time_s"])))) for r in runs}))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return (meas, keys) if keys else None

