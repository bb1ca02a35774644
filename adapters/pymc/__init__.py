"""PyMC step method: HMC whose step size and path length an annealed GP-UCB bandit tunes.

>>> with model:                                            # doctest: +SKIP
...     idata = pm.sample(step=AdaptiveHMC())

Each chain runs in two phases.

* **Metric phase** (the first ``metric_fraction`` of ``tune``): PyMC's own
  dual averaging of the step size and its diagonal mass-matrix adaptation (as
  NUTS does), with ``L`` uniform on ``{1..ceil(warmup_integration_time / eps)}``.
  This yields ``eps*`` and the metric.
* **Rounds** (the rest of ``tune`` and all draws): the metric is fixed, since a
  changing metric would move the optimal ``eps``.  Every ``round_length``
  iterations the round's reward, measured in the whitened metric, goes to
  :func:`ahmc.core.gp_ucb`, which may move ``(eps, L)`` inside a box around
  ``eps*``.  Each iteration draws its leapfrog count uniformly from
  ``{1..L}`` (Wang, Mohamed & de Freitas 2013, Algorithm 2).  The schedule's
  ``k`` defaults to the number of rounds in tune, so the adaptation
  probability is 1 during tune and then decays as ``p_i = (i - k + 1)^(-1/2)``.
  At the end of tune the arm is set to the maximiser of the GP mean
  (``exploit_after_warmup``), since the last UCB proposal is often exploratory.

Each chain has its own tuner; with :class:`PooledAdaptiveHMC` one tuner takes the chains' mean reward
every round, the warm-up's step size and diagonal mass matrix are pooled too, and PyMC steps the
chains in lockstep in one process (a population step method).

The package: ``_step`` (:class:`AdaptiveHMC`), ``_pooled`` (:class:`PooledAdaptiveHMC`), ``_rmhmc``
(:class:`AdaptiveRMHMC` and its metrics; the model's Fisher metric is ``ahmc.adapters._pymc_fisher``)
and ``_compiled`` (``sample_numpyro_ahmc``, imported on first use: it needs JAX and NumPyro).

Adapting after tune is deliberate: every arm's kernel leaves the posterior
invariant, ``p_i -> 0`` and the grid of arms is finite, so the chain stays
ergodic (paper, section 4).  ``freeze_after="tune"`` stops it at the end of
tune.  Per-draw stats (``step_size``, ``max_steps``, ``tuning_round``,
``reward``, ``arm_changed``, ``adapt_probability``, the search box) are enough to
rebuild the tuning history from the returned DataTree.
"""

from ._step import STATS, AdaptiveHMC
from ._pooled import PooledAdaptiveHMC
from ._rmhmc import RMHMC_STATS, AdaptiveRMHMC, constant_metric, fisher_logistic_metric
from ._snapshot import tuning_snapshot

__all__ = ["AdaptiveHMC", "PooledAdaptiveHMC", "AdaptiveRMHMC", "constant_metric", "fisher_logistic_metric",
           "sample_numpyro_ahmc", "tuning_snapshot", "STATS", "RMHMC_STATS"]


def __getattr__(name):
    # The compiled route (PyMC model -> JAX -> ahmc's NumPyro kernel) needs the numpyro extra: imported on use,
    # so that importing the step does not import JAX (cores > 1 then forks a process without JAX's threads).
    if name in ("sample_numpyro_ahmc", "jax_logdensity"):
        from . import _compiled

        return getattr(_compiled, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
