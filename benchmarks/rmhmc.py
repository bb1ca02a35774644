"""Adaptive RMHMC (ARMHMC) against RMHMC with hand-set parameters and against NUTS.

The paper's comparison (ICML 2013, Figure 2 bottom row) on the three logistic
regressions (pima, ripley, breast_cancer; metric: expected Fisher information
plus prior precision, ``fisher_logistic_metric(X, 100)`` with a column of ones
for the intercept), and ARMHMC with the SoftAbs metric (generic) and with
the funnel's expected Fisher information (user-supplied, ``armhmc_fisher``) against BlackJAX NUTS
on Neal's funnel in 10 dimensions (v ~ N(0, 3^2), x_i | v ~ N(0, exp(v/2)^2)).

Samplers (4 chains, the same starting points, ``init + Uniform(-2, 2)``):

* ``armhmc``: ``ahmc.adapters.blackjax.run_rmhmc_chains`` (default knobs:
  dual averaging of eps for half the warm-up, then GP-UCB over (eps, L) in
  the box eps* x (0.5, 2), L in [1, ceil(4 pi / eps*)]; infinite adaptation).
* ``rmhmc_fixed_0.5x6`` / ``rmhmc_fixed_0.25x6``: the same RMHMC kernel with
  hand-set eps = 0.5 (or 0.25) and L = 6 leapfrog steps every iteration (no
  jitter, no adaptation); its "warm-up" is burn-in of the same length.
* ``rmhmc_gc_0.5x6``: the protocol of Girolami & Calderhead (2011), whose code the
  paper used for its RMHMC baseline: eps = 0.5 and ``L_t ~ U{1..6}`` drawn afresh
  every iteration (their logistic-regression scripts set 6 steps of 3/6 and take
  ``ceil(rand * 6)`` of them); no adaptation.
* Any other arm by name: ``rmhmc_fixed_<eps>x<L>`` or ``rmhmc_gc_<eps>x<L>`` (a scan of hand-set
  arms around the ones the tuner picks).
* The hand-set samplers start where ARMHMC's warm-up ended (ARMHMC's first kept draw of each
  chain): from the Uniform(-2, 2) starts both settings stayed stuck (the
  implicit solves diverge where the Fisher metric is nearly singular; no
  proposal was accepted on pima in a first quick run), which would measure
  the start rather than the step size.
* ``blackjax_nuts`` (funnel only): ``benchmarks.samplers.run_blackjax_nuts``
  (window adaptation, diagonal mass matrix), chains ``vmap``-ed as BlackJAX's examples run
  them; ``blackjax_nuts_sequential``: the same with the chains one after another, as ARMHMC
  and the hand-set RMHMC run theirs (a chain then never waits for another's longer trajectory).
* ``armhmc_diagonal_fisher`` (funnel only): ARMHMC with the diagonal of the metric that
  ``AdaptiveRMHMC(model, metric="diagonal_fisher")`` reads off the funnel's NumPyro model
  (``model_fisher_metric``): the hand-written ``armhmc_fisher`` metric, built with nothing from the user.
* ``armhmc_model_fisher`` (NumPyro models): the whole (d, d) metric of ``metric="fisher"``.
* ``gp_pois_regr_centered``: posteriordb's gp_pois_regr with ``f ~ MVN(0, K(rho, alpha))`` (centered),
  scored against the non-centered reference; its metric holds the covariance's Fisher information.

Cost: one unit per log-density gradient and one per metric evaluation
(``EngineInfo.num_gradient_evals``; see ``ahmc.adapters._jax_rmhmc``); NUTS:
one unit per leapfrog step.  ESS per unit and per second of the sampling
phase (compilation excluded), minimum over coordinates.  Every sampler's phases are
compiled ahead of time and timed as the calls of the compiled programs.

    ./dev run python -m benchmarks.rmhmc [--quick] [--models pima,funnel]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .metrics import CompileClock, summarize
from .models import Model, get_model, initial_positions, load_breast_cancer, load_pima, load_ripley, standardize
from .run import environment, free_compiled_programs
from .samplers import (SamplerRun, _as_float_list, _map_over_chains, _timing, run_blackjax_nuts,
                       run_engine_phases)

RESULTS = Path(__file__).resolve().parent / "results"
LOGISTIC = {"pima": load_pima, "ripley": load_ripley, "breast_cancer": load_breast_cancer}
# Hand-set (eps, L, jitter): the brief's 0.5 x 6 (trajectory length 3), a shorter, more cautious 0.25 x 6,
# and Girolami & Calderhead's protocol, 0.5 with L_t ~ U{1..6} (jitter=True).
FIXED = {"rmhmc_fixed_0.5x6": (0.5, 6, False), "rmhmc_fixed_0.25x6": (0.25, 6, False),
         "rmhmc_gc_0.5x6": (0.5, 6, True)}
MODES = {"quick": (500, 1000), "full": (1000, 2000)}


def funnel_model(dim: int = 10) -> Model:
    import jax.numpy as jnp

    def logdensity_fn(x):
        v, rest = x[0], x[1:]
        return -(v**2) / 18.0 - 0.5 * jnp.sum(rest**2) * jnp.exp(-v) - 0.5 * rest.shape[0] * v

    return Model("funnel", logdensity_fn, dim, np.zeros(dim), f"Neal's funnel, d = {dim}")


def funnel_fisher_metric(dim: int, dense: bool = False):
    """The funnel's expected Fisher information plus prior precision, a user-supplied metric.

    The Hessian of -log p averaged over x | v: ``diag(1/9 + (dim - 1)/2, exp(-v), ..., exp(-v))``
    (the cross terms ``-x_i exp(-v)`` average to zero).  Diagonal, positive definite everywhere and
    cheap: what a user who knows the model's hierarchy would hand ``metric=`` instead of SoftAbs.
    Returned as its ``(dim,)`` diagonal (the adapters' diagonal route), or with ``dense=True`` as
    the ``(dim, dim)`` matrix (the generic route, sampler ``armhmc_fisher_dense``: same chains to
    rounding, more time per unit).
    """
    import jax.numpy as jnp

    def metric(x):
        diagonal = jnp.concatenate([jnp.full((1,), 1.0 / 9.0 + (dim - 1) / 2.0), jnp.exp(-x[0]) * jnp.ones(dim - 1)])
        return jnp.diag(diagonal) if dense else diagonal

    return metric


def funnel_numpyro_model(dim: int = 10):
    """The same funnel as a NumPyro model: sites ``v`` and ``x`` flatten (sorted names) to ``[v, x_1..]``,
    the order of :func:`funnel_model`'s position."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    def model():
        v = numpyro.sample("v", dist.Normal(0.0, 3.0))
        numpyro.sample("x", dist.Normal(0.0, jnp.exp(v / 2.0)).expand([dim - 1]))

    return model


EIGHT_SCHOOLS_Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
EIGHT_SCHOOLS_SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def eight_schools_centered_numpyro():
    """Eight schools, *centered* (theta_j ~ N(mu, tau)): the funnel between tau and the theta's that the
    non-centered posteriordb version removes. Same posterior, so its reference scores the draws."""
    import numpyro
    import numpyro.distributions as dist

    def model():
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        theta = numpyro.sample("theta", dist.Normal(mu, tau).expand([8]))
        numpyro.sample("y", dist.Normal(theta, EIGHT_SCHOOLS_SIGMA), obs=EIGHT_SCHOOLS_Y)

    return model


def _numpyro_flat_model(numpyro_model, name: str, description: str, reference: str, derived_fn) -> Model:
    """The flat log density NumPyro gives ``numpyro_model`` (its unconstrained sites raveled in sorted-name
    order), started at the origin, scored against the posteriordb ``reference``."""
    import jax
    from jax.flatten_util import ravel_pytree
    from numpyro.infer.util import initialize_model

    info = initialize_model(jax.random.key(0), numpyro_model)
    flat, unravel = ravel_pytree(info.param_info.z)

    def logdensity_fn(x):
        return -info.potential_fn(unravel(x))

    return Model(name, logdensity_fn, flat.shape[0], np.zeros(flat.shape[0]), description, reference=reference,
                 derived_fn=derived_fn)


def eight_schools_centered_model() -> Model:
    """The centered model's flat log density: position (mu, log tau, theta_1..8)."""
    def derived_fn(draws):
        return {"mu": draws[..., 0], "tau": np.exp(draws[..., 1]), "theta": draws[..., 2:]}

    return _numpyro_flat_model(eight_schools_centered_numpyro(), "eight_schools_centered",
                               "eight schools, centered (NumPyro)", "eight_schools-eight_schools_noncentered",
                               derived_fn)


GP_POSTERIOR = "gp_pois_regr-gp_pois_regr"


def gp_pois_regr_centered_numpyro():
    """posteriordb's gp_pois_regr with the latent field *centered*, ``f ~ MVN(0, K(rho, alpha))`` (the
    posteriordb model draws ``f_tilde ~ N(0, I)`` and sets ``f = chol(K) f_tilde``): the same posterior,
    whose metric needs the covariance's Fisher information for rho and alpha."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    from .posteriordb import load_data

    data = load_data(GP_POSTERIOR)
    x, counts = jnp.asarray(data["x"], float), jnp.asarray(data["k"])

    def model():
        rho = numpyro.sample("rho", dist.Gamma(25.0, 4.0))
        alpha = numpyro.sample("alpha", dist.HalfNormal(2.0))
        cov = alpha**2 * jnp.exp(-((x[:, None] - x[None, :]) ** 2) / (2 * rho**2)) + 1e-10 * jnp.eye(data["N"])
        f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(data["N"]), cov))
        numpyro.sample("k", dist.Poisson(jnp.exp(f)), obs=counts)

    return model


def gp_pois_regr_centered_model() -> Model:
    """The centered model's flat log density: position (log alpha, f_1..11, log rho)."""
    def derived_fn(draws):
        return {"alpha": np.exp(draws[..., 0]), "f": draws[..., 1:-1], "rho": np.exp(draws[..., -1])}

    return _numpyro_flat_model(gp_pois_regr_centered_numpyro(), "gp_pois_regr_centered",
                               "gp_pois_regr with the latent field centered (NumPyro)", GP_POSTERIOR, derived_fn)


NUMPYRO_MODELS = {"funnel": lambda model: funnel_numpyro_model(model.dim),
                  "eight_schools_centered": lambda model: eight_schools_centered_numpyro(),
                  "gp_pois_regr_centered": lambda model: gp_pois_regr_centered_numpyro()}


def build_model(name: str) -> Model:
    builders = {"funnel": funnel_model, "eight_schools_centered": eight_schools_centered_model,
                "gp_pois_regr_centered": gp_pois_regr_centered_model}
    return builders[name]() if name in builders else get_model(name)


def metric_for(name: str):
    from ahmc.adapters.blackjax import fisher_logistic_metric

    if name in ("funnel", *NUMPYRO_MODELS):
        return "softabs"
    features, _, _ = LOGISTIC[name]()
    design = np.column_stack([np.ones(len(features)), standardize(np.asarray(features, dtype=np.float64))])
    return fisher_logistic_metric(design, prior_variance=100.0)


def _split(info_field, is_warmup):
    values = np.asarray(info_field)
    return np.where(is_warmup, values, 0).sum(axis=0), np.where(is_warmup, 0, values).sum(axis=0)


def run_armhmc(rng_key, model, positions, num_warmup, num_samples, metric, **options) -> SamplerRun:
    """ARMHMC as ``ahmc.adapters.blackjax.run_rmhmc_chains`` runs it (same keys, same draws), with the
    warm-up and the sampling phase each compiled ahead of time and timed apart (``run_engine_phases``;
    until 2026-11-28 one timed call was apportioned to the phases by their cost units)."""
    from ahmc.adapters._jax_rmhmc import build_rmhmc_engine
    from ahmc.adapters.blackjax import _options

    engine = build_rmhmc_engine(model.logdensity_fn, num_warmup=num_warmup, metric=metric,
                                **_options(bool(options.pop("paper_preset", False)), dict(options)))
    clock, _, info, samples = run_engine_phases(engine, rng_key, positions, num_warmup, num_samples)
    is_warmup = np.asarray(info.is_warmup, dtype=bool)
    units_warmup, units_sampling = _split(info.num_gradient_evals, is_warmup)
    divergent_warmup, divergent_sampling = _split(info.is_divergent, is_warmup)
    sampling = ~is_warmup
    return SamplerRun(
        draws=np.asarray(samples), num_grads_warmup=units_warmup, num_grads_sampling=units_sampling,
        num_divergent_warmup=divergent_warmup, num_divergent_sampling=divergent_sampling,
        timing=_timing(clock, clock.run_s["warmup"], clock.run_s["sampling"]),
        extra={
            "final_step_size": _as_float_list(np.asarray(info.step_size)[-1]),
            "final_num_steps": _as_float_list(np.asarray(info.num_steps)[-1]),
            "mean_acceptance": float(np.asarray(info.acceptance_rate)[sampling].mean()),
            "fixed_point_converged": float(np.asarray(info.fixed_point_converged)[sampling].mean()),
            "units_per_draw": float(units_sampling.sum() / sampling.sum()),
            "leapfrog_steps_per_draw": float(np.asarray(info.num_integration_steps)[sampling].mean()),
        },
    )


def run_fixed_rmhmc(rng_key, model, positions, num_warmup, num_samples, metric, step_size, num_steps,
                    jitter=False) -> SamplerRun:
    """RMHMC with hand-set ``step_size`` and ``num_steps``; ``jitter=True`` draws ``L_t ~ U{1..num_steps}``
    every iteration (Girolami & Calderhead's protocol) instead of taking ``num_steps`` each time."""
    import jax
    import jax.numpy as jnp

    import blackjax
    from ahmc.adapters._jax_rmhmc import transition_kernel

    kernel = transition_kernel(metric)
    logdensity_fn = model.logdensity_fn

    def run(key, position, num):
        state = blackjax.mcmc.hmc.init(position, logdensity_fn)

        def body(state, step_key):
            num = num_steps
            if jitter:  # split only here: the fixed-L draws stay those of earlier runs
                key_l, step_key = jax.random.split(step_key)
                num = jax.random.randint(key_l, (), 1, num_steps + 1)
            state, info = kernel(step_key, state, logdensity_fn, step_size, None, num)
            return state, (state.position, info.num_gradient_evals, info.is_divergent, info.acceptance_rate,
                           info.fixed_point_converged)

        return jax.lax.scan(body, state, jax.random.split(key, num))

    warm_key, sample_key = jax.random.split(rng_key)
    num_chains = positions.shape[0]
    clock = CompileClock()
    # Chains one after another, as ARMHMC runs them (its engine's sequential_chains): vmap-ed, every
    # chain would wait for the slowest implicit solve.
    with clock.phase("warmup"):
        args = (jax.random.split(warm_key, num_chains), jnp.asarray(positions))
        warm = _map_over_chains(lambda key, position: run(key, position, num_warmup))
        compiled = jax.jit(warm).lower(*args).compile()
        states, (_, units_w, div_w, _, _) = clock.execute(compiled, *args)
    with clock.phase("sampling"):
        sample_one = _map_over_chains(lambda key, state: run(key, state.position, num_samples))  # from burn-in's end
        args = (jax.random.split(sample_key, num_chains), states)
        compiled = jax.jit(sample_one).lower(*args).compile()
        _, (draws, units_s, div_s, accept, converged) = clock.execute(compiled, *args)
    return SamplerRun(
        draws=np.asarray(draws), num_grads_warmup=np.asarray(units_w).sum(axis=1),
        num_grads_sampling=np.asarray(units_s).sum(axis=1), num_divergent_warmup=np.asarray(div_w).sum(axis=1),
        num_divergent_sampling=np.asarray(div_s).sum(axis=1),
        timing=_timing(clock, clock.run_s["warmup"], clock.run_s["sampling"]),
        extra={
            "step_size": step_size, "num_steps": num_steps, "jitter": bool(jitter),
            "mean_acceptance": float(np.asarray(accept).mean()),
            "fixed_point_converged": float(np.asarray(converged).mean()),
            "units_per_draw": float(np.asarray(units_s).mean()),
        },
    )


def _nuts(rng_key, model, positions, num_warmup, num_samples, metric, **options) -> SamplerRun:
    del metric
    return run_blackjax_nuts(rng_key, model, positions, num_warmup, num_samples, **options)


def _nuts_sequential(rng_key, model, positions, num_warmup, num_samples, metric, **options) -> SamplerRun:
    """BlackJAX NUTS with the chains run one after another, as ARMHMC runs its chains: vmap-ed, every
    chain of an iteration waits for the deepest tree (on the funnel the neck's chains build far longer
    trees than the mouth's)."""
    del metric
    return run_blackjax_nuts(rng_key, model, positions, num_warmup, num_samples,
                             **{"chain_method": "sequential", **options})


def _fixed(step_size, num_steps, jitter):
    def runner(rng_key, model, positions, num_warmup, num_samples, metric, **options):
        if options:
            raise ValueError(f"the fixed-parameter RMHMC takes no options (got {sorted(options)})")
        return run_fixed_rmhmc(rng_key, model, positions, num_warmup, num_samples, metric, step_size, num_steps,
                               jitter)

    return runner


def _armhmc_paper_box(rng_key, model, positions, num_warmup, num_samples, metric, **options) -> SamplerRun:
    """ARMHMC in the paper's box for logistic regression (section 5.1): eps in [0.1, 1], L in {1..12}."""
    return run_armhmc(rng_key, model, positions, num_warmup, num_samples, metric,
                      **{"step_size_bounds": (0.1, 1.0), "num_steps_bounds": (1, 12), **options})


def _armhmc_no_penalty(rng_key, model, positions, num_warmup, num_samples, metric, **options) -> SamplerRun:
    """ARMHMC with the paper's reward (``divergence_penalty=0``; a failed implicit solve counts as divergent)."""
    return run_armhmc(rng_key, model, positions, num_warmup, num_samples, metric,
                      **{"divergence_penalty": 0.0, **options})


def _armhmc_fp10(rng_key, model, positions, num_warmup, num_samples, metric, **options) -> SamplerRun:
    """ARMHMC with at most 10 fixed-point iterations per implicit solve (default 30): a solve that has
    not converged by then is rejected sooner, and the tuner learns to avoid the arms that cause it."""
    return run_armhmc(rng_key, model, positions, num_warmup, num_samples, metric,
                      **{"max_fixed_point_iterations": 10, **options})


def _armhmc_fisher(rng_key, model, positions, num_warmup, num_samples, metric, dense=False,
                   **options) -> SamplerRun:
    """ARMHMC on the funnel with its expected Fisher information (:func:`funnel_fisher_metric`)
    as a user-supplied metric instead of the generic SoftAbs."""
    del metric
    if model.name != "funnel":
        raise ValueError("armhmc_fisher is the funnel's metric; the logistic regressions' armhmc already "
                         "uses their Fisher metric")
    return run_armhmc(rng_key, model, positions, num_warmup, num_samples,
                      funnel_fisher_metric(model.dim, dense=dense), **options)


def _armhmc_fisher_dense(rng_key, model, positions, num_warmup, num_samples, metric, **options) -> SamplerRun:
    """``armhmc_fisher`` with the metric given as a (d, d) matrix: the generic route (Cholesky factor,
    (d, d, d) derivative tensor) that the funnel's diagonal metric took until 2026-11-28."""
    return _armhmc_fisher(rng_key, model, positions, num_warmup, num_samples, metric, dense=True, **options)


def _armhmc_diagonal_softabs(rng_key, model, positions, num_warmup, num_samples, metric, **options) -> SamplerRun:
    """ARMHMC with ``metric="diagonal_softabs"``: SoftAbs of the Hessian's diagonal, generic and cheap."""
    del metric
    return run_armhmc(rng_key, model, positions, num_warmup, num_samples, "diagonal_softabs", **options)


def _model_fisher(diagonal: bool):
    """ARMHMC with the metric ``AdaptiveRMHMC(model, metric="diagonal_fisher")`` (``diagonal``) or
    ``metric="fisher"`` (the whole (d, d) matrix, for models whose sites tie coordinates together) builds
    from the NumPyro model's sites (``model_fisher_metric``): nothing from the user."""
    name = "armhmc_diagonal_fisher" if diagonal else "armhmc_model_fisher"

    def sampler(rng_key, model, positions, num_warmup, num_samples, metric, **options) -> SamplerRun:
        from ahmc.adapters.numpyro import model_fisher_metric

        del metric
        if model.name not in NUMPYRO_MODELS:
            raise ValueError(f"{name} needs a NumPyro model: {', '.join(NUMPYRO_MODELS)}")
        return run_armhmc(rng_key, model, positions, num_warmup, num_samples,
                          model_fisher_metric(NUMPYRO_MODELS[model.name](model), diagonal=diagonal), **options)

    return sampler


def _armhmc_upper_half(rng_key, model, positions, num_warmup, num_samples, metric, **options) -> SamplerRun:
    """ARMHMC with ``min_steps_fraction=0.5``: ``L_t ~ U{ceil(L/2)..L}``, closer to the fixed-``L``
    trajectories of the hand-set RMHMC than the paper's ``U{1..L}``."""
    return run_armhmc(rng_key, model, positions, num_warmup, num_samples, metric,
                      **{"min_steps_fraction": 0.5, **options})


HAND_SET_NAME = re.compile(r"rmhmc_(fixed|gc)_(\d+(?:\.\d+)?)x(\d+)")


def hand_set_parameters(name: str) -> tuple[float, int, bool] | None:
    """(eps, L, jitter) of a hand-set sampler name, ``None`` for any other sampler.

    Besides the named ones in ``FIXED``, any ``rmhmc_fixed_<eps>x<L>`` (L steps every iteration) or
    ``rmhmc_gc_<eps>x<L>`` (Girolami & Calderhead's ``L_t ~ U{1..L}``) runs, e.g. ``rmhmc_gc_0.7x4``:
    a scan of fixed arms shows where on the reward surface the tuner's arms sit.
    """
    if name in FIXED:
        return FIXED[name]
    match = HAND_SET_NAME.fullmatch(name)
    if match is None or float(match[2]) <= 0 or int(match[3]) < 1:
        return None
    return float(match[2]), int(match[3]), match[1] == "gc"


def runner(name: str):
    """The function that runs sampler ``name`` (a key of ``SAMPLERS`` or a hand-set name), or ``None``."""
    parameters = hand_set_parameters(name)
    return _fixed(*parameters) if parameters is not None else SAMPLERS.get(name)


SAMPLERS = {"armhmc": run_armhmc, "armhmc_upper_half": _armhmc_upper_half, "armhmc_paper_box": _armhmc_paper_box,
            "armhmc_no_penalty": _armhmc_no_penalty, "armhmc_fp10": _armhmc_fp10, "armhmc_fisher": _armhmc_fisher,
            "armhmc_fisher_dense": _armhmc_fisher_dense, "armhmc_diagonal_softabs": _armhmc_diagonal_softabs,
            "armhmc_diagonal_fisher": _model_fisher(diagonal=True),
            "armhmc_model_fisher": _model_fisher(diagonal=False),
            "blackjax_nuts": _nuts, "blackjax_nuts_sequential": _nuts_sequential,
            **{name: _fixed(*parameters) for name, parameters in FIXED.items()}}
LOGISTIC_PLAN = ("armhmc", *FIXED)
PLAN = {"pima": LOGISTIC_PLAN, "ripley": LOGISTIC_PLAN, "breast_cancer": LOGISTIC_PLAN,
        "funnel": ("armhmc", "armhmc_fisher", "blackjax_nuts", "blackjax_nuts_sequential"),
        "eight_schools_centered": ("armhmc_diagonal_fisher", "armhmc", "blackjax_nuts_sequential"),
        "gp_pois_regr_centered": ("armhmc_model_fisher", "armhmc_diagonal_fisher", "blackjax_nuts_sequential")}


def funnel_features(draws: np.ndarray) -> np.ndarray:
    """v and log|x_i| (the funnel's x_i are too heavy-tailed for bulk ESS of x to mean much)."""
    return np.concatenate([draws[..., :1], np.log(np.abs(draws[..., 1:]))], axis=-1)


# Exact moments of the funnel features: v ~ N(0, 9); log|x_i| = v/2 + log|z| with z ~ N(0, 1),
# E log|z| = -(Euler's gamma + log 2)/2 and Var log|z| = pi^2/8.
FUNNEL_LOG_ABS_MEAN = -(0.5772156649015329 + math.log(2.0)) / 2.0
FUNNEL_LOG_ABS_VAR = 9.0 / 4.0 + math.pi**2 / 8.0


def funnel_truth_z(features: np.ndarray) -> dict[str, float]:
    """Largest |z| of the feature means against the exact ones, and |z| of Var(v) against 9.

    MCSE = sd / sqrt(bulk ESS); for Var(v) the MCSE uses sqrt(2) sd^2 (v is normal).
    A sampler that has not explored the neck shows up here even when its ESS looks fine.
    """
    from .metrics import _max_abs_z

    means = np.array([0.0] + [FUNNEL_LOG_ABS_MEAN] * (features.shape[-1] - 1))
    sds = np.sqrt(np.array([9.0] + [FUNNEL_LOG_ABS_VAR] * (features.shape[-1] - 1)))
    z_mean, _ = _max_abs_z(features, means, sds)  # its variance z assumes normality: only v's is used
    _, z_var_v = _max_abs_z(features[..., :1], means[:1], sds[:1])
    return {"max_abs_z_mean": z_mean, "abs_z_var_v": z_var_v}


def run(args) -> dict[str, Any]:
    import jax

    num_warmup, num_samples = MODES["quick" if args.quick else "full"]
    hand_set = {name: hand_set_parameters(name) for name in [*FIXED, *(args.samplers or [])]}
    results: dict[str, Any] = {"settings": {
        "mode": "quick" if args.quick else "full", "num_chains": args.chains, "num_warmup": num_warmup,
        "num_samples": num_samples,
        "fixed": {name: list(parameters) for name, parameters in hand_set.items() if parameters is not None},
        "cost_unit": "one per log-density gradient and one per metric evaluation (NUTS: per leapfrog step)",
        "funnel_ess_of": "v and log|x_i|", "sampler_options": getattr(args, "sampler_options", {}),
    }, "runs": {}}
    for name in args.models:
        model = build_model(name)
        positions = initial_positions(model, args.chains, args.seed)
        metric = metric_for(name)
        armhmc_first_draws = None
        for sampler in args.samplers or PLAN[name]:
            key = jax.random.fold_in(jax.random.key(args.seed), len(name))
            print(f"{name} / {sampler} ...", flush=True)
            hand_set = hand_set_parameters(sampler) is not None
            if hand_set and armhmc_first_draws is None:
                raise ValueError(f"{sampler} starts where ARMHMC's warm-up ended: put armhmc before it in --samplers")
            starts = armhmc_first_draws if hand_set else positions
            options = getattr(args, "sampler_options", {}).get(sampler, {})
            out = runner(sampler)(key, model, starts, num_warmup, num_samples, metric, **options)
            if sampler == "armhmc":
                armhmc_first_draws = out.draws[:, 0]
            draws = funnel_features(out.draws) if name == "funnel" else out.draws
            summary = summarize(draws, out.num_grads_warmup, out.num_grads_sampling, out.num_divergent_warmup,
                                out.num_divergent_sampling, warmup_s=out.timing["warmup_s"],
                                sampling_s=out.timing["sampling_s"])
            summary["timing"], summary["extra"] = out.timing, out.extra
            if name == "funnel":
                summary["truth_z"] = funnel_truth_z(draws)
            elif model.reference is not None:
                from .run import model_checks

                checks = model_checks(model, out.draws)
                summary["reference_z"] = {key: checks.get(key, math.nan)
                                          for key in ("max_abs_z_reference", "max_abs_z_reference_sq")}
            results["runs"].setdefault(name, {})[sampler] = summary
            print(f"  min ESS {summary['ess_bulk']['min']:.0f}, per unit {summary['ess_per_grad']['min']:.4f}, "
                  f"per s {summary['ess_per_second']['min']:.1f}, {out.extra}", flush=True)
            free_compiled_programs()
    return results


COST_DIMS = (2, 5, 10, 20, 40)


def cost_scaling(dims=COST_DIMS, repeats: int = 100) -> dict[str, Any]:
    """Seconds per leapfrog step: RMHMC (SoftAbs, Fisher) against HMC, as the dimension grows.

    One chain, one leapfrog step per transition (``num_integration_steps = 1``),
    ``repeats`` transitions in a compiled ``lax.scan``; the funnel for SoftAbs,
    started at a typical point (``v = 0``, ``x_i ~ N(0, 1)``: near ``x = 0`` its
    Hessian is nearly singular in ``v`` and every solve fails), and a logistic
    regression with 500 synthetic rows for Fisher.  For the RMHMC kernels the
    mean cost units per transition and the share of converged solves are kept,
    so that a row timed on failing solves cannot pass for a step's cost.
    """
    import time

    import jax
    import jax.numpy as jnp

    import blackjax
    from ahmc.adapters._jax_rmhmc import transition_kernel
    from ahmc.adapters.blackjax import fisher_logistic_metric

    def timed(kernel, logdensity_fn, position, inverse_mass_matrix=None):
        state = blackjax.mcmc.hmc.init(position, logdensity_fn)

        def loop(state, key):
            def body(state, k):
                state, info = kernel(k, state, logdensity_fn, 0.1, inverse_mass_matrix, 1)
                units = getattr(info, "num_gradient_evals", info.num_integration_steps)
                converged = getattr(info, "fixed_point_converged", jnp.asarray(True))
                return state, (units, converged)
            return jax.lax.scan(body, state, jax.random.split(key, repeats))

        compiled = jax.jit(loop).lower(state, jax.random.key(0)).compile()
        jax.block_until_ready(compiled(state, jax.random.key(1)))
        start = time.perf_counter()
        _, (units, converged) = jax.block_until_ready(compiled(state, jax.random.key(2)))
        seconds = (time.perf_counter() - start) / repeats
        return seconds, float(np.mean(units)), float(np.mean(converged))

    rows = []
    rng = np.random.default_rng(0)
    for dim in dims:
        funnel = funnel_model(dim).logdensity_fn
        design = rng.normal(size=(500, dim))
        labels = (rng.uniform(size=500) < 0.5).astype(np.float64)

        def logistic(beta, design=design, labels=labels):
            eta = jnp.asarray(design) @ beta
            return jnp.sum(labels * eta - jax.nn.softplus(eta)) - 0.5 * jnp.sum(beta**2) / 100.0

        funnel_start = jnp.asarray(np.r_[0.0, rng.normal(size=dim - 1)])
        start = jnp.asarray(0.1 * rng.normal(size=dim))
        hmc_kernel = blackjax.mcmc.hmc.build_kernel()
        row = {"dim": dim}
        for name, kernel, target, position, inverse in [
            ("hmc_funnel", hmc_kernel, funnel, funnel_start, jnp.ones(dim)),
            ("softabs_funnel", transition_kernel("softabs"), funnel, funnel_start, None),
            ("hmc_logistic", hmc_kernel, logistic, start, jnp.ones(dim)),
            ("fisher_logistic", transition_kernel(fisher_logistic_metric(design)), logistic, start, None),
        ]:
            seconds, units, converged = timed(kernel, target, position, inverse)
            row[f"{name}_s"] = seconds
            if inverse is None:
                row[f"{name}_units"], row[f"{name}_converged"] = units, converged
        rows.append(row)
        print(row, flush=True)
    return {"repeats": repeats, "rows": rows}


def cost_markdown(cost: dict[str, Any], command: str) -> str:
    lines = [
        "# Seconds per leapfrog step: RMHMC against HMC",
        "",
        f"Command: `{command}`  ",
        "One chain, one leapfrog step per transition, compiled scan of "
        f"{cost['repeats']} transitions, float64, 2 shared CPU cores. Ratio = RMHMC / HMC time. "
        "Units: mean cost units per transition (gradients + metric evaluations); converged: share of "
        "transitions whose fixed-point solves converged (a failed solve ends the step early).",
        "",
        "| d | HMC funnel (us) | SoftAbs funnel (us) | ratio | units | converged "
        "| HMC logistic (us) | Fisher logistic (us) | ratio | units | converged |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in cost["rows"]:
        def cell(key, spec, r=r):  # files written before the units and converged columns lack them
            return format(r[key], spec) if key in r else "-"

        lines.append(
            f"| {r['dim']} | {1e6 * r['hmc_funnel_s']:.0f} | {1e6 * r['softabs_funnel_s']:.0f} "
            f"| {r['softabs_funnel_s'] / r['hmc_funnel_s']:.0f} | {cell('softabs_funnel_units', '.1f')} "
            f"| {cell('softabs_funnel_converged', '.2f')} | {1e6 * r['hmc_logistic_s']:.0f} "
            f"| {1e6 * r['fisher_logistic_s']:.0f} | {r['fisher_logistic_s'] / r['hmc_logistic_s']:.0f} "
            f"| {cell('fisher_logistic_units', '.1f')} | {cell('fisher_logistic_converged', '.2f')} |"
        )
    return "\n".join(lines)


def markdown(results: dict[str, Any], command: str) -> str:
    s = results["settings"]
    lines = [
        "# Adaptive RMHMC vs fixed-parameter RMHMC and NUTS",
        "",
        f"Command: `{command}`  ",
        f"{s['num_chains']} chains x ({s['num_warmup']} warm-up + {s['num_samples']} draws), float64, "
        f"on 2 shared CPU cores (other jobs running). Cost unit: {s['cost_unit']}. "
        "Fixed RMHMC: rmhmc_fixed_<eps>x<L>, L leapfrog steps every iteration; rmhmc_gc_<eps>x<L>, "
        "Girolami & Calderhead's protocol, L_t ~ U{1..L} (theirs: eps 0.5, L 6). Funnel: ESS of v and log|x_i|. "
        "ESS of x^2: bulk ESS of the squared deviations (x - mean)^2 (how well variances are estimated); "
        "lag-1: median over coordinates of the lag-1 autocorrelation. A lag-1 near -1 means the draws "
        "alternate around the mean: the ESS of x then exceeds the number of draws (ArviZ caps it at "
        "N log10 N) while the ESS of x^2 collapses.",
        "",
        "| model | sampler | min ESS | min ESS / unit | min ESS of x^2 / unit | lag-1 | min ESS / s | units / draw "
        "| accept | solves converged | R-hat max | divergences |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    truth_lines, reference_lines = [], []
    for name, runs in results["runs"].items():
        for sampler, r in runs.items():
            extra = r["extra"]
            converged = extra.get("fixed_point_converged")
            lines.append(
                f"| {name} | {sampler} | {r['ess_bulk']['min']:.0f} | {r['ess_per_grad']['min']:.4f} "
                f"| {_get(r, 'ess_per_grad_squares'):.4f} | {_get(r, 'lag1_autocorrelation', 'median'):.2f} "
                f"| {r['ess_per_second']['min']:.1f} | {r['grads']['per_draw']:.1f} "
                f"| {_mean(extra.get('mean_acceptance')):.2f} | {'-' if converged is None else f'{converged:.3f}'} "
                f"| {r['rhat_max']:.3f} | {r['divergences']['sampling']} |"
            )
            if "truth_z" in r:
                truth_lines.append(f"| {name} | {sampler} | {r['truth_z']['max_abs_z_mean']:.2f} "
                                   f"| {r['truth_z']['abs_z_var_v']:.2f} |")
            if "reference_z" in r:
                reference_lines.append(f"| {name} | {sampler} | {r['reference_z']['max_abs_z_reference']:.2f} "
                                       f"| {r['reference_z']['max_abs_z_reference_sq']:.2f} |")
    if reference_lines:
        lines += ["", "Against the posteriordb reference (eight schools: the non-centered posterior, the same "
                  "distribution of mu, tau and theta; gp_pois_regr_centered: posteriordb's gp_pois_regr, the same "
                  "distribution of rho, alpha and f):", "",
                  "| model | sampler | max abs z of the means | max abs z of the mean squares |", "|---|---|---|---|",
                  *reference_lines]
    if truth_lines:
        lines += ["", "Against the funnel's exact moments (|z| above 4 means the sampler has not explored "
                  "the target, whatever its ESS says):", "",
                  "| model | sampler | max abs z of the means (v, log abs x_i) | abs z of Var(v) |",
                  "|---|---|---|---|", *truth_lines]
    return "\n".join(lines)


def _get(record: dict[str, Any], key: str, which: str = "min") -> float:
    return record[key][which] if key in record else math.nan  # absent from results written before it existed


def _mean(value) -> float:
    return float(np.mean(value)) if value is not None else math.nan


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rmhmc", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="500 + 1000 draws per chain (default 1000 + 2000)")
    parser.add_argument("--models", type=lambda t: t.split(","), default=list(PLAN))
    parser.add_argument("--samplers", type=lambda t: t.split(","), default=None,
                        help=f"subset of each model's plan, or extra ones ({', '.join(SAMPLERS)}, or any "
                             "rmhmc_fixed_<eps>x<L> / rmhmc_gc_<eps>x<L>, listed after armhmc)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--sampler-options", type=json.loads, default={},
                        help='JSON object {sampler: {option: value}}, e.g. '
                             '\'{"armhmc": {"shared_num_steps": false}}\' (the fixed RMHMC takes none)')
    parser.add_argument("--cost", action="store_true",
                        help="only time one leapfrog step against HMC for d in 2..40 (rmhmc_cost.json)")
    args = parser.parse_args(argv)
    unknown = set(args.models) - set(PLAN)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; known: {', '.join(PLAN)}")
    known = f"{', '.join(SAMPLERS)}, or rmhmc_fixed_<eps>x<L> / rmhmc_gc_<eps>x<L>"
    if not isinstance(args.sampler_options, dict) or any(runner(name) is None for name in args.sampler_options):
        parser.error(f"--sampler-options must be a JSON object keyed by known samplers ({known})")
    if args.samplers and any(runner(name) is None for name in args.samplers):
        unknown = sorted(name for name in args.samplers if runner(name) is None)
        parser.error(f"unknown samplers {unknown}; known: {known}")
    hand_set = [i for i, name in enumerate(args.samplers or []) if hand_set_parameters(name)]
    if hand_set and "armhmc" not in args.samplers[:hand_set[0]]:
        parser.error("the hand-set samplers start where ARMHMC's warm-up ended: list armhmc before them")

    import jax

    jax.config.update("jax_enable_x64", True)
    command = shlex.join(["python", "-m", "benchmarks.rmhmc", *argv])
    if args.cost:
        cost = cost_scaling()
        cost["environment"] = {**environment(argparse.Namespace(seed=args.seed), argv), "command": command}
        output = args.output or RESULTS / "rmhmc_cost.json"
        output.write_text(json.dumps(cost, indent=1) + "\n")
        output.with_suffix(".md").write_text(cost_markdown(cost, command) + "\n")
        print(cost_markdown(cost, command))
        return cost
    results = run(args)
    env_args = argparse.Namespace(seed=args.seed)
    results["environment"] = environment(env_args, argv)
    results["environment"]["command"] = command
    output = args.output or RESULTS / f"rmhmc_{'quick' if args.quick else 'full'}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=1, allow_nan=True) + "\n")
    report = markdown(results, command)
    output.with_suffix(".md").write_text(report + "\n")
    print(report)
    print(f"wrote {output} and {output.with_suffix('.md')}")
    return results


if __name__ == "__main__":
    main()
