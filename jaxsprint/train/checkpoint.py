"""Checkpoints of a training run (I/O only): the train state, its extras and the data iterator, with orbax.

A checkpoint is an orbax Composite of two items: ``train_state`` = ``{"state": <TrainState as a state dict>,
**extras}`` and, when given, ``train_iterator`` = the grain iterator's position (one small JSON per host,
`jaxsprint.train.pipeline.checkpoint_args`), so that a resumed run reads exactly the batches the uninterrupted run
would have read. Restoring needs a template of the same structure (a freshly initialised state and extras),
whose shardings the restored arrays take, and an iterator made with the same arguments.

Multi-host (``jax.distributed``): every process calls `save` and `restore` with the same step; every saved
array must be a global ``jax.Array`` (e.g. replicated with ``NamedSharding(mesh, P())`` over the global
mesh), never a host-local one. orbax writes each array once (process 0 for replicated ones), every host's
iterator position to its own file, and commits the step after a barrier, so a checkpoint written by P
processes restores into P processes (and the arrays into any mesh: they are stored whole).

Before restoring, the saved tree's metadata (paths, shapes, dtypes) is compared with the template's, so a
workdir written by another model or optimizer gives a `CheckpointError` that says what differs instead of
orbax's "tree structures do not match". A checkpoint that cannot be read (a truncated file) gives a
`CheckpointError` naming the step; ``resume="latest_good"`` falls back to the newest readable one.

One layout for every run: the SPRINT runtime writes the same Composite (its whole state as a TrainState, the
extras as the trainer's, no iterator item) from one process (`save_from_this_process`), and
`restore_variables` reads the weights and BN statistics of either kind of run (orbax partial restore).
Run directories are ``etils.epath`` paths (`jaxsprint.paths.as_path`): local, ``file://`` or remote URIs.
"""
from __future__ import annotations

import os
from typing import Any

import flax
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from jaxsprint import paths
from jaxsprint.train import pipeline
from jaxsprint.errors import CheckpointError, check

__all__ = ["RESUME_MODES", "describe_mismatch", "directory", "kvstore_spec", "manager", "named_leaves", "restore",
           "restore_variables", "save", "save_from_this_process", "validate_config"]

# config.resume: "latest" restores the newest checkpoint and fails if it cannot be read; "latest_good" falls
# back to the newest one that can be read (a warning names every step skipped).
RESUME_MODES = ("latest", "latest_good")
_STATE_ITEM = "train_state"


def validate_config(config) -> None:
    """Checks ``config.resume`` (absent: "latest"). Needs no data: call it before anything is written."""
    mode = config.get("resume", "latest")
    check(mode in RESUME_MODES, "config.resume", mode, f"allowed: {', '.join(RESUME_MODES)}")


def directory(workdir: str | os.PathLike) -> epath.Path:
    """``<workdir>/checkpoints`` as an ``epath.Path`` (a local workdir made absolute, a URI kept)."""
    return paths.as_path(workdir) / "checkpoints"


def manager(workdir: str | os.PathLike, keep: int = 2) -> ocp.CheckpointManager:
    """The checkpoint manager of ``<workdir>/checkpoints`` (keeps the newest `keep`, at least 1)."""
    options = ocp.CheckpointManagerOptions(max_to_keep=max(int(keep), 1), create=True)
    return ocp.CheckpointManager(directory(workdir), options=options)


def _host_local(leaf) -> bool:
    return isinstance(leaf, np.ndarray) or (isinstance(leaf, jax.Array) and leaf.is_fully_addressable)


def save(mgr: ocp.CheckpointManager, step: int, state: Any, extra: dict | None = None,
         iterator: Any = None) -> None:
    """Saves `state` (a flax struct, e.g. the TrainState), `extra` arrays and the position of the grain
    `iterator` (if given; taken now, even if the loop reads on before the asynchronous save ends) at `step`.

    Raises:
      ValueError: in a multi-process run, a leaf that is not a global array (names the leaf).
    """
    tree = _state_tree(state, extra)
    if jax.process_count() > 1:
        for path, leaf in named_leaves(tree):
            if _host_local(leaf):
                raise ValueError(f"checkpoint leaf {path} is host-local ({type(leaf).__name__}); a multi-process "
                                 "checkpoint needs global arrays (e.g. replicated over the global mesh)")
    items = {_STATE_ITEM: ocp.args.StandardSave(tree)}
    if iterator is not None:
        items["train_iterator"] = pipeline.checkpoint_args(iterator)
    mgr.save(step, args=ocp.args.Composite(**items))


def _state_tree(state: Any, extra: dict | None) -> dict:
    tree = {"state": flax.serialization.to_state_dict(state)}
    if extra:
        tree.update(extra)
    return tree


def save_from_this_process(workdir: str | os.PathLike, step: int, state: Any, extra: dict | None = None,
                           keep: int = 1) -> None:
    """Saves `state` and `extra` at `step` in `save`'s layout (no iterator item) from this process alone, and
    waits until the step is committed.

    For a run whose processes hold identical host-local copies (the SPRINT runtime: every host's updater
    ends with the same weights): the leaves are fetched to numpy and only the calling process writes, so
    the others need not take part (in a multi-process run, call it on one process only; orbax's barriers
    then span that process alone).
    """
    tree = jax.tree.map(np.asarray, jax.device_get(_state_tree(state, extra)))
    options = ocp.CheckpointManagerOptions(max_to_keep=max(int(keep), 1), create=True)
    if jax.process_count() > 1:
        me = jax.process_index()
        directory(workdir).mkdir(parents=True, exist_ok=True)  # orbax creates it only with every process
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max(int(keep), 1), create=False,
            multiprocessing_options=ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me}))
    with ocp.CheckpointManager(directory(workdir), options=options) as mgr:
        mgr.save(step, args=ocp.args.Composite(**{_STATE_ITEM: ocp.args.StandardSave(tree)}))
        mgr.wait_until_finished()


def _key_name(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def named_leaves(tree) -> list[tuple[str, Any]]:
    """``(path, leaf)`` of every leaf of `tree`, paths like ``state/params/Dense_0/kernel``."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [("/".join(_key_name(k) for k in path), leaf) for path, leaf in leaves]


def _table(tree) -> dict[str, tuple[tuple[int, ...], str]]:
    return {p: (tuple(leaf.shape), str(np.dtype(leaf.dtype))) for p, leaf in named_leaves(tree)
            if hasattr(leaf, "shape")}


def _hint(paths) -> str:
    parts = {p.split("/")[1] if p.startswith("state/") and p.count("/") else p.split("/")[0] for p in paths}
    hints = []
    if parts & {"params", "batch_stats", "polished_batch_stats"}:
        hints.append("config.model (or its BatchNorm / dtype settings)")
    if "opt_state" in parts:
        hints.append("config.optimizer or config.async_emulation")
    return f"; was it written with another {' or '.join(hints)}?" if hints else ""


def describe_mismatch(saved: dict, expected: dict, limit: int = 3) -> str | None:
    """What differs between two ``{path: (shape, dtype)}`` tables (None: they match)."""
    def order(p):  # the parameters first, then the rest of the state, then the extras
        return (not p.startswith("state/params/"), not p.startswith("state/"), p)

    missing = sorted(set(expected) - set(saved), key=order)
    unexpected = sorted(set(saved) - set(expected), key=order)
    changed = sorted((p for p in set(saved) & set(expected) if saved[p] != expected[p]), key=order)
    if not (missing or unexpected or changed):
        return None

    def few(paths):
        return ", ".join(paths[:limit]) + (f" and {len(paths) - limit} more" if len(paths) > limit else "")

    out = []
    if missing:
        out.append(f"{len(missing)} arrays this config needs are not in it ({few(missing)})")
    if unexpected:
        out.append(f"{len(unexpected)} arrays in it are not in this config's state ({few(unexpected)})")
    for p in changed[:limit]:
        (s_shape, s_dtype), (e_shape, e_dtype) = saved[p], expected[p]
        out.append(f"{p} is {s_dtype}{list(s_shape)} there, {e_dtype}{list(e_shape)} here")
    if len(changed) > limit:
        out.append(f"{len(changed) - limit} more arrays differ in shape or dtype")
    return "; ".join(out) + _hint(missing + unexpected + changed)


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:200]}{'...' if len(text) > 200 else ''}"


class _Unreadable(Exception):
    """A step whose files cannot be read (the reason is the message)."""


def kvstore_spec(path: epath.Path) -> dict | None:
    """The tensorstore kvstore (JSON spec) of the directory `path`: the ``file`` driver for a local path, the
    URI's own driver for a remote one that tensorstore knows (``gs://`` -> ``gcs``, ``s3://``), else None."""
    import tensorstore as ts

    if not paths.is_uri(path):
        return {"driver": "file", "path": os.fspath(path).rstrip("/") + "/"}
    try:
        return ts.KvStore.Spec(str(path).rstrip("/") + "/").to_json()
    except ValueError:
        return None


def _read_every_chunk(path: epath.Path) -> None:
    """Reads every entry of the item's OCDBT store, one after the other.

    orbax reads a checkpoint's arrays concurrently; when one read fails it raises and closes its event loop,
    and the reads still in flight then print "Event loop is closed" tracebacks from tensorstore's threads.
    Reading sequentially first turns a truncated or missing file into one clean exception (and costs one
    extra read of the checkpoint, once per start).
    """
    base = kvstore_spec(path)
    if base is None or not (path / "manifest.ocdbt").exists():
        return  # not an OCDBT checkpoint, or no kvstore for its filesystem: orbax alone reads it
    import tensorstore as ts

    store = ts.KvStore.open({"driver": "ocdbt", "base": base}).result()
    for key in store.list().result():
        store.read(key).result()


def _saved_table(mgr, step: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{path: (shape, dtype)}`` of the state item of `step`, after reading every chunk once."""
    path = epath.Path(mgr.directory) / str(step) / _STATE_ITEM
    try:
        _read_every_chunk(path)
        meta = ocp.StandardCheckpointHandler().metadata(path)
        return _table(getattr(meta, "tree", meta))
    except Exception as e:  # orbax raises many kinds for unreadable files; all mean "this step is broken"
        raise _Unreadable(f"its files cannot be read ({_short(e)})") from e


def _check_matches(mgr, step: int, saved: dict, expected: dict) -> None:
    diff = describe_mismatch(saved, expected)
    if diff is not None:
        raise CheckpointError("checkpoint step", step, f"the checkpoint in {mgr.directory} was written by a run "
                              f"with another state (use another workdir, or the config that wrote it): {diff}")


def _restore_step(mgr, step: int, template: dict, iterator) -> dict:
    _check_matches(mgr, step, _saved_table(mgr, step), _table(template))
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), template)
    items = {_STATE_ITEM: ocp.args.StandardRestore(abstract)}
    if iterator is not None:
        items["train_iterator"] = pipeline.restore_args(iterator)
    try:
        return dict(mgr.restore(step, args=ocp.args.Composite(**items))[_STATE_ITEM])
    except Exception as e:
        raise _Unreadable(f"it cannot be read ({_short(e)})") from e


def _set_aside(mgr: ocp.CheckpointManager, steps: list[int]) -> None:
    """Moves unreadable steps out of the manager's directory (to ``<workdir>/unreadable_checkpoints/``), so
    that the resumed run can save those steps again; kept, not deleted, for a post-mortem."""
    directory = epath.Path(mgr.directory)
    aside = directory.parent / "unreadable_checkpoints"
    if jax.process_index() == 0:
        aside.mkdir(parents=True, exist_ok=True)
        for step in steps:
            target = aside / str(step)
            if target.exists():
                target = aside / f"{step}-{len(list(aside.iterdir()))}"
            (directory / str(step)).rename(target)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("jaxsprint_checkpoint_set_aside")
    mgr.reload()


def restore(mgr: ocp.CheckpointManager, state: Any, extra_template: dict | None = None, iterator: Any = None,
            *, resume: str = "latest") -> tuple[Any, dict, int] | None:
    """Restores the latest checkpoint into `state`'s structure and shardings, and `iterator` (if given) to
    the saved position.

    Args:
      mgr: the run's manager (`manager`).
      state: a freshly initialised state of this run (the template: structure, shapes, shardings).
      extra_template: the extras saved beside it, likewise.
      iterator: the run's training iterator, made with the same arguments as the saved one.
      resume: "latest" (a checkpoint that cannot be read is an error) or "latest_good" (fall back to the
        newest one that can be read; the unreadable newer steps are moved to
        ``<workdir>/unreadable_checkpoints/``).

    Returns:
      ``(state, extras, step)``, or None when there is no checkpoint.

    Raises:
      CheckpointError: the checkpoint was written by a run with another state (another model, optimizer or
        async emulation: the message lists what differs), or it cannot be read (the message names the step;
        with "latest_good", only when none can be read). Raised before anything is written.
    """
    check(resume in RESUME_MODES, "config.resume", resume, f"allowed: {', '.join(RESUME_MODES)}")
    steps = sorted(mgr.all_steps(), reverse=True)
    if not steps:
        return None
    template = {"state": flax.serialization.to_state_dict(state)}
    if extra_template:
        template.update(extra_template)
    restored, step, skipped = _newest_readable(mgr, steps, resume,
                                               lambda s: _restore_step(mgr, s, template, iterator))
    if skipped:
        _set_aside(mgr, skipped)
    new_state = flax.serialization.from_state_dict(state, restored.pop("state"))
    return new_state, restored, step


def _newest_readable(mgr, steps, resume: str, read) -> tuple[Any, int, list[int]]:
    """``(read(step), step, the newer steps skipped)`` for the newest of `steps` that `read` can read.

    With ``resume="latest"`` the first unreadable step is a CheckpointError naming it; with "latest_good" it is
    skipped with a warning, and a CheckpointError comes only when none can be read.
    """
    skipped = []
    for step in steps:
        try:
            return read(step), step, skipped
        except _Unreadable as e:
            if resume != "latest_good":
                raise CheckpointError("checkpoint step", step, f"in {mgr.directory}, {e}; config.resume="
                                      "'latest_good' falls back to the newest checkpoint that can be read"
                                      ) from None
            logging.warning("checkpoint step %d cannot be read, trying an older one: %s", step, e)
            skipped.append(step)
    raise CheckpointError(f"checkpoints in {mgr.directory}", skipped, "none of them can be read")


_VARIABLES = ("params", "batch_stats")


def restore_variables(workdir: str | os.PathLike, template: dict, *, resume: str = "latest"
                      ) -> tuple[Any, Any, int] | None:
    """The weights and BatchNorm statistics of the latest checkpoint in ``<workdir>/checkpoints``, of a
    trainer run or a SPRINT run alike: only ``state/params`` and ``state/batch_stats`` are read (orbax partial
    restore), so the optimizer state, the extras and the iterator may be anything.

    Args:
      workdir: the run's directory (a local path or a URI).
      template: ``{"params": ..., "batch_stats": ...}`` of this config (e.g. from a freshly initialised
        state): the arrays' structure, shapes, dtypes and shardings, which the restored arrays take.
      resume: "latest" (a checkpoint that cannot be read is an error) or "latest_good" (fall back to the
        newest one that can be read; nothing is moved or written).

    Returns:
      ``(params, batch_stats, step)`` (the running statistics as the run left them, its EMA), or None when
      there is no checkpoint.

    Raises:
      CheckpointError: the weights or statistics differ from the template's (the message lists what differs),
        or the checkpoint cannot be read (names the step; with "latest_good", when none can be read).
    """
    check(resume in RESUME_MODES, "config.resume", resume, f"allowed: {', '.join(RESUME_MODES)}")
    check(set(template) == set(_VARIABLES), "template", sorted(template), f"the keys {', '.join(_VARIABLES)}")
    if not directory(workdir).exists():
        return None
    wanted = {k: v for k, v in template.items() if jax.tree.leaves(v)}  # no BatchNorm: no statistics to read
    expected = _table({"state": wanted})
    item = {"state": jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), wanted)}
    restore_args = jax.tree.map(lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding), item)
    args = ocp.args.Composite(**{_STATE_ITEM: ocp.args.PyTreeRestore(item=item, restore_args=restore_args,
                                                                      partial_restore=True)})
    prefixes = tuple(f"state/{k}/" for k in _VARIABLES)
    with ocp.CheckpointManager(directory(workdir), options=ocp.CheckpointManagerOptions(create=False)) as mgr:
        def read(step):
            saved = {p: v for p, v in _saved_table(mgr, step).items() if p.startswith(prefixes)}
            _check_matches(mgr, step, saved, expected)
            try:
                return mgr.restore(step, args=args)[_STATE_ITEM]["state"]
            except Exception as e:
                raise _Unreadable(f"it cannot be read ({_short(e)})") from e

        steps = sorted(mgr.all_steps(), reverse=True)
        if not steps:
            return None
        state, step, _ = _newest_readable(mgr, steps, resume, read)
        return state["params"], state.get("batch_stats", template["batch_stats"]), step
