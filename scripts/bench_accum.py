r"""Gradient accumulation on XLA:CPU: micro-batches unrolled in the program vs a lax.scan loop.

ResNet-20, global batch 128 as 4 micro-batches of 32, one device, the default convolution; median of 4 steps.

  JAX_PLATFORMS=cpu .venv/bin/python scripts/bench_accum.py
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    import jax
    import numpy as np
    import optax

    from jaxsprint import models, train

    model = models.create_model("resnet20", num_classes=10, conv_general_dilated=train.conv_fn("auto"),
                                native_stats=train.native_stats("auto"))
    tx = optax.sgd(0.1, momentum=0.9)
    state0 = train.create_train_state(jax.random.key(0), model, tx, (1, 32, 32, 3))
    x = np.random.default_rng(0).normal(size=(128, 32, 32, 3)).astype(np.float32)
    y, w = np.zeros(128, np.int32), np.ones(128, np.float32)
    print(f"{'accumulation':<12} | {'ms/step':>8}")
    for name, unroll in (("unrolled", 8), ("lax.scan", 1)):
        step = jax.jit(train.make_train_step(model=model, num_classes=10, accum_steps=4, unroll_accum=unroll))
        s, m = step(state0, x, y, w)
        jax.block_until_ready(m["loss"])
        times = []
        for _ in range(4):
            t = time.perf_counter()
            s, m = step(s, x, y, w)
            jax.block_until_ready(m["loss"])
            times.append(time.perf_counter() - t)
        print(f"{name:<12} | {1000 * statistics.median(times):8.0f}")


if __name__ == "__main__":
    main()
