"""Framework-agnostic annealed GP-UCB tuning of HMC's step size and path length.

Pure functions over NamedTuples of arrays, written against the array namespace of their inputs:
the same code runs under NumPy (PyMC adapter) and under ``jax.jit``/``jax.vmap`` (NumPyro and
BlackJAX adapters). Imports NumPy only.

The public names are below; the building blocks the adapters share (rewards, mass-matrix
helpers, constants) live in the submodules ``objectives``, ``space``, ``tuner``, ``gp``,
``mass_matrix`` and ``diagnostics``.

>>> from ahmc.core import search_space, gp_ucb
>>> tuner = gp_ucb(search_space(step_size=(1e-3, 1.0), num_steps=(1, 100)))
>>> state = tuner.init()
>>> step_size, num_steps = tuner.arm(state)
"""

from .config import Config
from .objectives import RoundStats, check_objective
from .space import SearchSpace, search_space
from .tuner import Surrogate, Tuner, TunerInfo, TunerState, gp_ucb

__all__ = ["Config", "RoundStats", "SearchSpace", "Surrogate", "Tuner", "TunerInfo", "TunerState", "check_objective",
           "gp_ucb", "search_space"]
