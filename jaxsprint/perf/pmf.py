"""Small utilities on lattice pmfs (values ``offset + stride * i``), as :mod:`jaxsprint.perf.sprint` returns them.

Re-exported by :mod:`jaxsprint.perf.sprint` (``sprint.to_fixed_support``, ``sprint.pmf_items``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def to_fixed_support(offset: jax.Array, pmf: jax.Array, max_value: int, *, lump: bool = True,
                     stride: jax.Array = 1) -> jax.Array:
    """A lattice pmf (values ``offset + stride * i``) on ``0..max_value``; the mass above
    ``max_value`` is lumped into the last entry (``lump=True``) or dropped."""
    values = (jnp.asarray(offset, jnp.float32)
              + jnp.asarray(stride, jnp.float32) * jnp.arange(pmf.shape[-1], dtype=jnp.float32))
    idx = jnp.clip(values, 0, max_value + 1).astype(jnp.int32)
    if lump:
        return jnp.zeros((max_value + 1,), pmf.dtype).at[jnp.minimum(idx, max_value)].add(pmf)
    return jnp.zeros((max_value + 1,), pmf.dtype).at[idx].add(pmf, mode="drop")


def pmf_items(offset: int, pmf: np.ndarray, scale: int = 1, threshold: float = 1e-9, *, stride: int = 1
              ) -> dict[str, float]:
    """``{str(scale * value): probability}`` for the entries above ``threshold`` (for JSON);
    ``value = offset + stride * i`` (pass ``Distributions.count_stride`` / ``staleness_stride``)."""
    pmf = np.asarray(pmf, np.float64)
    base, step = int(offset), int(stride)
    return {str(scale * (base + step * i)): float(f"{p:.9g}") for i, p in enumerate(pmf) if p > threshold}


__all__ = ["pmf_items", "to_fixed_support"]
