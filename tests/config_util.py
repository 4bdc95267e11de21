"""Shared helpers of the settings tests: the shipped configs, and configs with overrides of any type."""
import importlib
import pkgutil

import ml_collections

import experiments.configs
from experiments.configs import default


def _is_training_config(module) -> bool:
    """A training config (built on default: model, optimizer, ...), not a launcher's (plan, calibrate, ...)."""
    c = module.get_config()
    return "model" in c and "optimizer" in c


# The shipped training configs, the ones the settings tests validate.
CONFIG_MODULES = [module for module in (importlib.import_module(f"experiments.configs.{m.name}")
                                        for m in pkgutil.iter_modules(experiments.configs.__path__))
                  if _is_training_config(module)]


def override(d: dict, **overrides) -> ml_collections.ConfigDict:
    """`d` (a nested dict) with dotted overrides of any type (ConfigDict would refuse e.g. a str for a float)."""
    for key, value in overrides.items():
        node = d
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return ml_collections.ConfigDict(d)


def default_with(**overrides) -> ml_collections.ConfigDict:
    """The default config (global batch 512, eval 512) with dotted overrides of any type."""
    return override(default.get_config().to_dict(), **overrides)
