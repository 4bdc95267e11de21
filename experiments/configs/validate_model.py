r"""The SPRINT model against the discrete-event simulator (experiments/validate_model.py) on random configurations.

800 random configurations (500 with gamma jitter, 200 without, 100 lognormal) and the speed test of one
jitted, vmapped model call over a million configurations; about 2-3 minutes on 2 cores:

  .venv/bin/python experiments/validate_model.py --config=experiments/configs/validate_model.py

A quick look (about a minute), writing nothing:

  .venv/bin/python experiments/validate_model.py --config.num_configs=40 --config.num_deterministic=10 \
      --config.num_lognormal=0 --config.speed_configs=100000 --out_json= --plot=
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    # Configurations drawn at random (workers 1-4,096, T_u / T_c 0.01-100, sub-batch 1-256), by jitter.
    c.num_configs = 500             # with gamma jitter (cv > 0): the model's family
    c.num_deterministic = 200       # with cv = 0
    c.num_lognormal = 100           # with lognormal jitter (robustness outside the family)
    c.seed = 0                      # seed of the configuration draw and of the simulator, in [0, 2^31)
    # The simulator's length for each configuration.
    c.event_budget = 3e6            # simulated gradients per configuration (at most, roughly)
    c.min_cycles = 20_000           # updater cycles simulated when the budget allows
    c.min_gradients = 200_000       # gradients simulated when the budget allows
    # The speed test.
    c.speed_configs = 1_000_000     # configurations of the vmapped speed test (0: none)
    c.lock()
    return c
