"""The JAX engine's initial state: the chains' densities, metric, tuner, box and step-size search.

:func:`initial_state` is :func:`ahmc.adapters._jax_engine.build_engine`'s ``init`` (bound to the engine's
resolved parts); it checks the start's density before anything else.  :func:`current_parameters` is its
``parameters``."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ahmc.core.schedule import warmup_num_steps
from ahmc.core.space import WARMUP_MAX_STEPS

from ._jax_kernel import inverse_cholesky
from ._jax_setup import _check_finite, _check_positions, _initial_metric
from ._jax_types import EngineState, SearchBox
from ._jax_warmup import StepSizeSearch

__all__ = ["initial_state", "current_parameters"]


def initial_state(parts: Any, positions, rng_key=None) -> EngineState:
    """Initial state for positions with a leading chain axis."""
    num_chains = _check_positions(positions, parts.chain_data)
    data = () if parts.chain_data is None else (parts.chain_data,)
    logdensity, grad = jax.vmap(jax.value_and_grad(parts.logdensity_fn))(positions, *data)
    _check_finite(logdensity, grad)
    flat0, _ = ravel_pytree(jax.tree.map(lambda x: x[0], positions))
    dim = flat0.shape[0]
    dtype = flat0.dtype if jnp.issubdtype(flat0.dtype, jnp.floating) else jnp.float32
    imm, dense = _initial_metric(parts.inverse_mass_matrix, parts.dense_mass, dim, dtype)
    if parts.tuner_prior is not None:
        tuner_state = jax.tree.map(lambda x: jnp.asarray(x, dtype if np.issubdtype(x.dtype, np.floating) else x.dtype),
                                   parts.tuner_prior)
    else:
        tuner_state = parts.tuner.init(xp=jnp, dtype=dtype)
    if not parts.config.pooled:
        tuner_state = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_chains, *x.shape)), tuner_state)
    box = SearchBox(jnp.asarray(parts.box0[0], dtype), jnp.asarray(parts.box0[1], jnp.int32))
    eps0 = jnp.asarray(parts.initial_step_size, dtype)
    # The warm-up's first iterations search for a step size from eps0 (a warm start's eps* was adapted
    # for this metric already, and checked: no search from it).
    search = None
    if parts.plan.metric_phase_length > 0 and parts.tuner_prior is None:
        search = StepSizeSearch(jnp.asarray(True), jnp.asarray(0, jnp.int32))
    warmup = parts.warmup
    return EngineState(
        position=positions, logdensity=logdensity, logdensity_grad=grad, iteration=jnp.asarray(0, jnp.int32),
        tuner=tuner_state, round_stats=parts.rounds.fresh(num_chains, dtype), inverse_mass_matrix=imm, box=box,
        step_size_adaptation=warmup.step_size_state(eps0), mass_matrix_adaptation=warmup.mass_matrix_state(dim, dtype, dense, num_chains),
        adapt_probability=jnp.asarray(1.0, dtype), window=warmup.window_state(num_chains, dtype),
        whitening=inverse_cholesky(imm) if dense else None, step_size_search=search,
        **_round_buffers(parts, positions, tuner_state, box, rng_key))


def _round_buffers(parts: Any, positions, tuner_state, box, rng_key) -> dict:
    """Initial values of the optional state fields (hook buffer, round counters, center)."""
    extra = {}
    if parts.round_end_fn is not None:
        extra["round_draws"] = jax.tree.map(
            lambda x: jnp.zeros((x.shape[0], parts.buffer_length) + x.shape[1:], x.dtype), positions)
        extra["round_end_state"] = parts.round_end_state
    if parts.round_end_fn is not None or parts.super_transitions:
        extra["round_iteration"] = jnp.asarray(0, jnp.int32)
    if parts.super_transitions:
        key = jax.random.fold_in(jax.random.key(0) if rng_key is None else rng_key, 7)
        extra["round_target"] = parts.rounds.length(tuner_state, box, key)  # reset when the GP starts
    if parts.use_center:  # replaced at every mass-matrix window's end, before the GP starts
        extra["center"] = jnp.mean(jax.vmap(lambda p: ravel_pytree(p)[0])(positions), axis=0)
    return extra


def current_parameters(parts: Any, state: EngineState) -> dict:
    """Current sampler parameters: the arm's (per chain when not pooled); in the metric phase the DA ones."""
    if parts.config.pooled:
        eps, steps = parts.rounds.arm(state.tuner, state.box)
    else:
        eps, steps = parts.rounds.chain_arms(state.tuner, state.box, state.logdensity.shape[0])
    config = parts.config
    in_metric_phase = state.iteration < config.metric_phase_length
    warm_eps = jnp.exp(state.step_size_adaptation.log_step_size_avg).astype(eps.dtype)
    warm_l = warmup_num_steps(warm_eps, config.warmup_integration_time, min(config.num_steps_cap, WARMUP_MAX_STEPS),
                              jnp)
    return {
        "step_size": jnp.where(in_metric_phase, warm_eps, eps),
        "inverse_mass_matrix": state.inverse_mass_matrix,
        "num_integration_steps": jnp.where(in_metric_phase, warm_l, steps),
        "min_steps_fraction": config.min_steps_fraction,  # the jitter the arm was tuned with
    }
