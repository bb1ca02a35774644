"""Riemann-manifold HMC for the shared JAX engine (Girolami & Calderhead 2011).

An RMHMC transition in BlackJAX's terms (``blackjax.rmhmc`` is HMC with a
position-dependent Gaussian momentum): momentum ``p ~ N(0, G(x))``, a
trajectory of ``n`` steps of an implicit integrator, a momentum flip and
BlackJAX's Metropolis test (``proposal.static_binomial_sampling``).  Two
changes, and why:

* Integrator.  BlackJAX ships the implicit *midpoint* rule, whose fixed
  point couples x and p: its iteration contracts only at rate ~ eps * omega / 2
  even for a constant metric (on the 2-d Gaussian at eps ~ 1 it took ~16
  map evaluations per step, each a gradient plus a metric derivative).  The
  paper's sampler uses the *generalized leapfrog* (GL), which we write here:
  an implicit half step in p at the old x (the metric and its derivatives at
  x are computed once and reused by every iteration), an implicit full step
  in x (each iteration needs only ``G(x)^{-1} p``), an explicit half step in p.
  The position solve starts from the explicit step ``x + eps G(x)^{-1} p``.  For
  SoftAbs and a user's metric it is a chord (simplified Newton) iteration: the
  residual is corrected with the derivative of ``G^{-1} p`` at the old x, which
  the cached metric derivatives give at O(d^3) (no evaluation), and the start
  is corrected the same way.  It converges to the same point as the plain
  iteration with fewer metric evaluations (on the funnel about 6 units per step
  against 8; BENCHMARKS.md@036b7d1).  ``fisher_logistic_metric`` keeps the plain
  iteration: there the derivative costs passes over the data, about what the
  saved evaluations cost.  GL is symplectic and symmetric, so with exact solves the proposal is
  reversible and volume preserving; with the tolerance it is so up to that
  tolerance (tested).  For a constant metric both solves converge at once.
* Non-convergence.  BlackJAX's ``implicit_midpoint`` discards the solver's
  ``success`` flag.  Here both solves use BlackJAX's
  ``solve_fixed_point_iteration``; the first failed solve ends the trajectory
  and the proposal is *rejected* (acceptance probability 0, flagged
  ``is_divergent``); ``fixed_point_converged`` reports it per iteration.

Cost accounting (``num_gradient_evals``): one unit per log-density gradient
and one per metric evaluation.  A transition of ``n`` steps costs
``1 + sum_s (c_s + 2)``: the metric with derivatives at the start, then per
step ``c_s`` metric values in the position solve (1 + its iterations), the
metric with derivatives and the gradient at the new position.  The momentum
solve and the chord corrections reuse the cached metric (O(d^3)
contractions, counted as zero).  A
metric evaluation costs far more than a gradient for SoftAbs (a Hessian,
the third-derivative tensor -- O(d) Hessians -- and an O(d^3)
eigen-decomposition), so compare such runs by time as well.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import blackjax.mcmc.hmc as hmc
import blackjax.mcmc.integrators as integrators
from blackjax.mcmc.integrators import solve_fixed_point_iteration
from blackjax.mcmc.proposal import safe_energy_diff, static_binomial_sampling

from ahmc.core.config import resolve_options
from ahmc.core.options import check_option_names
from ahmc.core.space import RMHMC_NUM_STEPS_CAP

from ._jax_engine import build_engine
from ._jax_setup import engine_option_names
from ._jax_metrics import (DEFAULT_SOFTABS_ALPHA, ConstantMetric, FisherLogisticMetric, check_metric_at,
                           resolve_metric)

__all__ = ["RMHMCInfo", "build_rmhmc_kernel", "build_rmhmc_engine", "default_max_integration_time", "default_tolerance",
           "transition_kernel"]

DEFAULT_MAX_FIXED_POINT_ITERATIONS = 30


class RMHMCInfo(NamedTuple):
    """One RMHMC transition (fields as BlackJAX's ``HMCInfo`` plus the solver's report).

    acceptance_rate             Metropolis acceptance probability (0 if a solve failed)
    is_accepted                 whether the proposal was accepted
    is_divergent                energy error above the threshold, or a failed solve
    energy                      H of the state after the transition (the proposal's if accepted)
    num_integration_steps       leapfrog steps asked for
    fixed_point_converged       every fixed-point solve of the trajectory converged
    num_fixed_point_iterations  evaluations of the two fixed-point maps (all steps)
    num_gradient_evals          log-density gradients + metric evaluations (see module doc)
    """

    acceptance_rate: Any
    is_accepted: Any
    is_divergent: Any
    energy: Any
    num_integration_steps: Any
    fixed_point_converged: Any
    num_fixed_point_iterations: Any
    num_gradient_evals: Any


def default_tolerance(dtype) -> float:
    """Max-abs change between fixed-point iterates: 1e-6 in float64, 1e-4 in float32 (its rounding)."""
    return 1e-6 if jnp.finfo(dtype).bits >= 64 else 1e-4


class LeapfrogState(NamedTuple):
    """Position, momentum and what is known at the position (flat vectors)."""

    x: Any
    p: Any
    cache: Any  # metric.at(x)
    logdensity: Any
    grad: Any


def generalized_leapfrog_step(metric, logdensity_and_grad, step_size, tolerance, max_iterations):
    """One generalized leapfrog step (Girolami & Calderhead 2011, eqs. 16-18).

    ``(LeapfrogState) -> (LeapfrogState, converged, map evaluations, metric-value evaluations)``:
    an implicit half step in p (at the old x), an implicit full step in x, an
    explicit half step in p (at the new x).
    """
    half = 0.5 * step_size

    def one_step(state: LeapfrogState):
        def momentum_map(p):
            return state.p - half * (metric.kinetic_grad_x(state.cache, p) - state.grad), None

        p_half, _, info_p = solve_fixed_point_iteration(
            momentum_map, state.p, convergence_tol=tolerance, max_iters=max_iterations)
        velocity0 = metric.velocity(state.cache, p_half)

        def plain_map(y):
            return state.x + half * (velocity0 + metric.velocity_at(y, p_half)), None

        def chord_map(y):
            # A chord (simplified Newton) step for y = x + eps/2 (G(x)^-1 p' + G(y)^-1 p'): the residual
            # times ~(I - eps/2 J)^-1 to second order, J = d(G^-1 p')/dx at the old x from the cache.
            # Same solution as the plain iteration; the error contracts at O(eps^2) per metric value
            # instead of O(eps).
            residual = y - plain_map(y)[0]
            first = half * metric.velocity_derivative(state.cache, velocity0, residual)
            return y - (residual + first + half * metric.velocity_derivative(state.cache, velocity0, first)), None

        # Start from the explicit step x + eps G(x)^-1 p' (the plain map's value at x, known without a
        # metric evaluation), with the chord: corrected to second order in eps by the same derivative.
        explicit = step_size * velocity0
        if metric.velocity_derivative is None:
            position_map, start = plain_map, state.x + explicit
        else:
            position_map = chord_map
            start = state.x + explicit + half * metric.velocity_derivative(state.cache, velocity0, explicit)
        x_new, _, info_x = solve_fixed_point_iteration(
            position_map, start, convergence_tol=tolerance, max_iters=max_iterations - 1)
        cache = metric.at(x_new)
        logdensity, grad = logdensity_and_grad(x_new)
        p_new = p_half - half * (metric.kinetic_grad_x(cache, p_half) - grad)
        converged = info_p.success & info_x.success
        map_calls = 2 + info_p.iters + info_x.iters
        return LeapfrogState(x_new, p_new, cache, logdensity, grad), converged, map_calls, 1 + info_x.iters

    return one_step


def build_rmhmc_kernel(
    metric_builder: Callable,
    *,
    fixed_point_tolerance: float | None = None,
    max_fixed_point_iterations: int = DEFAULT_MAX_FIXED_POINT_ITERATIONS,
    divergence_threshold: float = 1000.0,
) -> Callable:
    """An RMHMC kernel with the signature of ``blackjax.mcmc.hmc.build_kernel``'s.

    ``kernel(rng_key, HMCState, logdensity_fn, step_size, inverse_mass_matrix, num_integration_steps)
    -> (HMCState, RMHMCInfo)``; ``inverse_mass_matrix`` is ignored (the metric is
    ``metric_builder(flat_logdensity, flat_position)``, see :func:`ahmc.adapters._jax_metrics.resolve_metric`).
    """

    def kernel(rng_key, state: hmc.HMCState, logdensity_fn, step_size, inverse_mass_matrix, num_integration_steps):
        del inverse_mass_matrix
        flat0, unravel = ravel_pytree(state.position)
        grad0, _ = ravel_pytree(state.logdensity_grad)

        def logp(x):
            return logdensity_fn(unravel(x))

        metric = metric_builder(logp, flat0)
        tolerance = default_tolerance(flat0.dtype) if fixed_point_tolerance is None else fixed_point_tolerance
        step = generalized_leapfrog_step(metric, jax.value_and_grad(logp), step_size, tolerance,
                                         max_fixed_point_iterations)
        key_momentum, key_accept = jax.random.split(rng_key)
        cache0 = metric.at(flat0)
        p0 = metric.sample_momentum(cache0, key_momentum)
        initial_energy = -state.logdensity + metric.kinetic_energy(cache0, p0)

        def keep_going(carry):
            i, _, converged, _, _ = carry
            return (i < num_integration_steps) & converged

        def leapfrog(carry):
            i, lf, _, map_calls, metric_values = carry
            lf, converged, calls, values = step(lf)
            return i + 1, lf, converged, map_calls + calls, metric_values + values

        zero = jnp.asarray(0, jnp.int32)
        start = LeapfrogState(flat0, p0, cache0, state.logdensity, grad0)
        steps_taken, end, converged, map_calls, metric_values = jax.lax.while_loop(
            keep_going, leapfrog, (zero, start, jnp.asarray(True), zero, zero))
        new_energy = -end.logdensity + metric.kinetic_energy(end.cache, -end.p)
        # A non-finite proposal energy (an overflow, a singular metric) is a divergence, never accepted.
        delta = jnp.where(converged & jnp.isfinite(new_energy), safe_energy_diff(initial_energy, new_energy), -jnp.inf)
        proposal = hmc.HMCState(unravel(end.x), end.logdensity, unravel(end.grad))
        new_state, (accepted, p_accept, _) = static_binomial_sampling(key_accept, delta, state, proposal)
        # Cost units (module doc): metric.at at the start, then per step the position solve's
        # metric values, metric.at and the gradient at the new position.
        units = 1 + metric_values + 2 * steps_taken
        info = RMHMCInfo(
            acceptance_rate=p_accept, is_accepted=accepted, is_divergent=-delta > divergence_threshold,
            energy=jnp.where(accepted, new_energy, initial_energy), num_integration_steps=num_integration_steps, fixed_point_converged=converged,
            num_fixed_point_iterations=map_calls, num_gradient_evals=units,
        )
        return new_state, info

    return kernel


def _dense_hmc_kernel(metric: ConstantMetric, integrator, divergence_threshold):
    """Plain HMC with the dense inverse mass matrix of a constant metric (no implicit solver)."""
    base = hmc.build_kernel(integrator, divergence_threshold)

    def kernel(rng_key, state, logdensity_fn, step_size, inverse_mass_matrix, num_integration_steps):
        del inverse_mass_matrix
        inverse = jnp.asarray(metric.inverse_matrix, state.logdensity.dtype)
        return base(rng_key, state, logdensity_fn, step_size, inverse, num_integration_steps)

    return kernel


def validate_rmhmc_options(options: dict) -> None:
    """The RMHMC engine sets the metric itself: reject the mass-matrix knobs of AdaptiveHMC."""
    if options.get("adapt_mass_matrix"):
        raise ValueError(
            "adapt_mass_matrix=True does not apply to RMHMC: the metric G(x) replaces the adapted mass "
            "matrix (the warm-up adapts only the step size). Drop adapt_mass_matrix."
        )
    if options.get("dense_mass"):
        raise ValueError(
            f"dense_mass={options['dense_mass']!r} does not apply to RMHMC: the metric G(x) replaces the mass "
            "matrix. Pass metric=constant_metric(G) for a fixed dense metric, or use AdaptiveHMC(dense_mass=True)."
        )
    if options.get("metric_recipe") is not None:
        raise ValueError(
            f"metric_recipe={options['metric_recipe']!r} does not apply to RMHMC: the metric G(x) replaces the "
            "estimated mass matrix. Drop metric_recipe, or use AdaptiveHMC(metric_recipe=...).")
    if options.get("inverse_mass_matrix") is not None:
        raise ValueError(
            "inverse_mass_matrix does not apply to RMHMC; pass metric=constant_metric(G) for a fixed dense "
            "metric (plain HMC with inverse mass matrix G^-1)."
        )


def transition_kernel(
    metric: Any = "softabs",
    *,
    softabs_alpha: float = DEFAULT_SOFTABS_ALPHA,
    fixed_point_tolerance: float | None = None,
    max_fixed_point_iterations: int = DEFAULT_MAX_FIXED_POINT_ITERATIONS,
    divergence_threshold: float = 1000.0,
    integrator: Callable | None = None,
) -> Callable:
    """The kernel for ``metric``: RMHMC, or dense-metric HMC for :func:`constant_metric` (validates knobs)."""
    if fixed_point_tolerance is not None and not fixed_point_tolerance > 0:
        raise ValueError(f"fixed_point_tolerance must be > 0 (max-abs change of the iterates); "
                         f"got {fixed_point_tolerance!r}.")
    if not isinstance(max_fixed_point_iterations, (int, np.integer)) or max_fixed_point_iterations < 1:
        raise ValueError(f"max_fixed_point_iterations must be a positive integer; got {max_fixed_point_iterations!r}.")
    resolved = resolve_metric(metric, softabs_alpha)
    if isinstance(resolved, ConstantMetric):
        return _dense_hmc_kernel(resolved, integrator or integrators.velocity_verlet, divergence_threshold)
    if integrator is not None:
        raise ValueError("integrator applies only to metric=constant_metric(...); RMHMC uses the implicit "
                         "midpoint rule. Drop integrator.")
    return build_rmhmc_kernel(resolved, fixed_point_tolerance=fixed_point_tolerance,
                              max_fixed_point_iterations=int(max_fixed_point_iterations),
                              divergence_threshold=divergence_threshold)


#: The Riemannian kernel's own knobs (they need ``metric=``).
RMHMC_KNOBS = ("softabs_alpha", "fixed_point_tolerance", "max_fixed_point_iterations")


def kernel_for(metric, options: dict) -> Callable:
    """The transition for ``metric`` with a run's options (its knobs, ``divergence_threshold``, ``integrator``):
    the run's engine and a warm start's check use the same one."""
    names = RMHMC_KNOBS + ("divergence_threshold", "integrator")
    return transition_kernel(metric, **{name: options[name] for name in names if name in options})


def check_initial_metric(metric, positions) -> None:
    """ValueError before any draw if a constant/user metric does not fit chain 0's flat position."""
    flat, _ = ravel_pytree(jax.tree.map(lambda x: x[0], positions))
    if isinstance(metric, ConstantMetric):
        if metric.matrix.shape[0] != flat.shape[0]:
            raise ValueError(f"constant_metric(matrix) has shape {metric.matrix.shape}, but the flattened "
                             f"position has {flat.shape[0]} coordinates.")
    elif callable(metric):
        check_metric_at(metric, flat)


def default_max_integration_time(metric) -> float:
    """The automatic box's longest integration time for ``metric``: 2 pi or 4 pi.

    The logistic regressions' Fisher metric is close to the posterior precision, so in its frame the
    posterior is nearly a standard normal, whose trajectories repeat with period 2 pi: longer ones
    cost gradients and gain nothing. Measured at full length against Girolami & Calderhead's setting
    (BENCHMARKS.md@036b7d1), 2 pi put both moments of Pima and Ripley at or above theirs on average, where
    4 pi fell short on Pima's variances. SoftAbs and a user's metric need not whiten the posterior
    (on the 10-d funnel ``v`` needed the longer box), and a constant metric is plain HMC: they keep
    AdaptiveHMC's 4 pi.  ``max_integration_time=`` overrides either.
    """
    return 2.0 * math.pi if isinstance(metric, FisherLogisticMetric) else 4.0 * math.pi


def build_rmhmc_engine(
    logdensity_fn: Callable,
    *,
    num_warmup: int,
    metric: Any = "softabs",
    softabs_alpha: float = DEFAULT_SOFTABS_ALPHA,
    fixed_point_tolerance: float | None = None,
    max_fixed_point_iterations: int = DEFAULT_MAX_FIXED_POINT_ITERATIONS,
    **options,
):
    """The adaptive engine (:func:`ahmc.adapters._jax_engine.build_engine`) with RMHMC transitions.

    Warm-up: dual averaging of the step size alone (``metric_fraction`` of it,
    no mass-matrix windows: G(x) is the metric), then GP-UCB rounds over
    ``(eps, L)`` in the automatic box ``eps* x step_size_factors``, ``L`` up to
    ``ceil(max_integration_time / eps*)`` (:func:`default_max_integration_time`: 2 pi for
    ``fisher_logistic_metric``, else 4 pi), unless ``step_size_bounds``/``num_steps_bounds``
    are given.  The reward is the normalized ESJD of the flat unconstrained position,
    unwhitened, as the paper measures it.  The chains' transitions run one after another
    (``sequential_chains=True``) with SoftAbs, ``vmap``-ed with any other metric.  ``options``: every other knob of ``build_engine``.
    """
    paper = options.get("paper_preset", False) is True
    tuning, execution = resolve_options(options, "ahmc (RMHMC)")  # config= and paper_preset= folded in
    check_option_names(execution, engine_option_names(build_engine), "ahmc (RMHMC)")
    options = {**tuning, **execution}
    if paper:
        options.setdefault("shared_num_steps", False)
    validate_rmhmc_options(options)
    if not isinstance(metric, ConstantMetric):  # each step costs a metric evaluation: the former cap
        options.setdefault("num_steps_cap", RMHMC_NUM_STEPS_CAP)
        # The implicit solves take a different number of iterations on each chain; vmap-ed chains all
        # wait for the slowest. That dominates for SoftAbs (an eigen-decomposition per metric value:
        # 1.4-1.8x less time per unit on the funnel one after another). Cheaper metrics gain as much
        # from vmap's batching (the funnel's Fisher metric as a matrix 1.5x faster vmap-ed, as a diagonal
        # the same either way; the Fisher helper 0.6x-1.3x; BENCHMARKS.md@036b7d1, "Chains one after another"),
        # so they stay vmap-ed.
        options.setdefault("sequential_chains", isinstance(metric, str) and metric == "softabs")
    options.setdefault("max_integration_time", default_max_integration_time(metric))
    kernel = kernel_for(metric, {**options, "softabs_alpha": softabs_alpha,
                                 "fixed_point_tolerance": fixed_point_tolerance,
                                 "max_fixed_point_iterations": max_fixed_point_iterations})
    options.pop("integrator", None)
    engine = build_engine(logdensity_fn, num_warmup=num_warmup, adapt_mass_matrix=False, kernel=kernel, **options)
    base_init = engine.init

    def init(positions, rng_key=None):
        check_initial_metric(metric, positions)
        warn_if_single_precision(positions, metric)
        return base_init(positions, rng_key)

    return engine._replace(init=init)


FLOAT32_MESSAGE = (
    "ahmc: RMHMC is running in float32 (JAX's default). Its implicit leapfrog solves and the metric's "
    "derivatives lose accuracy there, and the draws can be wrong (R-hat 1.1-1.3 on a 10-d funnel with "
    "metric='diagonal_fisher'). Enable float64 first: jax.config.update('jax_enable_x64', True), or "
    "numpyro.enable_x64() for NumPyro.")


def warn_if_single_precision(positions, metric) -> None:
    """Warn once per run when a position-dependent metric runs in float32."""
    if isinstance(metric, ConstantMetric):
        return
    leaves = jax.tree.leaves(positions)
    if leaves and all(jnp.result_type(x) == jnp.float32 for x in leaves):
        import warnings

        warnings.warn(FLOAT32_MESSAGE, UserWarning, stacklevel=3)
