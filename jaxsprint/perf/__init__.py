"""The SPRINT performance model in JAX (pure jnp: jit, vmap and grad work).

Nothing here imports the training stack (:mod:`jaxsprint.train.trainer`, :mod:`jaxsprint.train.models`,
:mod:`jaxsprint.train.data`); measuring this machine is :mod:`jaxsprint.calibration.timing`, outside this package.

Modules:
  networks: per-layer FLOPs, bytes and parameters (layer spec, builder, flax via XLA cost analysis).
  zoo: cost tables of published CNNs and of the calibration families, by name.
  machines: machine presets with units and the source of every number.
  collectives: ring / tree / Rabenseifner / hierarchical all-reduce in the alpha-beta form.
  times: layer, device-step, learner (T_c) and updater (T_u) times.
  sprint: epoch time, exact means, mini-batch and staleness distributions; launcher-side checks.
  renewal: gamma laws, stationary renewal counts, mixing cells and lattices (sprint's blocks).
  pmf: lattice pmfs on a fixed support and as (value, probability) items (re-exported by sprint).
  simulate: discrete-event simulator of the same protocol (numpy), the judge of the model.
  space: configuration spaces, targets and their exact evaluation.
  search: gradient-based and grid search over a space.
  sensitivity: elasticities of the epoch time w.r.t. the machine's figures.
  fit: the one least-squares helper every fit of the package uses (calibration, the law).
  presets: machine presets as JSON files (measurement files: :mod:`jaxsprint.calibration.measurements`).

Example::

    from jaxsprint.perf import machines, sprint, zoo
    p = sprint.predict(zoo.get("resnet50"), machines.get("tsubame_kfc_dl"),
                       nodes=16, gpus_per_node=8, sub_batch=32)
    d = sprint.distributions(128, p.t_compute_s, p.t_update_s, cv=0.05)
"""
from jaxsprint.perf import (collectives, machines, networks, pmf, presets, renewal, search, sensitivity, simulate,
                            space, sprint, times, zoo)

__all__ = ["collectives", "machines", "networks", "pmf", "presets", "renewal", "search", "sensitivity",
           "simulate", "space", "sprint", "times", "zoo"]
