"""The SPRINT performance model in JAX (pure jnp: jit, vmap and grad work).

Modules:
  networks: per-layer FLOPs, bytes and parameters (layer spec, zoo, flax via XLA cost analysis).
  machines: machine presets with units and the source of every number.
  collectives: ring / tree / Rabenseifner / hierarchical all-reduce in the alpha-beta form.
  sprint: compute and updater times, epoch time, mini-batch and staleness distributions.
  simulate: discrete-event simulator of the same protocol (numpy), the judge of the model.

Example::

    from jaxsprint.perf import machines, networks, sprint
    p = sprint.predict(networks.get("resnet50"), machines.get("tsubame_kfc_dl"),
                       nodes=16, gpus_per_node=8, sub_batch=32)
    d = sprint.distributions(128, p.t_compute_s, p.t_update_s, cv=0.05)
"""
from jaxsprint.perf import collectives, machines, networks, simulate, sprint

__all__ = ["collectives", "machines", "networks", "simulate", "sprint"]
