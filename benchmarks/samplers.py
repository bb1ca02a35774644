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
search (a handful of steps per chain).  The PyMC-side runners (``ahmc_pymc``,
``pymc_nuts``, ``nutpie``) count the ``n_steps`` sample stat the same way and
sample the PyMC version of the model from ``benchmarks/pymc_models.py``.
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
    "run_ahmc_pymc",
    "run_blackjax_nuts",
    "run_chees",
    "run_meads",
    "run_numpyro_nuts",
    "run_nutpie",
    "run_pymc_nuts",
    "run_pymc_numpyro",
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
    keep                    what the report's figures need beyond the JSON (not serialized by the
                            runner; e.g. ``{"tuning": ...}``, the AHMC tuner history), or None
    """

    draws: np.ndarray
    num_grads_warmup: np.ndarray
    num_grads_sampling: np.ndarray
    num_divergent_warmup: np.ndarray
    num_divergent_sampling: np.ndarray
    timing: dict[str, Any]
    extra: dict[str, Any]
    keep: dict[str, Any] | None = None


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


def _map_over_chains(fn):
    """``jax.vmap(fn)``'s signature, run one chain after another (``jax.lax.map``)."""
    import jax

    return lambda *args: jax.lax.map(lambda chain_args: fn(*chain_args), args)


def run_blackjax_nuts(rng_key, model, positions, num_warmup, num_samples, chain_method="vectorized",
                      **options) -> SamplerRun:
    """BlackJAX NUTS after ``blackjax.window_adaptation`` (Stan-style windows, diagonal mass matrix).

    Each chain adapts on its own (``jax.vmap`` of ``warmup.run`` over chains),
    then the chains sample together (``jax.vmap`` of ``nuts.step`` in a
    ``lax.scan``).  ``chain_method="sequential"`` maps both phases over the chains
    one after another (``jax.lax.map``) instead: the same draws up to rounding, and
    no chain waits for another's longer trees.  Both phases are compiled ahead of time
    (``jax.jit(...).lower(...).compile()``) and only the calls of the compiled
    executables count as run time (``CompileClock.executing``).  ``options`` go to ``blackjax.window_adaptation`` (e.g.
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

    if chain_method not in ("vectorized", "sequential"):
        raise ValueError(f"chain_method must be 'vectorized' or 'sequential'; got {chain_method!r}")
    over_chains = jax.vmap if chain_method == "vectorized" else _map_over_chains
    warm_key, sample_key = jax.random.split(rng_key)
    num_chains = positions.shape[0]
    clock = CompileClock()
    with clock.phase("warmup"):
        warm_args = (jax.random.split(warm_key, num_chains), jnp.asarray(positions))
        warm_compiled = jax.jit(over_chains(warm_one)).lower(*warm_args).compile()
        states, parameters, grads_warmup, div_warmup = clock.execute(warm_compiled, *warm_args)
    with clock.phase("sampling"):
        sample_args = (jax.random.split(sample_key, num_chains), states, parameters)
        sample_compiled = jax.jit(over_chains(sample_one)).lower(*sample_args).compile()
        draws, steps, divergent, acceptance = clock.execute(sample_compiled, *sample_args)
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


def numpyro_potential(logdensity_fn):
    """The ``potential_fn`` every NumPyro kernel of the benchmark gets: ``-logdensity_fn``, jitted.

    NumPyro's HMC and NUTS evaluate a ``potential_fn`` and its gradient once outside their compiled loop,
    to initialize the chains; a plain Python function runs there op by op, each JAX primitive compiled
    alone (31 small compilations on Pima, 63 on a 500-row logistic regression: 1.5-2 s there,
    2026-12-07), which a user of ``NUTS(model)`` does not pay: NumPyro compiles a model's potential for its initialization. Jitted, that
    evaluation is one program, and NUTS's whole run takes no longer than ``NUTS(model)``'s (on a 500-row
    logistic regression 4.3-4.5 s against 4.8-6.8 s, the model's tracing included; 6.0-7.8 s unjitted).
    ahmc's kernel compiles its initialization as one program either way. Inside the loop a jitted
    function is inlined, so the loop is unchanged (docs/decisions.md, "NumPyro's potential is jitted in
    the benchmark").
    """
    import jax

    return jax.jit(lambda x: -logdensity_fn(x))


def _run_numpyro_mcmc(kernel, rng_key, positions, num_warmup, num_samples, chain_method, fields):
    """Drive a NumPyro kernel as its users do: one ``MCMC.run`` (warm-up and draws in one compiled loop).

    The run collects every iteration, warm-up included, so its leapfrog steps can be counted; only the
    last ``num_samples`` are draws.  (``MCMC.warmup`` then ``MCMC.run`` would compile the loop twice,
    which a user calling ``run`` once does not pay: docs/decisions.md, "NumPyro runs are one MCMC.run".)
    The run time is split between warm-up and sampling by their gradients, as for ``run_chains``.

    Returns ``(SamplerRun without extra, mcmc, warm-up fields, sampling fields)``.
    """
    import jax.numpy as jnp
    from numpyro.infer import MCMC

    num_chains = positions.shape[0]
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method=chain_method, progress_bar=False)
    fields = ("num_steps", "diverging", "accept_prob") + tuple(fields)
    _keep_every_iteration(mcmc)
    clock = CompileClock()
    with clock.phase("run"):
        mcmc.run(rng_key, init_params=jnp.asarray(positions), extra_fields=fields)
        collected = _block(mcmc.get_extra_fields(group_by_chain=True))
        draws = _block(mcmc.get_samples(group_by_chain=True))
    warm_fields = {k: np.asarray(v)[:, :num_warmup] for k, v in collected.items()}
    sample_fields = {k: np.asarray(v)[:, num_warmup:] for k, v in collected.items()}
    draws = np.asarray(draws)[:, num_warmup:].reshape(num_chains, num_samples, -1)
    grads_warmup = warm_fields["num_steps"].sum(axis=1)
    grads_sampling = sample_fields["num_steps"].sum(axis=1)
    split = _split_by_gradients(clock.run_s["run"], grads_warmup.sum(), grads_sampling.sum())
    run = SamplerRun(
        draws=draws,
        num_grads_warmup=grads_warmup,
        num_grads_sampling=grads_sampling,
        num_divergent_warmup=warm_fields["diverging"].sum(axis=1),
        num_divergent_sampling=sample_fields["diverging"].sum(axis=1),
        timing=_timing(clock, *split, estimated=True),
        extra={
            "chain_method": chain_method,
            "mean_acceptance": _as_float_list(sample_fields["accept_prob"].mean(axis=1)),
            "mean_steps_per_draw": _as_float_list(sample_fields["num_steps"].mean(axis=1)),
        },
    )
    return run, mcmc, warm_fields, sample_fields


def run_numpyro_nuts(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """NumPyro ``NUTS(potential_fn=-logdensity_fn)`` driven by ``numpyro.infer.MCMC``.

    ``chain_method="sequential"``, the chains one after another, unless
    ``options["chain_method"]`` says otherwise: what NumPyro's default
    (``"parallel"``) does on a CPU with one JAX device, and 1.1-4x cheaper per
    gradient here than ``"vectorized"`` (one ``vmap``, where every iteration
    waits for the deepest tree; docs/decisions.md, "The per-second baseline").
    ``numpyro_nuts_vectorized`` is the same with ``chain_method="vectorized"``, faster on
    some models: the per-second baseline is the better of the two.  Other ``options`` go to
    ``NUTS`` (e.g. ``target_accept_prob``, ``dense_mass``).  One ``MCMC.run``, as users call it.
    """
    from numpyro.infer import NUTS

    options = dict(options)
    chain_method = options.pop("chain_method", "sequential")
    logdensity_fn = model.logdensity_fn
    kernel = NUTS(potential_fn=numpyro_potential(logdensity_fn), **options)
    run, mcmc, _, _ = _run_numpyro_mcmc(kernel, rng_key, positions, num_warmup, num_samples, chain_method, ())
    run.extra["step_size"] = _as_float_list(mcmc.last_state.adapt_state.step_size)
    return run


def run_numpyro_nuts_vectorized(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """NumPyro's NUTS with ``chain_method="vectorized"``: the chains in one ``vmap``."""
    return run_numpyro_nuts(rng_key, model, positions, num_warmup, num_samples,
                            **{"chain_method": "vectorized", **options})


# --------------------------------------------------------------------------- #
# ahmc through BlackJAX
# --------------------------------------------------------------------------- #


def run_ahmc_blackjax(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """ahmc's adaptive HMC through its public BlackJAX entry point, ``ahmc.adapters.blackjax.run_chains``
    (pooled tuner by default; ``options`` go to it, e.g. ``paper_preset``, ``pooled``).

    The run is one compiled program; the clock takes its compilation from JAX's compile events, as for
    NumPyro's ``MCMC`` (a driver we do not control), and splits the run time between warm-up and
    sampling by their gradients (``sampling_time_estimated``; the headline uses the measured total).
    ``return_state=True`` gives the final state, whose search box the report's reward-surface figure needs.
    """
    import jax
    import jax.numpy as jnp

    from ahmc.adapters.blackjax import run_chains

    clock = CompileClock()
    with clock.phase("warmup"):
        samples, info, state = jax.block_until_ready(run_chains(
            rng_key, model.logdensity_fn, jnp.asarray(positions), num_warmup, num_samples, return_state=True,
            **options))
    draws = np.asarray(samples).reshape(positions.shape[0], num_samples, -1)
    chain_info = info  # (chains, iterations), as run_chains returns it; kept for the tuning figure
    info = _iterations_first(info)
    steps = np.asarray(info.num_integration_steps)
    divergent = np.asarray(info.is_divergent)
    if getattr(info, "is_warmup", None) is not None:
        is_warmup = np.asarray(info.is_warmup, dtype=bool)
    else:
        is_warmup = np.broadcast_to((np.arange(steps.shape[0]) < num_warmup)[:, None], steps.shape)
    grads_warmup = np.where(is_warmup, steps, 0).sum(axis=0)
    grads_sampling = np.where(is_warmup, 0, steps).sum(axis=0)
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
    if getattr(info, "restarted", None) is not None:  # lost chains restarted in warm-up
        extra["restarts"] = _as_float_list(np.asarray(info.restarted).sum(axis=0))
    keep = None
    if getattr(state, "box", None) is not None and hasattr(info, "_asdict"):
        keep = {"tuning": {"info": {k: np.asarray(v) for k, v in chain_info._asdict().items()},
                           "search_box": (np.asarray(state.box.step_size), np.asarray(state.box.num_steps)),
                           "options": dict(options)}}
    return SamplerRun(
        draws=draws,
        num_grads_warmup=grads_warmup,
        num_grads_sampling=grads_sampling,
        num_divergent_warmup=np.where(is_warmup, divergent, 0).sum(axis=0),
        num_divergent_sampling=np.where(is_warmup, 0, divergent).sum(axis=0),
        timing=_timing(clock, *_split_by_gradients(clock.run_s["warmup"], grads_warmup.sum(), grads_sampling.sum()),
                       estimated=True),
        extra=extra,
        keep=keep,
    )


def _iterations_first(info):
    """``run_chains``' info, fields ``(chains, iterations)``, as ``(iterations, chains)`` for the runners' sums."""
    import jax

    return jax.tree.map(lambda x: np.swapaxes(np.asarray(x), 0, 1), info)


def _split_by_gradients(run_s: float, grads_warmup, grads_sampling) -> tuple[float, float]:
    """One program's run time split between warm-up and sampling by their gradients (an estimate: the
    total, which the headline metric uses, is measured)."""
    share = float(grads_sampling) / max(float(grads_warmup + grads_sampling), 1.0)
    return run_s * (1.0 - share), run_s * share


# --------------------------------------------------------------------------- #
# ahmc through NumPyro
# --------------------------------------------------------------------------- #


def run_ahmc_numpyro(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """ahmc's ``AdaptiveHMC(potential_fn=-logdensity_fn)`` driven by ``numpyro.infer.MCMC``.

    Vectorized chains (one pooled tuner) unless ``options["chain_method"]``
    says otherwise; other ``options`` go to ``AdaptiveHMC``.  One ``MCMC.run``,
    timed exactly as ``numpyro_nuts``.
    """
    return _run_ahmc_kernel(model.logdensity_fn, rng_key, positions, num_warmup, num_samples, **options)


def _run_ahmc_kernel(logdensity_fn, rng_key, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """``AdaptiveHMC(potential_fn=-logdensity_fn)`` through ``_run_numpyro_mcmc``, with the tuner's extras."""
    from ahmc.adapters.numpyro import AdaptiveHMC

    options = dict(options)
    chain_method = options.pop("chain_method", "vectorized")
    kernel = AdaptiveHMC(potential_fn=numpyro_potential(logdensity_fn), **options)
    fields = ("step_size", "max_steps", "arm_changed", "tuning_round", "restarted")
    run, _, warm, sample = _run_numpyro_mcmc(kernel, rng_key, positions, num_warmup, num_samples,
                                             chain_method, fields)
    run.extra.update(
        final_step_size=_as_float_list(np.asarray(sample["step_size"])[:, -1]),
        final_num_steps=_as_float_list(np.asarray(sample["max_steps"])[:, -1]),
        rounds=_as_float_list(np.asarray(sample["tuning_round"]).max(axis=1)),
        arm_changes=_as_float_list(np.asarray(warm["arm_changed"]).sum(axis=1)
                                   + np.asarray(sample["arm_changed"]).sum(axis=1)),
        restarts=_as_float_list(np.asarray(warm["restarted"]).sum(axis=1)),  # lost chains restarted in warm-up
    )
    return run


# --------------------------------------------------------------------------- #
# BlackJAX ChEES-HMC (many chains)
# --------------------------------------------------------------------------- #


def _more_positions(model, positions, num_chains: int) -> np.ndarray:
    """``positions`` plus extra starting points drawn as they were (``init + Uniform(-2, 2)``)."""
    extra = num_chains - positions.shape[0]
    if extra <= 0:
        return np.asarray(positions)[:num_chains]
    rng = np.random.default_rng([num_chains, positions.shape[1], 8])
    more = np.asarray(model.init) + rng.uniform(-2.0, 2.0, size=(extra, positions.shape[1]))
    return np.concatenate([np.asarray(positions), more.astype(positions.dtype)])


# ChEES's draws, all chains in float64, are kept below this many bytes: 16 chains of the 64 x 64 LGCP at
# 4000 draws (8.4 GB, then copied for the metrics) ran this 24 GB machine out of memory (2026-11-29).
CHEES_DRAWS_BYTES = 3e9


def chees_num_chains(num_samples: int, dim: int, default: int = 16, minimum: int = 4) -> int:
    """ChEES's chain count: ``default`` unless their float64 draws would pass ``CHEES_DRAWS_BYTES``;
    then as many as fit, but at least ``minimum``."""
    per_chain = 8.0 * num_samples * dim
    return int(max(minimum, min(default, CHEES_DRAWS_BYTES // per_chain)))


def run_chees(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """BlackJAX ChEES-HMC: ``blackjax.chees_adaptation`` over many chains, then ``blackjax.dynamic_hmc``.

    ChEES tunes one step size and trajectory length from the ensemble, so it
    runs ``options["num_chains"]`` chains (default 16, fewer where their draws would not fit in
    memory: :func:`chees_num_chains`): the benchmark's starting points plus more drawn the same way.  Every chain's gradients
    count, in warm-up and sampling, and the ESS is that of all the chains
    together, so ESS per gradient stays comparable with the 4-chain samplers;
    per-chain numbers (box plots) cover all of them.  Trajectories are jittered
    by the Halton sequence, as ``chees_adaptation`` sets up.  Options:
    ``num_chains``, ``learning_rate`` (Adam, default 0.025), ``initial_step_size``
    (0.1); the rest go to ``chees_adaptation``.  ``mass_matrix_estimation``
    defaults to ``"diagonal"`` (BlackJAX's ensemble estimate of a diagonal
    metric; its own default, ``None``, keeps the identity), since every other
    sampler here adapts a diagonal metric too.
    """
    import jax
    import jax.numpy as jnp
    import optax

    import blackjax
    from blackjax.adaptation.base import get_filter_adapt_info_fn

    options = dict(options)
    num_chains = int(options.pop("num_chains", chees_num_chains(num_samples, model.dim)))
    learning_rate = float(options.pop("learning_rate", 0.025))
    initial_step_size = float(options.pop("initial_step_size", 0.1))
    options.setdefault("mass_matrix_estimation", "diagonal")
    start = jnp.asarray(_more_positions(model, positions, num_chains))
    logdensity_fn = model.logdensity_fn
    warmup = blackjax.chees_adaptation(
        logdensity_fn, num_chains,
        adaptation_info_fn=get_filter_adapt_info_fn(info_keys={"num_integration_steps", "is_divergent"}),
        **options,
    )  # fmt: skip

    warm_key, sample_key = jax.random.split(rng_key)
    clock = CompileClock()
    with clock.phase("warmup"):  # run() scans internally; its parameters include the jitter callables
        (states, parameters), info = warmup.run(warm_key, start, initial_step_size, optax.adam(learning_rate),
                                                num_warmup, max_sampling_steps=num_samples)
        states, grads_warmup, div_warmup = _block(
            (states, jnp.sum(info.info.num_integration_steps, axis=0), jnp.sum(info.info.is_divergent, axis=0)))

    def sample_all(key, states):
        hmc = blackjax.dynamic_hmc(logdensity_fn, **parameters)

        def body(states, step_key):
            states, info = jax.vmap(hmc.step)(jax.random.split(step_key, num_chains), states)
            return states, (states.position, info.num_integration_steps, info.is_divergent, info.acceptance_rate)

        _, out = jax.lax.scan(body, states, jax.random.split(key, num_samples))
        return out

    with clock.phase("sampling"):
        sample_compiled = jax.jit(sample_all).lower(sample_key, states).compile()
        draws, steps, divergent, acceptance = clock.execute(sample_compiled, sample_key, states)
    steps = np.asarray(steps)  # (num_samples, chains)
    return SamplerRun(
        draws=np.swapaxes(np.asarray(draws), 0, 1),
        num_grads_warmup=np.asarray(grads_warmup),
        num_grads_sampling=steps.sum(axis=0),
        num_divergent_warmup=np.asarray(div_warmup),
        num_divergent_sampling=np.asarray(divergent).sum(axis=0),
        timing=_timing(clock, clock.run_s["warmup"], clock.run_s["sampling"]),
        extra={
            "num_chains": num_chains,
            "step_size": float(parameters["step_size"]),
            "mean_num_steps": float(parameters["integration_steps_params"][0]),
            "mean_acceptance": _as_float_list(np.asarray(acceptance).mean(axis=0)),
            "mean_steps_per_draw": _as_float_list(steps.mean(axis=0)),
        },
    )


# --------------------------------------------------------------------------- #
# BlackJAX MEADS (generalized HMC, many chains)
# --------------------------------------------------------------------------- #


def run_meads(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """BlackJAX MEADS (Hoffman & Sountsov 2022): ``blackjax.meads_adaptation`` over ``num_chains`` chains
    in 4 folds (its default), then ``blackjax.ghmc`` with the adapted step size, diagonal momentum
    scale, persistence ``alpha`` and slice shift ``delta``.

    GHMC takes one leapfrog step per iteration, so a chain's gradients are its iterations; MEADS's warm-up
    evaluates every chain at every step (the frozen fold's move is discarded), and all count.  The ESS pools
    the chains, as for ChEES.  Options: ``num_chains`` (default as ChEES's, a multiple of the folds), the rest
    go to ``meads_adaptation``.
    """
    import jax
    import jax.numpy as jnp

    import blackjax
    from blackjax.adaptation.base import get_filter_adapt_info_fn

    options = dict(options)
    num_folds = int(options.setdefault("num_folds", 4))
    num_chains = int(options.pop("num_chains", chees_num_chains(num_samples, model.dim)))
    num_chains = max(num_folds, num_chains - num_chains % num_folds)
    start = jnp.asarray(_more_positions(model, positions, num_chains))
    logdensity_fn = model.logdensity_fn
    warmup = blackjax.meads_adaptation(logdensity_fn, num_chains,
                                       adaptation_info_fn=get_filter_adapt_info_fn(info_keys={"is_divergent"}),
                                       **options)
    warm_key, sample_key = jax.random.split(rng_key)
    clock = CompileClock()
    with clock.phase("warmup"):
        (states, parameters), info = warmup.run(warm_key, start, num_warmup)
        states, div_warmup = _block((states, jnp.sum(info.info.is_divergent, axis=0)))

    def sample_all(key, states):
        ghmc = blackjax.ghmc(logdensity_fn, **parameters)

        def body(states, step_key):
            states, info = jax.vmap(ghmc.step)(jax.random.split(step_key, num_chains), states)
            return states, (states.position, info.is_divergent, info.acceptance_rate)

        _, out = jax.lax.scan(body, states, jax.random.split(key, num_samples))
        return out

    with clock.phase("sampling"):
        sample_compiled = jax.jit(sample_all).lower(sample_key, states).compile()
        draws, divergent, acceptance = clock.execute(sample_compiled, sample_key, states)
    return SamplerRun(
        draws=np.swapaxes(np.asarray(draws), 0, 1),
        num_grads_warmup=np.full(num_chains, float(num_warmup)),
        num_grads_sampling=np.full(num_chains, float(num_samples)),
        num_divergent_warmup=np.asarray(div_warmup),
        num_divergent_sampling=np.asarray(divergent).sum(axis=0),
        timing=_timing(clock, clock.run_s["warmup"], clock.run_s["sampling"]),
        extra={
            "num_chains": num_chains,
            "step_size": float(parameters["step_size"]),
            "alpha": float(parameters["alpha"]),
            "delta": float(parameters["delta"]),
            "mean_acceptance": _as_float_list(np.asarray(acceptance).mean(axis=0)),
        },
    )


# --------------------------------------------------------------------------- #
# BlackJAX adjusted MCLMC (Metropolis-adjusted microcanonical dynamics)
# --------------------------------------------------------------------------- #

# Gradient evaluations per step of BlackJAX's default MCLMC integrator, the two-stage
# isokinetic McLachlan scheme (its last gradient is the next step's first).
MCLACHLAN_GRADS_PER_STEP = 2


def run_adjusted_mclmc(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """BlackJAX adjusted MCLMC (Robnik et al. 2025): ``blackjax.adjusted_mclmc_find_L_and_step_size`` per
    chain (its diagonal preconditioning, target acceptance 0.9 as BlackJAX's guide sets for it), then
    ``blackjax.adjusted_mclmc_dynamic`` with uniformly jittered trajectory lengths.

    Its two tuning stages take ``frac_tune1`` and ``frac_tune2`` of a run of ``num_samples`` steps; both are
    set so the tuning runs ``num_warmup`` iterations, like every other sampler here.  Gradients: two per
    integration step (the isokinetic McLachlan integrator), tuning's as BlackJAX counts its steps.  Options:
    ``target`` (acceptance), the rest go to the tuning function.
    """
    import jax
    import jax.numpy as jnp

    import blackjax
    from blackjax.mcmc.adjusted_mclmc_dynamic import make_random_trajectory_length_fn

    options = dict(options)
    target = float(options.pop("target", 0.9))
    fraction = 0.5 * num_warmup / num_samples
    options.setdefault("frac_tune1", fraction)
    options.setdefault("frac_tune2", fraction)
    logdensity_fn = model.logdensity_fn
    kernel = blackjax.adjusted_mclmc_dynamic.build_kernel(
        integration_steps_fn=make_random_trajectory_length_fn(True))

    def tune_one(key, position):
        init_key, tune_key = jax.random.split(key)
        state = blackjax.adjusted_mclmc_dynamic.init(position, logdensity_fn, init_key)
        state, params, num_steps = blackjax.adjusted_mclmc_find_L_and_step_size(
            kernel, logdensity_fn, num_samples, state, tune_key, target, **options)
        return state, params, num_steps

    def sample_one(key, state, params):
        def body(state, step_key):
            state, info = kernel(step_key, state, logdensity_fn, params.step_size,
                                 inverse_mass_matrix=params.inverse_mass_matrix,
                                 integration_steps_params=(params.L / params.step_size,))
            return state, (state.position, info.num_integration_steps, info.is_divergent, info.acceptance_rate)

        return jax.lax.scan(body, state, jax.random.split(key, num_samples))[1]

    num_chains = positions.shape[0]
    warm_key, sample_key = jax.random.split(rng_key)
    warm_keys, sample_keys = jax.random.split(warm_key, num_chains), jax.random.split(sample_key, num_chains)
    start = jnp.asarray(positions)
    clock = CompileClock()
    with clock.phase("warmup"):
        tune_compiled = jax.jit(jax.vmap(tune_one)).lower(warm_keys, start).compile()
        states, params, tune_steps = _block(clock.execute(tune_compiled, warm_keys, start))
    with clock.phase("sampling"):
        sample_compiled = jax.jit(jax.vmap(sample_one)).lower(sample_keys, states, params).compile()
        draws, steps, divergent, acceptance = clock.execute(sample_compiled, sample_keys, states, params)
    steps = np.asarray(steps)  # (chains, num_samples)
    return SamplerRun(
        draws=np.asarray(draws),
        num_grads_warmup=MCLACHLAN_GRADS_PER_STEP * np.asarray(tune_steps, dtype=float),
        num_grads_sampling=MCLACHLAN_GRADS_PER_STEP * steps.sum(axis=1).astype(float),
        num_divergent_warmup=np.zeros(num_chains),  # not reported by the tuning function
        num_divergent_sampling=np.asarray(divergent).sum(axis=1),
        timing=_timing(clock, clock.run_s["warmup"], clock.run_s["sampling"]),
        extra={
            "step_size": _as_float_list(params.step_size),
            "mean_num_steps": _as_float_list(params.L / params.step_size),
            "mean_acceptance": _as_float_list(np.asarray(acceptance).mean(axis=1)),
        },
    )


# --------------------------------------------------------------------------- #
# PyMC: ahmc's step method, PyMC's NUTS, nutpie
# --------------------------------------------------------------------------- #
#
# The PyMC runners sample the PyMC version of the model (benchmarks/pymc_models.py:
# one free vector ``x`` in the JAX model's coordinates, log density equal up to a
# constant), each chain from its row of ``positions``.  Chains run on one core by
# default (``options["cores"]``, default 1): chain after chain in one process, as
# the JAX runners run their vectorized chains in one process; on this 2-core
# machine ``cores=2`` would also pay process start-up and contend with the other
# jobs.  Compilation (PyTensor/Numba when the step method or nutpie's model is
# built, plus what ``pm.sample`` compiles before its first iteration) goes to
# ``compile_s``; ``warmup_s`` and ``sampling_s`` are the wall time of the
# sampling loop from PyMC's per-iteration clocks (``perf_counter_start`` +
# ``perf_counter_diff``), so they include the loop's own overhead (trace
# writing, ...), not the final conversion to a DataTree.


def _int_seed(rng_key) -> int:
    """A 31-bit integer seed from the benchmark's JAX key (0 without one)."""
    if rng_key is None:
        return 0
    import jax

    return int(jax.random.randint(rng_key, (), 0, 2**31 - 1))


def _pymc_model(model):
    from .pymc_models import build

    return build(model.name)


def _initvals(positions) -> list[dict[str, np.ndarray]]:
    return [{"x": np.asarray(p, dtype=np.float64)} for p in positions]


def _pymc_sample(pm_model, step, positions, num_warmup, num_samples, seed, cores):
    """``pm.sample`` with warm-up kept; returns ``(idata, timing pieces)`` from PyMC's per-iteration clocks."""
    import time

    import pymc as pm

    start = time.perf_counter()
    idata = pm.sample(draws=num_samples, tune=num_warmup, chains=positions.shape[0], cores=cores, step=step,
                      initvals=_initvals(positions), random_seed=seed, progressbar=False,
                      discard_tuned_samples=False, compute_convergence_checks=False, model=pm_model, quiet=True)
    end = time.perf_counter()
    # Per chain: warm-up from the start of its first tune iteration to the start of its
    # first draw; sampling from there to the end of its last draw.
    warm_start = idata.warmup_sample_stats["perf_counter_start"].values if num_warmup else None
    draw_start = idata.sample_stats["perf_counter_start"].values
    draw_end = draw_start[:, -1] + idata.sample_stats["perf_counter_diff"].values[:, -1]
    first = draw_start[:, 0] if warm_start is None else warm_start[:, 0]
    warmup_spans = draw_start[:, 0] - first
    sampling_spans = draw_end - draw_start[:, 0]
    loop_start, loop_end = float(first.min()), float(draw_end.max())
    # Chains overlap in time with cores > 1 (processes) and with a population step method such as
    # PooledAdaptiveHMC, which PyMC steps in lockstep in one process; then each chain's span
    # covers the others' work too, and summing the spans would count the loop's time once per chain.
    order = np.argsort(first)
    estimated = bool(np.any(first[order][1:] < draw_end[order][:-1]))
    if estimated:  # chains overlap in time: split the loop's wall time by the chains' spans
        loop = loop_end - loop_start
        share = warmup_spans.sum() / max(warmup_spans.sum() + sampling_spans.sum(), 1e-300)
        warmup_s, sampling_s = loop * share, loop * (1 - share)
    else:
        warmup_s, sampling_s = float(warmup_spans.sum()), float(sampling_spans.sum())
    pieces = {
        "warmup_s": float(warmup_s),
        "sampling_s": float(sampling_s),
        "estimated": estimated,
        "pm_sample_wall_s": end - start,
        "before_loop_s": loop_start - start,  # initial points, trace set-up (compiles a little)
        "after_loop_s": end - loop_end,  # DataTree conversion
        "cores": cores,
    }
    return idata, pieces


def _pymc_run(idata, pieces, compile_s, grads_field, num_warmup, extra) -> SamplerRun:
    def stat(group, name):
        return np.asarray(idata[group][name].values)

    num_chains = idata.posterior.sizes["chain"]
    zeros = np.zeros(num_chains, dtype=np.int64)
    has_warmup = num_warmup > 0 and "warmup_sample_stats" in idata.children
    draws = np.asarray(idata.posterior["x"].values, dtype=np.float64)
    compile_total = compile_s + pieces["before_loop_s"]
    phases = {"compile_s": {"build": compile_s, "pm_sample_before_loop": pieces["before_loop_s"]},
              "run_s": {"warmup": pieces["warmup_s"], "sampling": pieces["sampling_s"]},
              "pm_sample_wall_s": pieces["pm_sample_wall_s"], "pm_sample_after_loop_s": pieces["after_loop_s"],
              "cores": pieces["cores"], "compile_total_s": compile_total}
    sampling_steps = stat("sample_stats", grads_field)
    extra = {"cores": pieces["cores"], "mean_steps_per_draw": _as_float_list(sampling_steps.mean(axis=1)),
             "step_size": _as_float_list(stat("sample_stats", "step_size")[:, -1]), **extra}
    return SamplerRun(
        draws=draws,
        num_grads_warmup=stat("warmup_sample_stats", grads_field).sum(axis=1).astype(np.int64) if has_warmup else zeros,
        num_grads_sampling=sampling_steps.sum(axis=1).astype(np.int64),
        num_divergent_warmup=stat("warmup_sample_stats", "diverging").sum(axis=1) if has_warmup else zeros,
        num_divergent_sampling=stat("sample_stats", "diverging").sum(axis=1),
        timing={"warmup_s": pieces["warmup_s"], "sampling_s": pieces["sampling_s"], "compile_s": compile_total,
                "sampling_time_estimated": pieces["estimated"], "phases": phases},
        extra=extra,
    )


def run_ahmc_pymc(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """ahmc's PyMC step method: ``pm.sample(step=ahmc.adapters.pymc.AdaptiveHMC(**options))``.

    One tuner per chain (PyMC steps chains independently).  ``options["cores"]``
    (default 1) goes to ``pm.sample``; the other options to ``AdaptiveHMC``.
    Gradients are the ``n_steps`` stat (warm-up ones from ``warmup_sample_stats``).
    Compile time: building the step (PyTensor compiles the log density and
    gradient) plus what ``pm.sample`` does before its first iteration.
    """
    import time

    from ahmc.adapters.pymc import AdaptiveHMC, PooledAdaptiveHMC

    options = dict(options)
    cores = int(options.pop("cores", 1))
    step_class = PooledAdaptiveHMC if options.pop("pooled", False) else AdaptiveHMC
    pm_model = _pymc_model(model)
    start = time.perf_counter()
    step = step_class(model=pm_model, **options)
    compile_s = time.perf_counter() - start
    idata, pieces = _pymc_sample(pm_model, step, positions, num_warmup, num_samples, _int_seed(rng_key), cores)
    stats = idata.sample_stats
    warm_changes = (idata.warmup_sample_stats["arm_changed"].values.sum(axis=1) if num_warmup
                    else np.zeros(positions.shape[0]))
    extra = {
        "final_step_size": _as_float_list(stats["step_size"].values[:, -1]),
        "final_num_steps": _as_float_list(stats["max_steps"].values[:, -1]),
        "mean_acceptance": _as_float_list(stats["acceptance_rate"].values.mean(axis=1)),
        "rounds": _as_float_list(stats["tuning_round"].values.max(axis=1)),
        "arm_changes": _as_float_list(warm_changes + stats["arm_changed"].values.sum(axis=1)),
    }
    return _pymc_run(idata, pieces, compile_s, "n_steps", num_warmup, extra)


def run_ahmc_pymc_jax(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """ahmc's compiled route for PyMC models, as its users call it: ``sample_numpyro_ahmc`` (PyMC's JAX
    backend compiles the log density; ahmc's NumPyro kernel, vectorized chains, one pooled tuner).

    The chains start at ``positions`` (``initvals``, no jitter); ``discard_tuned_samples=False`` keeps the
    warm-up's stats, to count its gradients, from the same compiled loop.  The whole call is timed (PyMC's
    JAX conversion, compilation, warm-up, draws, the DataTree); its run time is split between warm-up and
    sampling by their gradients.  Options go to ``sample_numpyro_ahmc`` (the kernel's knobs).
    """
    from ahmc.adapters.pymc import sample_numpyro_ahmc

    pm_model = _pymc_model(model)
    clock = CompileClock()
    with clock.phase("run"):
        tree = sample_numpyro_ahmc(draws=num_samples, tune=num_warmup, chains=positions.shape[0],
                                   random_seed=_int_seed(rng_key), initvals=_initvals(positions), jitter=False,
                                   model=pm_model, progressbar=False, quiet=True, compute_convergence_checks=False,
                                   discard_tuned_samples=False, **options)
    warm = tree["warmup_sample_stats"] if num_warmup else None
    stats = tree.sample_stats
    extra = {"final_step_size": _as_float_list(stats["step_size"].values[:, -1]),
             "final_num_steps": _as_float_list(stats["max_steps"].values[:, -1]),
             "rounds": _as_float_list(stats["tuning_round"].values.max(axis=1))}
    return _pymc_jax_run(clock, tree.posterior["x"].values, warm, stats, extra)


def _pymc_jax_run(clock, draws, warm, stats, extra) -> SamplerRun:
    """A SamplerRun from a PyMC JAX route's draws and PyMC-named stats (``n_steps``, ``diverging``,
    ``acceptance_rate``); ``warm``: the warm-up's stats, or None.  One timed phase, ``run``."""
    steps = np.asarray(stats["n_steps"].values, dtype=np.int64)
    num_chains = steps.shape[0]
    warm_steps = (np.asarray(warm["n_steps"].values, dtype=np.int64).sum(axis=1) if warm is not None
                  else np.zeros(num_chains, dtype=np.int64))
    warm_div = (np.asarray(warm["diverging"].values).sum(axis=1) if warm is not None
                else np.zeros(num_chains, dtype=np.int64))
    split = _split_by_gradients(clock.run_s["run"], warm_steps.sum(), steps.sum())
    return SamplerRun(
        draws=np.asarray(draws, dtype=np.float64),
        num_grads_warmup=warm_steps,
        num_grads_sampling=steps.sum(axis=1),
        num_divergent_warmup=warm_div,
        num_divergent_sampling=np.asarray(stats["diverging"].values).sum(axis=1),
        timing=_timing(clock, *split, estimated=True),
        extra={"mean_acceptance": _as_float_list(np.asarray(stats["acceptance_rate"].values).mean(axis=1)),
               "mean_steps_per_draw": _as_float_list(steps.mean(axis=1)), **extra},
    )


def run_pymc_numpyro(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """PyMC's compiled NUTS, ``pm.sample(nuts_sampler="numpyro")``: ``pymc.sampling.jax.sample_numpyro_nuts``,
    NumPyro's NUTS on PyMC's JAX log density, ``chain_method="parallel"`` (PyMC's default; the chains one
    after another on a one-device CPU) unless ``options["chain_method"]``.

    The chains start at ``positions`` (``initvals``, no jitter).  PyMC discards the warm-up, so its
    gradients are counted by widening the collection window of NumPyro's ``MCMC`` during the call (the
    window ``MCMC.warmup(collect_warmup=True)`` sets, over the whole run; the draws are the same) and
    the warm-up's iterations are cut from the returned tree.  Timed as ``ahmc_pymc_jax``.
    """
    from pymc.sampling.jax import sample_numpyro_nuts

    pm_model = _pymc_model(model)
    clock = CompileClock()
    with clock.phase("run"), _numpyro_keeps_warmup():
        tree = sample_numpyro_nuts(draws=num_samples, tune=num_warmup, chains=positions.shape[0],
                                   random_seed=_int_seed(rng_key), initvals=_initvals(positions), jitter=False,
                                   model=pm_model, progressbar=False, quiet=True, compute_convergence_checks=False,
                                   **options)
    kept = tree.sample_stats.sizes["draw"]
    if kept != num_warmup + num_samples:
        raise RuntimeError(f"pymc_numpyro: expected {num_warmup + num_samples} iterations kept, got {kept}")
    warm = tree.sample_stats.isel(draw=slice(0, num_warmup)) if num_warmup else None
    stats = tree.sample_stats.isel(draw=slice(num_warmup, None))
    draws = tree.posterior["x"].values[:, num_warmup:]
    extra = {"chain_method": options.get("chain_method", "parallel")}
    return _pymc_jax_run(clock, draws, warm, stats, extra)


def _keep_every_iteration(mcmc) -> None:
    """Make ``mcmc.run`` keep every iteration, warm-up included.  NumPyro's public API collects the warm-up
    only through ``MCMC.warmup``, a second compiled loop; this is the collection window
    ``MCMC.warmup(collect_warmup=True)`` sets, stretched over the whole run (the draws are the same)."""
    total = mcmc.num_warmup + mcmc.num_samples
    mcmc._set_collection_params(0, total, total, "sample")


def _numpyro_keeps_warmup():
    """A context in which ``numpyro.infer.MCMC`` keeps every iteration of ``run``, warm-up included."""
    import contextlib

    import numpyro.infer

    base = numpyro.infer.MCMC

    class KeepsWarmup(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            _keep_every_iteration(self)

    @contextlib.contextmanager
    def patched():
        numpyro.infer.MCMC = KeepsWarmup
        try:
            yield
        finally:
            numpyro.infer.MCMC = base

    return patched()


def run_pymc_nuts(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """PyMC's own NUTS (``nuts_sampler="pymc"``), set up as ``pm.sample`` does by default.

    ``pm.init_nuts(init="adapt_diag")`` builds the NUTS step with PyMC's
    diagonal mass-matrix adaptation (``pm.sample``'s default init is
    ``"jitter+adapt_diag"``; the jitter is left out so the chains start exactly
    at ``positions``, which are already jittered), then ``pm.sample(step=...)``.
    Gradients are the ``n_steps`` stat (NUTS's ``tree_size``, the leapfrog steps of the tree,
    as the DataTree names it).
    ``options["cores"]`` (default 1) goes to ``pm.sample``, the others to ``pm.NUTS``
    (e.g. ``target_accept``).
    """
    import time

    import pymc as pm

    options = dict(options)
    cores = int(options.pop("cores", 1))
    init = options.pop("init", "adapt_diag")  # "adapt_full": PyMC's dense mass-matrix adaptation
    seed = _int_seed(rng_key)
    pm_model = _pymc_model(model)
    start = time.perf_counter()
    _, step = pm.init_nuts(init=init, chains=positions.shape[0], initvals=_initvals(positions),
                           model=pm_model, random_seed=seed, progressbar=False, quiet=True, tune=num_warmup,
                           **options)
    compile_s = time.perf_counter() - start
    idata, pieces = _pymc_sample(pm_model, step, positions, num_warmup, num_samples, seed, cores)
    stats = idata.sample_stats
    extra = {
        "mean_acceptance": _as_float_list(stats["acceptance_rate"].values.mean(axis=1)),
        "max_tree_depth": _as_float_list(stats["tree_depth"].values.max(axis=1)),
    }
    return _pymc_run(idata, pieces, compile_s, "n_steps", num_warmup, extra)


def run_nutpie(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """nutpie's compiled NUTS (Rust sampler, Numba-compiled log density) on the PyMC model.

    ``nutpie.compile_pymc_model`` (timed as compile) then ``nutpie.sample``
    with ``save_warmup=True``; gradients are the ``n_steps`` stat.  nutpie has
    no per-chain initial values: the compiled model's ``initial_point_func``
    (called once per chain with a chain seed) is replaced by one that hands out
    the rows of ``positions`` in call order, so the chains start from the same
    set of points as every other sampler (which chain gets which row follows
    nutpie's scheduling).  Warm-up and sampling run in one call: their times
    are apportioned by gradient counts (``sampling_time_estimated``).
    ``options["cores"]`` (default 1) and the other options go to ``nutpie.sample``.
    """
    import dataclasses
    import threading
    import time

    try:
        import nutpie
    except ImportError as error:
        raise ModuleNotFoundError(f"nutpie is not installed ({error}); it comes with the 'pymc' extra") from error

    options = dict(options)
    cores = int(options.pop("cores", 1))
    pm_model = _pymc_model(model)
    start = time.perf_counter()
    compiled = nutpie.compile_pymc_model(pm_model)
    compile_s = time.perf_counter() - start

    rows = np.asarray(positions, dtype=np.float64)
    handed: dict[int, int] = {}
    lock = threading.Lock()

    def initial_point(seed):
        with lock:
            if seed not in handed:
                handed[seed] = len(handed)
            return rows[handed[seed] % len(rows)].copy()

    compiled = dataclasses.replace(compiled, initial_point_func=initial_point)
    start = time.perf_counter()
    trace = nutpie.sample(compiled, draws=num_samples, tune=num_warmup, chains=rows.shape[0], cores=cores,
                          seed=_int_seed(rng_key), progress_bar=False, save_warmup=True, **options)
    run_s = time.perf_counter() - start
    draws = np.asarray(trace.posterior["x"].values, dtype=np.float64)
    num_chains = draws.shape[0]
    zeros = np.zeros(num_chains, dtype=np.int64)
    stats = trace.sample_stats
    steps = np.asarray(stats["n_steps"].values, dtype=np.int64)
    if num_warmup:
        warm_steps = np.asarray(trace.warmup_sample_stats["n_steps"].values, dtype=np.int64)
        warm_div = np.asarray(trace.warmup_sample_stats["diverging"].values).sum(axis=1)
    else:
        warm_steps, warm_div = zeros[:, None], zeros
    total = warm_steps.sum() + steps.sum()
    fraction = steps.sum() / total if total > 0 else 0.5
    return SamplerRun(
        draws=draws,
        num_grads_warmup=warm_steps.sum(axis=1),
        num_grads_sampling=steps.sum(axis=1),
        num_divergent_warmup=warm_div,
        num_divergent_sampling=np.asarray(stats["diverging"].values).sum(axis=1),
        timing={"warmup_s": float(run_s * (1 - fraction)), "sampling_s": float(run_s * fraction),
                "compile_s": compile_s, "sampling_time_estimated": True,
                "phases": {"compile_s": {"compile_pymc_model": compile_s}, "nutpie_sample_wall_s": run_s,
                           "cores": cores, "compile_total_s": compile_s}},
        extra={
            "cores": cores,
            "initial_point_calls": len(handed),
            "step_size": _as_float_list(np.asarray(stats["step_size"].values)[:, -1]),
            "mean_acceptance": _as_float_list(np.asarray(stats["mean_tree_accept"].values).mean(axis=1)),
            "mean_steps_per_draw": _as_float_list(steps.mean(axis=1)),
        },
    )


# --------------------------------------------------------------------------- #
# ahmc's adaptive RMHMC (BlackJAX), on the logistic regressions
# --------------------------------------------------------------------------- #


def metric_for(name: str):
    """The metric ARMHMC uses on a benchmark model: the logistic regressions' expected Fisher
    information plus the prior precision (``fisher_logistic_metric``), SoftAbs elsewhere."""
    from ahmc.adapters.blackjax import fisher_logistic_metric

    from .models import load_breast_cancer, load_pima, load_ripley, standardize

    loaders = {"pima": load_pima, "ripley": load_ripley, "breast_cancer": load_breast_cancer}
    if name not in loaders:
        return "softabs"
    features, _, _ = loaders[name]()
    design = np.column_stack([np.ones(len(features)), standardize(np.asarray(features, dtype=np.float64))])
    return fisher_logistic_metric(design, prior_variance=100.0)


def _split_by_phase(info_field, is_warmup):
    values = np.asarray(info_field)
    return np.where(is_warmup, values, 0).sum(axis=0), np.where(is_warmup, 0, values).sum(axis=0)


def run_armhmc(rng_key, model, positions, num_warmup, num_samples, **options) -> SamplerRun:
    """``run_chains(..., metric=)`` with the paper's metric for the model (:func:`metric_for`).

    Cost unit: one per log-density gradient and one per metric evaluation, counted as gradients.
    Timed as :func:`run_ahmc_blackjax` times ``run_chains``.
    """
    import jax
    import jax.numpy as jnp

    from ahmc.adapters.blackjax import run_chains

    clock = CompileClock()
    with clock.phase("warmup"):
        samples, info = jax.block_until_ready(run_chains(
            rng_key, model.logdensity_fn, jnp.asarray(positions), num_warmup, num_samples,
            metric=metric_for(model.name), **options))
    info = _iterations_first(info)
    is_warmup = np.asarray(info.is_warmup, dtype=bool)
    units_warmup, units_sampling = _split_by_phase(info.num_gradient_evals, is_warmup)
    divergent_warmup, divergent_sampling = _split_by_phase(info.is_divergent, is_warmup)
    sampling = ~is_warmup
    return SamplerRun(
        draws=np.asarray(samples).reshape(positions.shape[0], num_samples, -1), num_grads_warmup=units_warmup,
        num_grads_sampling=units_sampling, num_divergent_warmup=divergent_warmup,
        num_divergent_sampling=divergent_sampling,
        timing=_timing(clock, *_split_by_gradients(clock.run_s["warmup"], units_warmup.sum(), units_sampling.sum()),
                       estimated=True),
        extra={
            "final_step_size": _as_float_list(np.asarray(info.step_size)[-1]),
            "final_num_steps": _as_float_list(np.asarray(info.num_steps)[-1]),
            "mean_acceptance": float(np.asarray(info.acceptance_rate)[sampling].mean()),
            "fixed_point_converged": float(np.asarray(info.fixed_point_converged)[sampling].mean()),
            "units_per_draw": float(units_sampling.sum() / sampling.sum()),
            "leapfrog_steps_per_draw": float(np.asarray(info.num_integration_steps)[sampling].mean()),
        },
    )


# --------------------------------------------------------------------------- #
# Dense mass matrices: every sampler with its framework's dense adaptation
# --------------------------------------------------------------------------- #


def _with_defaults(runner: Runner, what: str, **defaults) -> Runner:
    """``runner`` with ``defaults`` under the caller's options (``--sampler-options`` still win)."""

    def run(rng_key, model, positions, num_warmup, num_samples, **options):
        return runner(rng_key, model, positions, num_warmup, num_samples, **{**defaults, **options})

    run.__name__ = f"{runner.__name__}_{'_'.join(f'{k}_{v}' for k, v in defaults.items())}"
    run.__doc__ = f"{runner.__name__} with {defaults}: {what}."
    return run


# Each framework's own dense (or nearest to dense) adaptation: ahmc's three adapters with
# dense_mass=True, BlackJAX window adaptation with a dense matrix, NumPyro NUTS dense_mass=True,
# PyMC NUTS with init="adapt_full", nutpie's low-rank adaptation (it has no full dense one).
DENSE_SAMPLERS: dict[str, Runner] = {
    "ahmc_blackjax_dense": _with_defaults(run_ahmc_blackjax, "dense adapted mass matrix", dense_mass=True),
    "ahmc_numpyro_dense": _with_defaults(run_ahmc_numpyro, "dense adapted mass matrix", dense_mass=True),
    "ahmc_pymc_dense": _with_defaults(run_ahmc_pymc, "dense adapted mass matrix", dense_mass=True),
    "blackjax_nuts_dense": _with_defaults(run_blackjax_nuts, "dense window adaptation",
                                          is_mass_matrix_diagonal=False),
    "numpyro_nuts_dense": _with_defaults(run_numpyro_nuts, "dense adapted mass matrix", dense_mass=True),
    "pymc_nuts_dense": _with_defaults(run_pymc_nuts, "PyMC's dense adaptation", init="adapt_full"),
    "nutpie_low_rank": _with_defaults(run_nutpie, "nutpie's low-rank mass-matrix adaptation", adaptation="low_rank"),
}

# Run by name only (not in the default set): ahmc's adapters with dense_mass="auto" (dense where the
# warm-up's correlations stand out from their noise; diagonal above d = 200, so these run on every
# model), and PooledAdaptiveHMC.
BY_NAME_SAMPLERS: dict[str, Runner] = {
    "ahmc_blackjax_auto": _with_defaults(run_ahmc_blackjax, "dense_mass='auto'", dense_mass="auto"),
    "ahmc_numpyro_auto": _with_defaults(run_ahmc_numpyro, "dense_mass='auto'", dense_mass="auto"),
    "ahmc_pymc_auto": _with_defaults(run_ahmc_pymc, "dense_mass='auto'", dense_mass="auto"),
    "ahmc_pymc_pooled": _with_defaults(run_ahmc_pymc, "one tuner for all chains, stepped in one process",
                                       pooled=True),
    # the metric phase's other estimators (BlackJAX's metric_recipes): docs/decisions.md, "The mass-matrix estimator"
    "ahmc_numpyro_fisher_diag": _with_defaults(run_ahmc_numpyro, "nutpie's Fisher diagonal",
                                               metric_recipe="fisher_diag"),
    "ahmc_pymc_fisher_diag": _with_defaults(run_ahmc_pymc, "nutpie's Fisher diagonal from PyMC's windows",
                                            metric_recipe="fisher_diag"),
    "ahmc_numpyro_low_rank": _with_defaults(run_ahmc_numpyro, "nutpie's Fisher low-rank matrix",
                                            metric_recipe="fisher_low_rank"),
    "ahmc_numpyro_welford_diag": _with_defaults(run_ahmc_numpyro, "Stan's Welford diagonal (the default before "
                                                "2026-12-03)", metric_recipe="welford_diag"),
    # the rewards the strict metric was checked on: docs/decisions.md, "The reward on the strict metric"
    "ahmc_blackjax_moments": _with_defaults(run_ahmc_blackjax, "objective='esjd_moments'",
                                            objective="esjd_moments"),
    "ahmc_blackjax_esjd": _with_defaults(run_ahmc_blackjax, "objective='esjd' (jump per iteration)",
                                         objective="esjd"),
    # the default before 2026-12-05 (docs/decisions.md, "The reward on the strict metric: ESS, not jumps")
    "ahmc_blackjax_esjd_reward": _with_defaults(run_ahmc_blackjax, "the paper's reward", objective="normalized_esjd"),
    "ahmc_numpyro_esjd_reward": _with_defaults(run_ahmc_numpyro, "the paper's reward", objective="normalized_esjd"),
    "ahmc_pymc_esjd_reward": _with_defaults(run_ahmc_pymc, "the paper's reward", objective="normalized_esjd"),
}

# name -> runner; every runner has the signature described in the module docstring.
SAMPLERS: dict[str, Runner] = {
    "blackjax_nuts": run_blackjax_nuts,
    "numpyro_nuts": run_numpyro_nuts,
    "numpyro_nuts_vectorized": run_numpyro_nuts_vectorized,
    "ahmc_blackjax": run_ahmc_blackjax,
    "ahmc_numpyro": run_ahmc_numpyro,
    "ahmc_pymc": run_ahmc_pymc,
    "pymc_nuts": run_pymc_nuts,
    "nutpie": run_nutpie,
    "pymc_numpyro": run_pymc_numpyro,
    "pymc_numpyro_vectorized": _with_defaults(run_pymc_numpyro, "chains vectorized", chain_method="vectorized"),
    "ahmc_pymc_jax": run_ahmc_pymc_jax,
    "chees": run_chees,
    "meads": run_meads,
    "adjusted_mclmc": run_adjusted_mclmc,
    "armhmc": run_armhmc,
    **DENSE_SAMPLERS,
    **BY_NAME_SAMPLERS,
}
