"""Asynchronous SGD inside a synchronous program: delayed gradients and random mini-batches.

Modules: `staleness` (the delayed-gradient optax transform and the mitigations), `samplers` (staleness and
mini-batch samplers, fixed or drawn from the SPRINT model's pmfs), `adapter` (``config.async_emulation`` ->
the transform and the sampler a training run needs).
"""
