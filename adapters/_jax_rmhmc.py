"""Riemann-manifold HMC for the shared JAX engine (Girolami & Calderhead 2011).

The transition is BlackJAX's RMHMC (``blackjax.rmhmc``: HMC with the implicit
midpoint integrator and a Gaussian-Riemannian momentum) with one change:
BlackJAX's ``integrators.implicit_midpoint`` discards the fixed-point solver's
``success`` flag, so a step whose solve did not converge would be used as if
it had.  Here every leapfrog step solves the midpoint equation

    z_half = z + (eps / 2) F(z_half),   F = (dH/dp, -dH/dx),   z_next = 2 z_half - z

with BlackJAX's ``solve_fixed_point_iteration``; the first failed solve ends the
trajectory and the proposal is *rejected* (acceptance probability 0, flagged
``is_divergent``); ``fixed_point_converged`` reports it per iteration.  The
implicit midpoint rule is symplectic and symmetric, so with exact solves the
proposal is reversible and volume preserving; with the tolerance
``fixed_point_tolerance`` it is so up to that tolerance (tested).

Cost accounting (``num_gradient_evals``): every evaluation of the midpoint map
costs one log-density gradient and one metric evaluation with its position
derivative; a transition with ``n`` leapfrog steps whose solves took
``c_1..c_n`` map evaluations (1 + fixed-point iterations each) costs
``2 (c_1 + .. + c_n)`` + 1 gradient at the end point + 2 metric values (the
momentum draw and the end point's kinetic energy).  Each metric evaluation is
counted as one unit whatever its cost: the SoftAbs metric costs a Hessian and
a third-derivative contraction (O(d) gradients) plus an O(d^3) eigen-
decomposition, so compare such runs by time as well.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import blackjax.mcmc.hmc as hmc
import blackjax.mcmc.integrators as integrators
from blackjax.mcmc.integrators import solve_fixed_point_iteration
from blackjax.mcmc.proposal import safe_energy_diff, static_binomial_sampling

from ._jax_engine import build_engine
from ._jax_metrics import DEFAULT_SOFTABS_ALPHA, ConstantMetric, check_metric_at, resolve_metric

__all__ = ["RMHMCInfo", "build_rmhmc_kernel", "build_rmhmc_engine", "default_tolerance"]

DEFAULT_MAX_FIXED_POINT_ITERATIONS = 30


class RMHMCInfo(NamedTuple):
    """One RMHMC transition (fields as BlackJAX's ``HMCInfo`` plus the solver's report).

    acceptance_rate             Metropolis acceptance probability (0 if a solve failed)
    is_accepted                 whether the proposal was accepted
    is_divergent                energy error above the threshold, or a failed solve
    energy                      H at the proposal
    num_integration_steps       leapfrog steps asked for
    fixed_point_converged       every fixed-point solve of the trajectory converged
    num_fixed_point_iterations  evaluations of the midpoint map (all steps)
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


def implicit_midpoint_step(metric, grad_logp, step_size, tolerance, max_iterations):
    """One implicit-midpoint step on flat ``(x, p)``; returns ``(x', p', FixedPointIterationInfo)``."""

    def one_step(x0, p0):
        def midpoint_map(z):
            x, p = z
            dk_dx, dk_dp = metric.kinetic_energy_grad(x, p)
            dh_dx = dk_dx - grad_logp(x)
            return (x0 + 0.5 * step_size * dk_dp, p0 - 0.5 * step_size * dh_dx), None

        (x_half, p_half), _, info = solve_fixed_point_iteration(
            midpoint_map, (x0, p0), convergence_tol=tolerance, max_iters=max_iterations)
        return 2.0 * x_half - x0, 2.0 * p_half - p0, info

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
    ``metric_builder(flat_logdensity)``, see :func:`ahmc.adapters._jax_metrics.resolve_metric`).
    """

    def kernel(rng_key, state: hmc.HMCState, logdensity_fn, step_size, inverse_mass_matrix, num_integration_steps):
        del inverse_mass_matrix
        flat0, unravel = ravel_pytree(state.position)
        dtype = flat0.dtype

        def logp(x):
            return logdensity_fn(unravel(x))

        metric = metric_builder(logp)
        tolerance = default_tolerance(dtype) if fixed_point_tolerance is None else fixed_point_tolerance
        step = implicit_midpoint_step(metric, jax.grad(logp), step_size, tolerance, max_fixed_point_iterations)
        key_momentum, key_accept = jax.random.split(rng_key)
        p0 = metric.sample_momentum(key_momentum, flat0)
        initial_energy = -state.logdensity + metric.kinetic_energy(flat0, p0)

        def keep_going(carry):
            i, _, _, converged, _ = carry
            return (i < num_integration_steps) & converged

        def leapfrog(carry):
            i, x, p, _, calls = carry
            x, p, info = step(x, p)
            return i + 1, x, p, info.success, calls + 1 + info.iters

        carry = (jnp.asarray(0, jnp.int32), flat0, p0, jnp.asarray(True), jnp.asarray(0, jnp.int32))
        _, x1, p1, converged, calls = jax.lax.while_loop(keep_going, leapfrog, carry)
        logdensity1, grad1 = jax.value_and_grad(logp)(x1)
        new_energy = -logdensity1 + metric.kinetic_energy(x1, -p1)
        delta = jnp.where(converged, safe_energy_diff(initial_energy, new_energy), -jnp.inf)
        proposal = hmc.HMCState(unravel(x1), logdensity1, unravel(grad1))
        new_state, (accepted, p_accept, _) = static_binomial_sampling(key_accept, delta, state, proposal)
        info = RMHMCInfo(
            acceptance_rate=p_accept, is_accepted=accepted, is_divergent=-delta > divergence_threshold,
            energy=new_energy, num_integration_steps=num_integration_steps, fixed_point_converged=converged,
            num_fixed_point_iterations=calls, num_gradient_evals=2 * calls + 3,
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
    if options.get("inverse_mass_matrix") is not None:
        raise ValueError(
            "inverse_mass_matrix does not apply to RMHMC; pass metric=constant_metric(G) for a fixed dense "
            "metric (plain HMC with inverse mass matrix G^-1)."
        )


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
    ``(eps, L)`` in the automatic box ``eps* x step_size_factors`` unless
    ``step_size_bounds``/``num_steps_bounds`` are given.  The reward is the
    normalized ESJD of the flat unconstrained position, unwhitened, as the
    paper measures it.  ``options``: every other knob of ``build_engine``.
    """
    validate_rmhmc_options(options)
    if fixed_point_tolerance is not None and not fixed_point_tolerance > 0:
        raise ValueError(f"fixed_point_tolerance must be > 0 (max-abs change of the iterates); "
                         f"got {fixed_point_tolerance!r}.")
    if not isinstance(max_fixed_point_iterations, (int, np.integer)) or max_fixed_point_iterations < 1:
        raise ValueError(f"max_fixed_point_iterations must be a positive integer; got {max_fixed_point_iterations!r}.")
    resolved = resolve_metric(metric, softabs_alpha)
    divergence_threshold = options.get("divergence_threshold", 1000.0)
    if isinstance(resolved, ConstantMetric):
        kernel = _dense_hmc_kernel(resolved, options.pop("integrator", integrators.velocity_verlet),
                                   divergence_threshold)
    else:
        if "integrator" in options:
            raise ValueError("integrator applies only to metric=constant_metric(...); RMHMC uses the implicit "
                             "midpoint rule. Drop integrator.")
        kernel = build_rmhmc_kernel(resolved, fixed_point_tolerance=fixed_point_tolerance,
                                    max_fixed_point_iterations=int(max_fixed_point_iterations),
                                    divergence_threshold=divergence_threshold)
    engine = build_engine(logdensity_fn, num_warmup=num_warmup, adapt_mass_matrix=False, kernel=kernel, **options)
    base_init = engine.init

    def init(positions, rng_key=None):
        first = jax.tree.map(lambda x: x[0], positions)
        flat, _ = ravel_pytree(first)
        if isinstance(resolved, ConstantMetric):
            if resolved.matrix.shape[0] != flat.shape[0]:
                raise ValueError(f"constant_metric(matrix) has shape {resolved.matrix.shape}, but the flattened "
                                 f"position has {flat.shape[0]} coordinates.")
        elif callable(metric) and not isinstance(metric, str):
            check_metric_at(metric, flat)
        return base_init(positions, rng_key)

    return engine._replace(init=init)
