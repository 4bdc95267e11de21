"""Checkpoints of a training run (I/O only): the train state and its extras, with orbax.

A checkpoint holds ``{"state": <TrainState as a state dict>, **extras}``; restoring needs a template of the
same structure (a freshly initialised state and extras), whose shardings the restored arrays take.
"""
from __future__ import annotations

import os
from typing import Any

import flax
import jax
import orbax.checkpoint as ocp

__all__ = ["manager", "restore", "save"]


def manager(workdir: str, keep: int = 2) -> ocp.CheckpointManager:
    """The checkpoint manager of ``<workdir>/checkpoints`` (keeps the newest `keep`, at least 1)."""
    options = ocp.CheckpointManagerOptions(max_to_keep=max(int(keep), 1), create=True)
    return ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, "checkpoints")), options=options)


def save(mgr: ocp.CheckpointManager, step: int, state: Any, extra: dict | None = None) -> None:
    """Saves `state` (a flax struct, e.g. the TrainState) and `extra` arrays at `step` (asynchronously)."""
    tree = {"state": flax.serialization.to_state_dict(state)}
    if extra:
        tree.update(extra)
    mgr.save(step, args=ocp.args.StandardSave(tree))


def restore(mgr: ocp.CheckpointManager, state: Any, extra_template: dict | None = None
            ) -> tuple[Any, dict, int] | None:
    """Restores the latest checkpoint into `state`'s structure and shardings.

    Returns:
      ``(state, extras, step)``, or None when there is no checkpoint.
    """
    step = mgr.latest_step()
    if step is None:
        return None
    template = {"state": flax.serialization.to_state_dict(state)}
    if extra_template:
        template.update(extra_template)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), template)
    restored = mgr.restore(step, args=ocp.args.StandardRestore(abstract))
    new_state = flax.serialization.from_state_dict(state, restored.pop("state"))
    return new_state, restored, step
