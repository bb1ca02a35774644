"""Option names checked before anything compiles: an unknown name fails with the nearest valid one."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


# Options of NumPyro's, PyMC's and BlackJAX's NUTS that a user switching samplers brings along, and
# what ahmc takes instead (the nearest name by spelling would mislead: ``step_size`` is not ``log_step_size``).
FROM_NUTS = {
    "step_size": "initial_step_size (dual averaging's first step size; the warm-up and GP-UCB tune it)",
    "target_accept_prob": "target_acceptance_rate (dual averaging's target in the metric phase)",
    "target_accept": "target_acceptance_rate (dual averaging's target in the metric phase)",
    "max_tree_depth": "num_steps_cap (the largest number of leapfrog steps L; NUTS's depth 10 is 1024)",
    "num_steps": "num_steps_bounds=(lo, hi) (GP-UCB picks L there; (L, L) fixes it)",
    "trajectory_length": "max_integration_time (the automatic box's longest eps * L)",
    "adapt_step_size": "step_size_bounds=(lo, hi) with num_steps_bounds=(lo, hi) (GP-UCB tunes eps and L in "
                       "that box; (eps, eps) fixes the step size)",
}


# Arguments of the loop that drives a kernel (NumPyro's ``MCMC``, ``pm.sample``, ``run_chains``) given to the
# kernel instead: the nearest option by spelling would mislead (``chain_method`` is not ``chain_data``).
DRIVER_ARGUMENTS = {
    "chain_method": "NumPyro's MCMC(..., chain_method=...)",
    "num_chains": "MCMC(..., num_chains=...), pm.sample(chains=...) or the positions' first axis",
    "num_samples": "MCMC(..., num_samples=...), pm.sample(draws=...) or run_chains(..., num_samples)",
    "num_warmup": "MCMC(..., num_warmup=...), pm.sample(tune=...) or run_chains(..., num_warmup, ...)",
    "thinning": "NumPyro's MCMC(..., thinning=...)",
    "progress_bar": "NumPyro's MCMC(..., progress_bar=...)",
    "jit_model_args": "NumPyro's MCMC(..., jit_model_args=...)",
    "draws": "pm.sample(draws=...)",
    "tune": "pm.sample(tune=...)",
    "chains": "pm.sample(chains=...)",
    "cores": "pm.sample(cores=...)",
}


def check_option_names(given: Iterable[str], valid: Iterable[str], owner: str) -> None:
    """Raise ``ValueError`` for the first name in ``given`` that is not in ``valid``, suggesting the nearest
    (for a NUTS option, :data:`FROM_NUTS`'s equivalent; for the driver's argument, where it goes).

    ``owner`` names what took the options (``"AdaptiveHMC"``, ``"run_chains"``) in the message.
    """
    valid = sorted(set(valid))
    for name in given:
        if name in valid:
            continue
        if name in FROM_NUTS:
            raise ValueError(f"{owner}: unknown option {name!r} (a NUTS option); use {FROM_NUTS[name]}.")
        if name in DRIVER_ARGUMENTS:
            raise ValueError(f"{owner}: {name!r} is not a tuning option but an argument of the sampling loop; "
                             f"give it to {DRIVER_ARGUMENTS[name]}.")
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else f". Valid options: {', '.join(valid)}."
        raise ValueError(f"{owner}: unknown option {name!r}{hint}")


def whole_number_pair(name: str, value) -> tuple[int, int]:
    """``(lower, upper)`` of whole numbers (``3.0`` passes, ``2.9`` and ``True`` do not), or a ValueError naming ``name``."""
    import math

    try:
        lo, hi = value
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (lower, upper); got {value!r}.") from None
    for v in (lo, hi):
        if isinstance(v, bool) or not hasattr(v, "__float__") or not math.isfinite(float(v)) or int(v) != v:
            raise ValueError(f"{name} must be a pair of whole numbers of leapfrog steps, e.g. (1, 10); got {value!r}.")
    return int(lo), int(hi)
