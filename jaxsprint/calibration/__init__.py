"""Measuring a machine and fitting its figures, and judging the model against what was measured.

Modules: `timing` (real training steps and all-reduces timed on this machine), `measurements` (measurement
files read and checked), `model_fit` (the SPRINT model's machine figures fitted to measured steps and
all-reduces, with held-out checks), `host_fit` (the runtime host's cost figures fitted to runtime runs),
`compare` (a runtime run's measured statistics beside the model's, from timings and from specs).
"""
