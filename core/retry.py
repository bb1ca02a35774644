"""The acceptance of a divergent transition's finer retry (``divergence_retry``), for every route.

A transition whose first try (step size ``eps``, ``n`` leapfrog steps) diverged tries again from the
same position and momentum with ``eps / factor`` for ``factor x n`` steps.  Delayed rejection (Green
& Mira 2001; for HMC, Modi, Barnett & Carpenter 2023) accepts the retry's end ``z2`` with probability
``min(1, pi(z2) r(z2) / (pi(z0) r(z0)))``, where ``r(z)`` is the probability that the first try from
``z`` is rejected *because it diverged*: the retry is made only then.  For ``z0`` that is ``1 - a(z0)``
(the first try's acceptance, 0 or nearly after a divergence); for ``z2`` the "ghost" trajectory (the
first try's ``eps`` and ``n``, from ``z2``) gives it: ``1 - a(ghost)`` if the ghost diverges, else 0,
since the chain could not have come back to ``z0`` this way.  The JAX routes run the retry in the
trajectory's loop (``ahmc.adapters._jax_kernel``), the PyMC step with PyMC's leapfrog.
"""

from __future__ import annotations

import numpy as np

__all__ = ["retry_log_acceptance"]


def retry_log_acceptance(start_energy, retry_energy, ghost_diverged, first_accept, ghost_accept, xp=np):
    """``log`` of the retry's acceptance ratio (``-inf``: rejected).

    ``start_energy`` and ``retry_energy``: the Hamiltonian at ``z0`` and at the retry's end;
    ``ghost_diverged``: whether the ghost trajectory from the retry's end diverged; ``first_accept``,
    ``ghost_accept``: the Metropolis acceptance probabilities of the first try and of the ghost (a route
    that never accepts a divergent trajectory passes 0)."""
    to_retry = start_energy - retry_energy  # log pi(z2) - log pi(z0)
    log_ratio = to_retry + xp.log1p(-ghost_accept) - xp.log1p(-first_accept)
    return xp.where(ghost_diverged & xp.isfinite(to_retry), log_ratio, -xp.inf)
