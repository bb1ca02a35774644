"""Framework-agnostic annealed GP-UCB tuning of HMC's step size and path length.

Pure functions over NamedTuples of arrays, written against the array namespace
of their inputs: the same code runs under NumPy (PyMC adapter) and under
``jax.jit``/``jax.vmap`` (NumPyro and BlackJAX adapters).  Imports NumPy only.

>>> from ahmc.core import search_space, gp_ucb
>>> tuner = gp_ucb(search_space(step_size=(1e-3, 1.0), num_steps=(1, 100)))
>>> state = tuner.init()
>>> step_size, num_steps = tuner.arm(state)
"""

from .gp import ArmBuffer
from .objectives import (
    DEFAULT_DIVERGENCE_PENALTY,
    NONFINITE_REWARD_MESSAGE,
    OBJECTIVES,
    RoundStats,
    check_objective,
    esjd,
    esjd_moments,
    esjd_per_gradient,
    get_objective,
    needs_center,
    normalized_esjd,
    round_arrays,
    StepJumps,
    step_jumps_estimate,
    step_jumps_init,
    step_jumps_update,
    round_init,
    round_update,
    with_divergence_penalty,
)
from .mass_matrix import (
    DENSE_AUTO_MAX_DIM,
    DENSE_AUTO_THRESHOLD,
    correlation_excess,
    prefers_dense,
    shrink_correlations,
)
from .space import (NUM_STEPS_CAP, RMHMC_NUM_STEPS_CAP, WARMUP_MAX_STEPS, SearchSpace, check_min_steps_fraction,
                    min_num_steps, search_space)
from .tuner import Surrogate, Tuner, TunerInfo, TunerState, TunerWork, adapt_probability, gp_ucb, ucb_beta

__all__ = [
    "ArmBuffer",
    "DENSE_AUTO_MAX_DIM",
    "DENSE_AUTO_THRESHOLD",
    "DEFAULT_DIVERGENCE_PENALTY",
    "NONFINITE_REWARD_MESSAGE",
    "NUM_STEPS_CAP",
    "OBJECTIVES",
    "RMHMC_NUM_STEPS_CAP",
    "RoundStats",
    "SearchSpace",
    "Surrogate",
    "Tuner",
    "TunerInfo",
    "TunerState",
    "TunerWork",
    "WARMUP_MAX_STEPS",
    "adapt_probability",
    "check_objective",
    "esjd",
    "esjd_moments",
    "esjd_per_gradient",
    "get_objective",
    "gp_ucb",
    "needs_center",
    "normalized_esjd",
    "prefers_dense",
    "round_arrays",
    "StepJumps",
    "step_jumps_estimate",
    "step_jumps_init",
    "step_jumps_update",
    "round_init",
    "round_update",
    "check_min_steps_fraction",
    "correlation_excess",
    "min_num_steps",
    "search_space",
    "shrink_correlations",
    "ucb_beta",
    "with_divergence_penalty",
]
