"""Time to accuracy: which configuration reaches a target accuracy soonest.

Modules: `law` (the updates-to-target law U(B, tau), pure jnp, and its fit), `emulator` (emulated training
runs at a given mini-batch and staleness, the law's data), `planner` (the plan: candidates from the SPRINT
model, emulated cells, the fitted law, the choice), `validation` (the plan against the real runtime's
measured time to accuracy).
"""
