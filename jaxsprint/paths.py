"""Paths of run directories and outputs, through ``etils.epath``: local paths and any URI that orbax supports.

A local path is made absolute (orbax and tensorstore need absolute paths, and a run may change directory); a
URI (``gs://bucket/run``, ``file:///tmp/run``) is kept as it is and handed to ``epath``, which picks its
backend (the local filesystem, or ``fsspec`` / ``tf.io.gfile`` for remote filesystems).
"""
from __future__ import annotations

import os

from etils import epath

__all__ = ["is_uri", "as_path"]


def is_uri(path: str | os.PathLike) -> bool:
    """Whether `path` names a filesystem by scheme (``gs://...``), as opposed to a local path."""
    return "://" in os.fspath(path)


def as_path(path: str | os.PathLike) -> epath.Path:
    """`path` as an ``epath.Path``: a local path absolute, a URI (``file://`` becomes its local path) as it is."""
    text = os.fspath(path)
    if text.startswith("file://"):
        text = text[len("file://"):]
    if is_uri(text):
        return epath.Path(text)
    return epath.Path(os.path.abspath(text))
