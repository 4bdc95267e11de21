"""Checkpoints of a training run (I/O only): the train state, its extras and the data iterator, with orbax.

A checkpoint is an orbax Composite of two items: ``train_state`` = ``{"state": <TrainState as a state dict>,
**extras}`` and, when given, ``train_iterator`` = the grain iterator's position (one small JSON per host,
`jaxsprint.pipeline.checkpoint_args`), so that a resumed run reads exactly the batches the uninterrupted run
would have read. Restoring needs a template of the same structure (a freshly initialised state and extras),
whose shardings the restored arrays take, and an iterator made with the same arguments.
"""
from __future__ import annotations

import os
from typing import Any

import flax
import jax
import orbax.checkpoint as ocp

from jaxsprint import pipeline

__all__ = ["manager", "restore", "save"]


def manager(workdir: str, keep: int = 2) -> ocp.CheckpointManager:
    """The checkpoint manager of ``<workdir>/checkpoints`` (keeps the newest `keep`, at least 1)."""
    options = ocp.CheckpointManagerOptions(max_to_keep=max(int(keep), 1), create=True)
    return ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, "checkpoints")), options=options)


def save(mgr: ocp.CheckpointManager, step: int, state: Any, extra: dict | None = None,
         iterator: Any = None) -> None:
    """Saves `state` (a flax struct, e.g. the TrainState), `extra` arrays and the position of the grain
    `iterator` (if given; taken now, even if the loop reads on before the asynchronous save ends) at `step`."""
    tree = {"state": flax.serialization.to_state_dict(state)}
    if extra:
        tree.update(extra)
    items = {"train_state": ocp.args.StandardSave(tree)}
    if iterator is not None:
        items["train_iterator"] = pipeline.checkpoint_args(iterator)
    mgr.save(step, args=ocp.args.Composite(**items))


def restore(mgr: ocp.CheckpointManager, state: Any, extra_template: dict | None = None, iterator: Any = None
            ) -> tuple[Any, dict, int] | None:
    """Restores the latest checkpoint into `state`'s structure and shardings, and `iterator` (if given) to
    the saved position.

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
    items = {"train_state": ocp.args.StandardRestore(abstract)}
    if iterator is not None:
        items["train_iterator"] = pipeline.restore_args(iterator)
    restored = dict(mgr.restore(step, args=ocp.args.Composite(**items))["train_state"])
    new_state = flax.serialization.from_state_dict(state, restored.pop("state"))
    return new_state, restored, step
