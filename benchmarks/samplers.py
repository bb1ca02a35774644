"""The samplers the benchmark compares: one runner function per sampler, one signature.

Every runner is called as::

    run = runner(rng_key, model, positions, num_warmup, num_samples, **options)

rng_key      a JAX PRNG key (the same for every sampler on a model)
model        a :class:`benchmarks.models.Model` (``logdensity_fn`` over a flat vector)
positions    (chains, dim) float array of starting points (the same for every sampler)
num_warmup   warm-up (adaptation) iterations per chain
num_samples  kept draws per chain
options      sampler-specific keyword options (``--sampler-options`` on the command line)

and returns a :class:`SamplerRun`.  To add a sampler, write such a function
and add it to :data:`SAMPLERS`; any exception it raises (a missing package
included) is recorded by the runner as a failure with its reason, and the
benchmark goes on.

Gradient evaluations are leapfrog steps (``num_integration_steps`` in BlackJAX,
``num_steps`` in NumPyro): each velocity-Verlet step makes one gradient call and
the gradient at the start of a trajectory is cached in the state.  Not counted:
the one gradient per chain at initialization, and NumPyro's initial step-size
search (a handful of steps per chain).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from .metrics import CompileClock

__all__ = [
    "SAMPLERS",
    "SamplerRun",
    "Runner",
    "run_ahmc_blackjax",
    "run_ahmc_numpyro",
    "run_blackjax_nuts",
    "run_numpyro_nuts",
]


class SamplerRun(NamedTuple):
    """What a runner returns (NumPy arrays, JSON-able ``timing`` and ``extra``).

    draws                   (chains, num_samples, dim) sampling-phase draws
    num_grads_warmup        (chains,) gradient evaluations in warm-up
    num_grads_sampling      (chains,) gradient evaluations in sampling
    num_divergent_warmup    (chains,) divergent transitions in warm-up
    num_divergent_sampling  (chains,) divergent transitions in sampling
    timing                  {"warmup_s", "sampling_s", "compile_s", "sampling_time_estimated", "phases"}
                            seconds of wall time net of JAX tracing/compilation
    extra                   sampler details for the report (final step sizes, ...)
    """

    draws: np.ndarray
    num_grads_warmup: np.ndarray
    num_grads_sampling: np.ndarray
    num_divergent_warmup: np.ndarray
    num_divergent_sampling: np.ndarray
    timing: dict[str, Any]
    extra: dict[str, Any]


Runner = Callable[..., SamplerRun]


def _block(tree):
    import jax

    return jax.block_until_ready(tree)


def _timing(clock: CompileClock, warmup_s: float, sampling_s: float, estimated: bool = False) -> dict:
    return {
        "warmup_s": float(warmup_s),
        "sampling_s": float(sampling_s),
        "compile_s": float(sum(clock.compile_s.values())),
        "sampling_time_estimated": estimated,
        "phases": clock.as_dict(),
    }


def _as_float_list(values) -> list[float]:
    return [float(v) for v in np.asarray(values).reshape(-1)]


# --------------------------------------------------------------------------- #
# BlackJAX NUTS with window adaptation
# --------------------------------------------------------------------------- #


def run_blackjax_nuts(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """BlackJAX NUTS after ``blackjax.window_adaptation`` (Stan-style windows, diagonal mass matrix).

    Each chain adapts on its own (``jax.vmap`` of ``warmup.run`` over chains),
    then the chains sample together (``jax.vmap`` of ``nuts.step`` in a
    ``lax.scan``).  Both phases are compiled ahead of time
    (``jax.jit(...).lower(...).compile()``), so their run times are pure execution.  ``options`` go to ``blackjax.window_adaptation`` (e.g.
    ``target_acceptance_rate``, ``is_mass_matrix_diagonal``).
    """
    import jax
    import jax.numpy as jnp

    import blackjax
    from blackjax.adaptation.base import get_filter_adapt_info_fn

    logdensity_fn = model.logdensity_fn
    warmup = blackjax.window_adaptation(
        blackjax.nuts,
        logdensity_fn,
        adaptation_info_fn=get_filter_adapt_info_fn(info_keys={"num_integration_steps", "is_divergent"}),
        **options,
    )

    def warm_one(key, position):
        (state, parameters), info = warmup.run(key, position, num_warmup)
        steps = info.info.num_integration_steps
        return state, parameters, jnp.sum(steps), jnp.sum(info.info.is_divergent)

    def sample_one(key, state, parameters):
        nuts = blackjax.nuts(logdensity_fn, **parameters)

        def body(state, step_key):
            state, info = nuts.step(step_key, state)
            return state, (state.position, info.num_integration_steps, info.is_divergent, info.acceptance_rate)

        _, out = jax.lax.scan(body, state, jax.random.split(key, num_samples))
        return out

    warm_key, sample_key = jax.random.split(rng_key)
    num_chains = positions.shape[0]
    clock = CompileClock()
    with clock.phase("warmup"):
        warm_args = (jax.random.split(warm_key, num_chains), jnp.asarray(positions))
        warm_compiled = jax.jit(jax.vmap(warm_one)).lower(*warm_args).compile()
        states, parameters, grads_warmup, div_warmup = _block(warm_compiled(*warm_args))
    with clock.phase("sampling"):
        sample_args = (jax.random.split(sample_key, num_chains), states, parameters)
        sample_compiled = jax.jit(jax.vmap(sample_one)).lower(*sample_args).compile()
        draws, steps, divergent, acceptance = _block(sample_compiled(*sample_args))
    return SamplerRun(
        draws=np.asarray(draws),
        num_grads_warmup=np.asarray(grads_warmup),
        num_grads_sampling=np.asarray(steps).sum(axis=1),
        num_divergent_warmup=np.asarray(div_warmup),
        num_divergent_sampling=np.asarray(divergent).sum(axis=1),
        timing=_timing(clock, clock.run_s["warmup"], clock.run_s["sampling"]),
        extra={
            "step_size": _as_float_list(parameters["step_size"]),
            "mean_acceptance": _as_float_list(np.asarray(acceptance).mean(axis=1)),
            "mean_steps_per_draw": _as_float_list(np.asarray(steps).mean(axis=1)),
        },
    )


# --------------------------------------------------------------------------- #
# NumPyro NUTS
# --------------------------------------------------------------------------- #


def run_numpyro_nuts(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """NumPyro ``NUTS(potential_fn=-logdensity_fn)`` driven by ``numpyro.infer.MCMC``.

    ``chain_method="vectorized"`` (all chains in one ``vmap``, as for BlackJAX)
    unless ``options["chain_method"]`` says otherwise; other ``options`` go to
    ``NUTS`` (e.g. ``target_accept_prob``, ``dense_mass``).  Warm-up runs with
    ``MCMC.warmup(collect_warmup=True)`` so its leapfrog steps can be counted,
    then ``MCMC.run`` continues from the warmed-up state.
    """
    import jax
    import jax.numpy as jnp
    from numpyro.infer import MCMC, NUTS

    options = dict(options)
    chain_method = options.pop("chain_method", "vectorized")
    logdensity_fn = model.logdensity_fn
    kernel = NUTS(potential_fn=lambda x: -logdensity_fn(x), **options)
    num_chains = positions.shape[0]
    mcmc = MCMC(
        kernel,
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method=chain_method,
        progress_bar=False,
    )
    fields = ("num_steps", "diverging", "accept_prob")
    warm_key, sample_key = jax.random.split(rng_key)
    clock = CompileClock()
    with clock.phase("warmup"):
        mcmc.warmup(warm_key, init_params=jnp.asarray(positions), extra_fields=fields, collect_warmup=True)
        warm_fields = _block(mcmc.get_extra_fields(group_by_chain=True))
    with clock.phase("sampling"):
        mcmc.run(sample_key, extra_fields=fields)
        draws = _block(mcmc.get_samples(group_by_chain=True))
        sample_fields = mcmc.get_extra_fields(group_by_chain=True)
    step_size = mcmc.last_state.adapt_state.step_size
    return SamplerRun(
        draws=np.asarray(draws).reshape(num_chains, num_samples, -1),
        num_grads_warmup=np.asarray(warm_fields["num_steps"]).sum(axis=1),
        num_grads_sampling=np.asarray(sample_fields["num_steps"]).sum(axis=1),
        num_divergent_warmup=np.asarray(warm_fields["diverging"]).sum(axis=1),
        num_divergent_sampling=np.asarray(sample_fields["diverging"]).sum(axis=1),
        timing=_timing(clock, clock.run_s["warmup"], clock.run_s["sampling"]),
        extra={
            "chain_method": chain_method,
            "step_size": _as_float_list(step_size),
            "mean_acceptance": _as_float_list(np.asarray(sample_fields["accept_prob"]).mean(axis=1)),
            "mean_steps_per_draw": _as_float_list(np.asarray(sample_fields["num_steps"]).mean(axis=1)),
        },
    )


# --------------------------------------------------------------------------- #
# ahmc through BlackJAX
# --------------------------------------------------------------------------- #


def run_ahmc_blackjax(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """ahmc's adaptive HMC via ``ahmc.adapters.blackjax.run_chains`` (pooled tuner by default).

    Expects ``run_chains(rng_key, logdensity_fn, positions, num_warmup,
    num_samples, **options) -> (samples, info)`` with ``samples`` of shape
    (chains, num_samples, dim) and ``info`` fields of shape
    (num_warmup + num_samples, chains), warm-up first, including
    ``num_integration_steps`` and ``is_divergent`` (``is_warmup`` optional).
    ``options`` go to ``run_chains`` (e.g. ``paper_preset``, ``pooled``).

    Warm-up and sampling run in one call, so the two phases' run times are
    apportioned by their gradient counts (``sampling_time_estimated``).
    """
    import jax.numpy as jnp

    from ahmc.adapters.blackjax import run_chains

    clock = CompileClock()
    with clock.phase("run"):
        samples, info = _block(
            run_chains(rng_key, model.logdensity_fn, jnp.asarray(positions), num_warmup, num_samples, **options)
        )
    num_chains = positions.shape[0]
    draws = np.asarray(samples).reshape(num_chains, num_samples, -1)
    steps = np.asarray(info.num_integration_steps)
    divergent = np.asarray(info.is_divergent)
    if getattr(info, "is_warmup", None) is not None:
        is_warmup = np.asarray(info.is_warmup, dtype=bool)
    else:
        is_warmup = np.broadcast_to((np.arange(steps.shape[0]) < num_warmup)[:, None], steps.shape)
    grads_warmup = np.where(is_warmup, steps, 0).sum(axis=0)
    grads_sampling = np.where(is_warmup, 0, steps).sum(axis=0)
    total = grads_warmup.sum() + grads_sampling.sum()
    run_s = clock.run_s["run"]
    fraction = grads_sampling.sum() / total if total > 0 else 0.5
    sampling = ~is_warmup
    extra: dict[str, Any] = {
        "mean_steps_per_draw": _as_float_list(np.where(sampling, steps, 0).sum(axis=0) / num_samples)
    }
    for field in ("step_size", "num_steps"):  # the arm in force at the end, per chain
        if getattr(info, field, None) is not None:
            extra[f"final_{field}"] = _as_float_list(np.asarray(getattr(info, field))[-1])
    if getattr(info, "acceptance_rate", None) is not None:
        acceptance = np.asarray(info.acceptance_rate)
        extra["mean_acceptance"] = _as_float_list(np.where(sampling, acceptance, 0).sum(axis=0) / num_samples)
    if getattr(info, "round", None) is not None:
        extra["rounds"] = _as_float_list(np.asarray(info.round).max(axis=0))
    if getattr(info, "arm_changed", None) is not None:
        extra["arm_changes"] = _as_float_list(np.asarray(info.arm_changed).sum(axis=0))
    return SamplerRun(
        draws=draws,
        num_grads_warmup=grads_warmup,
        num_grads_sampling=grads_sampling,
        num_divergent_warmup=np.where(is_warmup, divergent, 0).sum(axis=0),
        num_divergent_sampling=np.where(is_warmup, 0, divergent).sum(axis=0),
        timing=_timing(clock, run_s * (1 - fraction), run_s * fraction, estimated=True),
        extra=extra,
    )


# --------------------------------------------------------------------------- #
# ahmc through NumPyro
# --------------------------------------------------------------------------- #


def run_ahmc_numpyro(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """ahmc's ``AdaptiveHMC(potential_fn=-logdensity_fn)`` driven by ``numpyro.infer.MCMC``.

    Vectorized chains (one pooled tuner) unless ``options["chain_method"]``
    says otherwise; other ``options`` go to ``AdaptiveHMC``.  Warm-up and
    sampling are timed separately, exactly as for ``numpyro_nuts``.
    """
    import jax
    import jax.numpy as jnp
    from numpyro.infer import MCMC

    from ahmc.adapters.numpyro import AdaptiveHMC

    options = dict(options)
    chain_method = options.pop("chain_method", "vectorized")
    logdensity_fn = model.logdensity_fn
    kernel = AdaptiveHMC(potential_fn=lambda x: -logdensity_fn(x), **options)
    num_chains = positions.shape[0]
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method=chain_method, progress_bar=False)
    fields = ("num_steps", "diverging", "accept_prob", "step_size", "max_steps", "arm_changed", "tuning_round")
    warm_key, sample_key = jax.random.split(rng_key)
    clock = CompileClock()
    with clock.phase("warmup"):
        mcmc.warmup(warm_key, init_params=jnp.asarray(positions), extra_fields=fields, collect_warmup=True)
        warm_fields = _block(mcmc.get_extra_fields(group_by_chain=True))
    with clock.phase("sampling"):
        mcmc.run(sample_key, extra_fields=fields)
        draws = _block(mcmc.get_samples(group_by_chain=True))
        sample_fields = mcmc.get_extra_fields(group_by_chain=True)
    return SamplerRun(
        draws=np.asarray(draws).reshape(num_chains, num_samples, -1),
        num_grads_warmup=np.asarray(warm_fields["num_steps"]).sum(axis=1),
        num_grads_sampling=np.asarray(sample_fields["num_steps"]).sum(axis=1),
        num_divergent_warmup=np.asarray(warm_fields["diverging"]).sum(axis=1),
        num_divergent_sampling=np.asarray(sample_fields["diverging"]).sum(axis=1),
        timing=_timing(clock, clock.run_s["warmup"], clock.run_s["sampling"]),
        extra={
            "chain_method": chain_method,
            "final_step_size": _as_float_list(np.asarray(sample_fields["step_size"])[:, -1]),
            "final_num_steps": _as_float_list(np.asarray(sample_fields["max_steps"])[:, -1]),
            "mean_acceptance": _as_float_list(np.asarray(sample_fields["accept_prob"]).mean(axis=1)),
            "mean_steps_per_draw": _as_float_list(np.asarray(sample_fields["num_steps"]).mean(axis=1)),
            "rounds": _as_float_list(np.asarray(sample_fields["tuning_round"]).max(axis=1)),
            "arm_changes": _as_float_list(np.asarray(warm_fields["arm_changed"]).sum(axis=1)
                                          + np.asarray(sample_fields["arm_changed"]).sum(axis=1)),
        },
    )


# name -> runner; every runner has the signature described in the module docstring.
SAMPLERS: dict[str, Runner] = {
    "blackjax_nuts": run_blackjax_nuts,
    "numpyro_nuts": run_numpyro_nuts,
    "ahmc_blackjax": run_ahmc_blackjax,
    "ahmc_numpyro": run_ahmc_numpyro,
}
