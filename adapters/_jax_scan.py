"""The sampling phase's draws as whole rounds: the same draws as a ``lax.scan`` of the engine's step, cheaper.

:func:`scan_draws` is :func:`ahmc.adapters._jax_engine.build_engine`'s ``scan_draws`` (bound to the engine's
resolved parts and its step); ``run_chains`` takes it for long runs (``SEGMENTED_MIN_SAMPLES``)."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp

from ._jax_types import EngineState

__all__ = ["scan_draws"]


def scan_draws(parts: Any, step: Callable, rng_key, state: EngineState, num_samples: int,
               first_iteration: int):
    """Run ``num_samples`` iterations after warm-up: ``(state, (positions, info))`` as a ``lax.scan`` of ``step``
    with ``jax.random.split(rng_key, num_samples)`` gives, the same draws, but cheaper.  ``first_iteration``
    (static) is ``state.iteration``, at least ``num_warmup``.  With fixed-length rounds each whole round runs
    as an inner scan of iterations that cannot end a round, followed by the round's end, so no iteration
    branches at run time; the partial rounds at either end use ``step``."""
    keys = jax.random.split(rng_key, num_samples)
    plan = parts.plan
    per_iteration = partial(step, sampling=True)
    if parts.super_transitions:
        return scan_steps(per_iteration, state, keys)
    into_round = (first_iteration - plan.metric_phase_length) % plan.round_length
    head = min(num_samples, (plan.round_length - into_round) % plan.round_length)
    num_rounds = (num_samples - head) // plan.round_length
    tail = num_samples - head - num_rounds * plan.round_length
    # An empty piece is left out rather than scanned over no keys: it would still be traced and
    # lowered (about half the tracing time of the draws on a 10-d Gaussian, 2026-11-28).
    pieces = []
    if head:
        state, out = scan_steps(per_iteration, state, keys[:head])
        pieces.append(out)
    if num_rounds:
        inner = partial(step, sampling=True, round_end="never")
        blocks = keys[head:head + num_rounds * plan.round_length].reshape(
            (num_rounds, plan.round_length) + keys.shape[1:])
        # A pooled tuner without a hook, after warm-up (the exploit step lies in the warm-up): rounds run in
        # segments (:func:`ahmc.adapters._jax_rounds.segmented_rounds`).  Otherwise one round per scan step.
        if parts.config.pooled and parts.round_end_fn is None and first_iteration >= plan.num_warmup:
            state, out = parts.rounds.segmented(inner, state, blocks)
        else:
            def one_round(state, round_keys):
                state, (positions, info) = scan_steps(inner, state, round_keys)
                state, (reward, changed, p) = parts.rounds.finish(state, round_keys[-1])
                info = info._replace(reward=info.reward.at[-1].set(reward),
                                     arm_changed=info.arm_changed.at[-1].set(changed),
                                     adapt_probability=info.adapt_probability.at[-1].set(p))
                return state, (positions, info)

            state, out = jax.lax.scan(one_round, state, blocks)
        pieces.append(jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), out))
    if tail or not pieces:
        state, out = scan_steps(per_iteration, state, keys[head + num_rounds * plan.round_length:])
        pieces.append(out)
    return state, jax.tree.map(lambda *xs: jnp.concatenate(xs), *pieces)


def scan_steps(step_fn, state, keys):
    """``lax.scan`` of ``step_fn`` over ``keys``, keeping each iteration's positions and info."""
    def body(state, key):
        state, info = step_fn(key, state)
        return state, (state.position, info)
    return jax.lax.scan(body, state, keys)
