"""Adaptive HMC for BlackJAX: a warm-up routine, a matching kernel, an infinitely adapting sampler.

Three entry points, in BlackJAX's conventions:

* :func:`gpucb_adaptation` -- like ``blackjax.window_adaptation``:
  ``(state, parameters), info = gpucb_adaptation(logdensity_fn).run(rng_key, positions, num_steps)``.
  ``parameters`` (``step_size``, ``inverse_mass_matrix``, ``num_integration_steps``)
  plug into :func:`uniform_steps_hmc`, the kernel AHMC tunes: HMC whose number
  of leapfrog steps is drawn uniformly from ``{1..num_integration_steps}`` at
  every iteration (``blackjax.dynamic_hmc`` with that draw).
* :func:`adaptive_hmc` -- ``SamplingAlgorithm(init, step)`` for ONE chain, in BlackJAX's kernel
  convention (``init(position, rng_key)``; ``jax.vmap`` over keys and states for several chains,
  each with its own tuner), whose state carries the GP-UCB tuner: adaptation goes on after warm-up
  with a vanishing probability (the paper's "infinite adaptation", section 4), unless
  ``freeze_after`` stops it.  :func:`pooled_adaptive_hmc` ``(logdensity_fn, num_chains)`` is the
  many-chain form whose chains share one tuner.
* :func:`run_chains` -- warm-up + sampling in one call, for scripts and benchmarks.
* Riemann-manifold HMC (Girolami & Calderhead 2011, the paper's second sampler): every entry point
  above with ``metric=`` -- ``"softabs"``, ``"diagonal_softabs"`` (SoftAbs of the Hessian's diagonal),
  a callable ``flat_position -> (d, d) matrix or (d,) diagonal``, :func:`fisher_logistic_metric`
  ``(X)`` or :func:`constant_metric` ``(G)`` (plain HMC with the dense inverse mass matrix ``G^-1``).
  Its own knobs: ``softabs_alpha`` (1e6), ``fixed_point_tolerance`` (max-abs change of the implicit
  solve's iterates; None = 1e-6 in float64, 1e-4 in float32), ``max_fixed_point_iterations`` (30).
  The warm-up then adapts the step size alone (``G(x)`` is the metric: ``adapt_mass_matrix``,
  ``inverse_mass_matrix``, ``dense_mass`` and ``metric_recipe`` do not apply); the automatic box's
  ``max_integration_time`` is 2 pi with :func:`fisher_logistic_metric`, else 4 pi; the cost of a run
  is ``info.num_gradient_evals`` (gradients plus metric evaluations).  Give the kernel the same
  ``metric`` as the adaptation: ``uniform_steps_hmc(logdensity_fn, **parameters, metric=metric)``.

In :func:`gpucb_adaptation`, :func:`pooled_adaptive_hmc` and :func:`run_chains`, chains live on a
leading axis of ``positions`` and advance together (like BlackJAX's ensemble adaptations): with the
default ``pooled=True`` they share one tuner (the chain-mean reward enters the
GP once, with weight ``num_chains``); ``pooled=False`` gives every chain its
own tuner.  Do not ``jax.vmap`` these three; a single chain's position given to them is refused.  To
spread chains over devices, shard ``positions`` along the chain axis (e.g.
``jax.device_put(positions, NamedSharding(mesh, P("chains")))``); the tuner is
replicated and the pooled reward becomes a cross-device mean.

Options shared by all three (see :func:`ahmc.adapters._jax_engine.build_engine`):
``step_size_bounds``, ``num_steps_bounds`` (user box; default automatic),
``adapt_mass_matrix``, ``inverse_mass_matrix``, ``dense_mass`` (a dense mass matrix: BlackJAX's
``is_mass_matrix_diagonal=False``; ``"auto"``: dense only where the warm-up finds correlations beyond
estimation noise, :func:`ahmc.core.mass_matrix.prefers_dense`), ``pooled``, ``round_length``,
``metric_fraction``, ``step_size_factors``, ``max_integration_time``,
``objective``, ``divergence_penalty``, ``jump_estimate`` (``"trajectory"``: the reward's mean squared jump
from every leapfrog step of the round, each weighted by its acceptance probability; ``"transition"``: the
jumps made, the paper's), ``min_steps_fraction`` (``L_t ~ U{ceil(f L)..L}``; 0 = the
paper's ``U{1..L}``), ``shared_num_steps`` (default True: one ``L_t`` draw per iteration for all chains,
so the vectorized integrator wastes no gradients; False: each chain draws its own), ``schedule``, ``k``,
``freeze_after``, ``target_acceptance_rate``,
GP settings (``capacity``, ``lengthscale``, ``noise_variance``, ``alpha``,
``delta``), ``integrator``, ``divergence_threshold``, ``restart_lost_chains``
(warm-up restarts a chain lost far below the others; 3+ chains), ``sequential_chains`` (the chains'
transitions one after another in the compiled step instead of ``vmap``-ed; the RMHMC variants' default
with SoftAbs, whose implicit solves take a different number of iterations on each chain at the cost
of an eigen-decomposition each).  ``paper_preset=True``
selects Algorithm 2 as published (identity mass matrix, GP from the first
round, linear step-size grid, ``k = 100``, no divergence penalty, the jumps made as the reward, ``U{1..L}``
drawn per chain; requires the two bounds).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import numpy as np

try:
    import jax
    import jax.numpy as jnp

    import blackjax
    from blackjax.adaptation.base import AdaptationResults
    from blackjax.base import AdaptationAlgorithm, SamplingAlgorithm
    from blackjax.mcmc.dynamic_hmc import DynamicHMCState
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        'ahmc.adapters.blackjax needs JAX and BlackJAX: pip install "ahmc[blackjax]"'
    ) from err

from ahmc.core import TunerState
from ahmc.core.config import DEFAULT_DIVERGENCE_RETRY, PAPER_SETTINGS, Config, resolve_options
from ahmc.core.options import check_option_names
from ahmc.core.snapshot import TuningSnapshot, metric_name
from ahmc.core.space import check_min_steps_fraction, min_num_steps

from ._jax_engine import EngineInfo, EngineState, SearchBox, build_engine
from ._jax_setup import engine_option_names
from ._jax_kernel import Retry, finite_energy, finite_logdensity, trajectory_proposal
from ._jax_run import _chain_data, _scan, compiled_init
from ._jax_run import sample as _sample
from ._jax_metrics import DEFAULT_SOFTABS_ALPHA, constant_metric, fisher_logistic_metric
from ._jax_sharding import mesh_context, nested_rhat, shard_chains, superchain_positions
from ._jax_snapshot import engine_snapshot, prepare_warm_start
from ._jax_rmhmc import (DEFAULT_MAX_FIXED_POINT_ITERATIONS, RMHMC_KNOBS, build_rmhmc_engine, kernel_for,
                          transition_kernel)

__all__ = [
    "GPUCBAdaptationInfo",
    "gpucb_adaptation",
    "uniform_steps_hmc",
    "adaptive_hmc",
    "pooled_adaptive_hmc",
    "run_chains",
    "run_many_chains",
    "shard_chains",
    "tuning_snapshot",
    "TuningSnapshot",
    "constant_metric",
    "fisher_logistic_metric",
    "EngineInfo",
    "EngineState",
]

PAPER_PRESET = {**PAPER_SETTINGS, "shared_num_steps": False}  # Algorithm 2 as published (docs/options.md)

def _builder(metric, options: dict, name: str):
    """``(build, options)``: the HMC engine, or with a ``metric`` the RMHMC engine and its options.  The
    options' names and tuning values are checked here, when the entry point is called (``gpucb_adaptation``
    builds its engine only in ``run``, once it knows the warm-up's length)."""
    if metric is None:
        given = [option for option in RMHMC_KNOBS if option in options]
        if given:
            raise ValueError(f"{name}: {given[0]}= applies to Riemann-manifold HMC only; pass metric='softabs' "
                             f"(or another metric) with it, or drop {given[0]}.")
    _, execution = resolve_options(options, name)
    builds = (build_engine,) if metric is None else (build_engine, build_rmhmc_engine)
    check_option_names(execution, engine_option_names(*builds), name)
    if metric is None:
        return build_engine, options
    return build_rmhmc_engine, {**options, "metric": metric}


class GPUCBAdaptationInfo(NamedTuple):
    """What :func:`gpucb_adaptation` did.

    info : EngineInfo
        Per-iteration records, every field of shape (num_steps, num_chains), as BlackJAX's
        ``chees_adaptation`` gives them (:func:`run_chains` puts the chains first, as its samples):
        arm (``step_size``, ``num_steps``), leapfrog steps taken, acceptance,
        divergences, energy, ``reward`` (NaN except at round ends), ``round``,
        ``arm_changed``, ``adapt_probability``.
    search_box : SearchBox
        The box the tuner searched (chosen automatically unless given).
    tuner_state : TunerState
        Final tuner state; ``tuner.surrogate(tuner_state)`` (with
        ``tuner = build_engine(...).tuner``) gives the learned reward surface.
    adaptation_state : EngineState
        Final engine state: ``pooled_adaptive_hmc(logdensity_fn, num_chains, num_warmup=num_steps,
        **same_options).step`` continues from it with infinite adaptation.
    """

    info: EngineInfo
    search_box: SearchBox
    tuner_state: TunerState
    adaptation_state: EngineState


def uniform_steps_hmc(
    logdensity_fn: Callable,
    step_size: float,
    inverse_mass_matrix=None,
    num_integration_steps: int | None = None,
    min_steps_fraction: float = 0.0,
    *,
    metric: Any = None,
    divergence_retry: int | None = DEFAULT_DIVERGENCE_RETRY,
    **kwargs,
) -> SamplingAlgorithm:
    """HMC drawing its number of leapfrog steps uniformly from ``{1..num_integration_steps}``.

    The kernel AHMC tunes (a mixture of HMC kernels, each reversible, so the
    mixture leaves the target invariant).  With ``min_steps_fraction = f`` the
    draw is from ``{max(1, ceil(f L))..L}`` instead (the adaptation's
    ``parameters`` carry the ``f`` it ran with).  Built on ``blackjax.dynamic_hmc``;
    ``init(position, rng_key)`` needs a key (it seeds the step-count draws).
    ``kwargs`` go to ``blackjax.dynamic_hmc`` (``integrator``,
    ``divergence_threshold``).  A divergent transition retries at ``step_size / divergence_retry``, as in
    the adaptation's rounds (``None``: off; docs/algorithm.md): ``info`` is then ahmc's trajectory info
    (BlackJAX's ``HMCInfo`` fields, with ``retried``; ``num_integration_steps`` counts the retry's steps).

    With ``metric=`` (see the module docstring) it is Riemann-manifold HMC, for one chain:
    ``init(position) -> HMCState``, ``step(rng_key, state) -> (HMCState, RMHMCInfo)``; there is no
    ``inverse_mass_matrix``, and ``kwargs`` are the metric's knobs and ``divergence_threshold``.  A
    fixed-point solve that does not converge rejects the proposal (``info.fixed_point_converged``).

    Examples
    --------
    >>> (state, parameters), _ = gpucb_adaptation(logdensity_fn).run(key, positions, 1000)  # doctest: +SKIP
    >>> kernel = uniform_steps_hmc(logdensity_fn, **parameters)                            # doctest: +SKIP
    >>> state, info = jax.vmap(kernel.step)(jax.random.split(key, num_chains), state)       # doctest: +SKIP
    """

    if num_integration_steps is None:
        raise ValueError("uniform_steps_hmc needs num_integration_steps (the maximum L): pass the adaptation's "
                         "parameters, uniform_steps_hmc(logdensity_fn, **parameters).")
    if metric is not None:
        if inverse_mass_matrix is not None:
            raise ValueError("uniform_steps_hmc: inverse_mass_matrix does not apply with metric= (G(x) is the "
                             "metric); pass metric=constant_metric(G) for a fixed dense metric.")
        return _uniform_steps_rmhmc(logdensity_fn, step_size, num_integration_steps, min_steps_fraction, metric,
                                    **kwargs)
    if inverse_mass_matrix is None:
        raise ValueError("uniform_steps_hmc needs inverse_mass_matrix (the adaptation's parameters give it), or "
                         "metric= for Riemann-manifold HMC.")
    fraction = check_min_steps_fraction(min_steps_fraction)
    Config().replace(divergence_retry=divergence_retry)  # checked as every route checks it
    if divergence_retry is not None:  # the adaptation's proposal loop, its per-step sums unused (one bin)
        kwargs["build_proposal"] = trajectory_proposal(lambda dx: dx, jnp.zeros(1), jnp.zeros(1, jnp.int32),
                                                       retry=Retry(int(divergence_retry), True, None))

    def integration_steps_fn(random_generator_arg, max_num_steps):
        lowest = min_num_steps(max_num_steps, fraction, jnp)
        return jax.random.randint(random_generator_arg, (), lowest, max_num_steps + 1)

    return blackjax.dynamic_hmc(
        finite_logdensity(logdensity_fn),  # a non-finite energy is a divergence, never accepted
        step_size,
        finite_energy(inverse_mass_matrix),
        integration_steps_fn=integration_steps_fn,
        integration_steps_params=(jnp.asarray(num_integration_steps, jnp.int32),),
        **kwargs,
    )


def gpucb_adaptation(logdensity_fn: Callable, *, metric: Any = None, paper_preset: bool = False,
                     **options) -> AdaptationAlgorithm:
    """Warm up adaptive HMC: mass matrix, step size, then GP-UCB over ``(eps, L)``.

    Returns ``AdaptationAlgorithm(run)`` with
    ``run(rng_key, positions, num_steps=1000) -> (AdaptationResults(state, parameters), GPUCBAdaptationInfo)``.
    ``positions`` has a leading chain axis; ``state`` is a batched
    ``DynamicHMCState`` ready for :func:`uniform_steps_hmc` (vmap its ``step``);
    ``parameters`` holds ``step_size``, ``inverse_mass_matrix`` (diagonal of the
    flattened position; ``(d, d)`` with ``dense_mass=True``) and ``num_integration_steps`` (the maximum ``L``);
    with ``pooled=False`` the first and last have a leading chain axis.
    ``options``: see the module docstring.  Raises ``ValueError`` if the log
    density is not finite at a starting position.

    With ``metric=`` (Riemann-manifold HMC) the warm-up adapts the step size, then GP-UCB; ``state`` is
    a batched ``HMCState`` and ``parameters`` (``step_size``, ``num_integration_steps``,
    ``min_steps_fraction``) plug into ``uniform_steps_hmc(logdensity_fn, **parameters, metric=metric)``.

    Examples
    --------
    >>> warmup = gpucb_adaptation(logdensity_fn)                                      # doctest: +SKIP
    >>> (state, parameters), info = warmup.run(jax.random.key(0), positions, 1000)  # doctest: +SKIP
    """
    name = "gpucb_adaptation(...).run"
    build, options = _builder(metric, {**options, "paper_preset": paper_preset}, "gpucb_adaptation")

    def run(rng_key, positions, num_steps: int = 1000):
        check_rng_key(rng_key, name)
        check_chain_batch(logdensity_fn, positions, name)
        run_options, positions, num_steps, rng_key = _warm_start(
            logdensity_fn, positions, options, num_steps, rng_key, name)
        engine = build(logdensity_fn, num_warmup=num_steps, **run_options)
        init_key, run_key, generator_key = jax.random.split(rng_key, 3)
        with mesh_context(positions, name):  # sharded chains stay sharded
            state = _start(build, engine, logdensity_fn, positions, init_key, run_options)
            state, info = _scan(engine.step, run_key, state, num_steps, False)
        results = AdaptationResults(*_kernel_start(engine, state, metric, generator_key))
        return results, GPUCBAdaptationInfo(info, state.box, state.tuner, state)

    return AdaptationAlgorithm(run)


def _start(build, engine, logdensity_fn, positions, rng_key, options) -> EngineState:
    """The engine's initial state: compiled as one program for plain HMC (:func:`compiled_init`), op by op
    for RMHMC, whose metric checks at the start need concrete values."""
    if build is not build_engine:
        return engine.init(positions, rng_key)
    return compiled_init(engine, logdensity_fn, positions, rng_key, _chain_data(options))


def _kernel_start(engine, state: EngineState, metric, generator_key) -> tuple:
    """``(chain states, parameters)`` for :func:`uniform_steps_hmc` from the adaptation's final state."""
    parameters = engine.parameters(state)
    if metric is not None:  # RMHMC: blackjax.hmc's state, no mass matrix
        chain_state = blackjax.mcmc.hmc.HMCState(state.position, state.logdensity, state.logdensity_grad)
        return chain_state, {name: parameters[name] for name in
                             ("step_size", "num_integration_steps", "min_steps_fraction")}
    keys = jax.random.split(generator_key, state.logdensity.shape[0])
    return DynamicHMCState(state.position, state.logdensity, state.logdensity_grad, keys), parameters


def _chains_first(info):
    """Per-iteration records stacked over time, ``(iterations, chains)`` fields, as ``(chains, iterations)``:
    the axis order of the samples and of ArviZ's ``(chain, draw)``."""
    return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1) if jnp.ndim(x) >= 2 else x, info)


def _stack_chains(position, num_chains: int):
    return jax.tree.map(lambda x: jnp.broadcast_to(jnp.asarray(x)[None], (num_chains,) + jnp.shape(x)), position)


def _chain_axis_mask(engine, position):
    """Which leaves of the engine's state carry the chain axis: those whose shape changes from 1 chain to 2.

    Found from shapes alone (``jax.eval_shape``), so it costs a trace, never a run, and needs no list of
    fields kept in step with the engine."""
    key = jax.random.key(0)
    one = jax.eval_shape(engine.init, _stack_chains(position, 1), key)
    two = jax.eval_shape(engine.init, _stack_chains(position, 2), key)
    return jax.tree.map(lambda a, b: a.shape != b.shape, one, two)


def _one_chain(engine, start) -> SamplingAlgorithm:
    """BlackJAX's kernel convention on top of the many-chain engine: one chain's state, ``jax.vmap``-able.

    The state is the engine's with its chain axis (of size one) removed, so ``state.position`` is the
    chain's position and ``jax.vmap(step)`` over keys and states runs independent chains, each with
    its own tuner."""

    def init(position, rng_key=None) -> EngineState:
        leaves = jax.tree.leaves(position)
        if not leaves:
            raise ValueError("position is an empty pytree: adaptive_hmc needs at least one coordinate.")
        mask = _chain_axis_mask(engine, position)
        state = start(_stack_chains(position, 1), rng_key)
        return jax.tree.map(lambda x, m: x[0] if m else x, state, mask)

    def step(rng_key, state: EngineState):
        mask = _chain_axis_mask(engine, state.position)
        batched = jax.tree.map(lambda x, m: x[None] if m else x, state, mask)
        batched, info = engine.step(rng_key, batched)
        return jax.tree.map(lambda x, m: x[0] if m else x, batched, mask), jax.tree.map(lambda x: x[0], info)

    return SamplingAlgorithm(init, step)


def _single_chain_options(options: dict, name: str) -> dict:
    if "pooled" in options:
        raise ValueError(
            f"{name} runs one chain, so pooled= does not apply: jax.vmap over its init and step gives every "
            f"chain its own tuner; for one tuner shared by all chains use pooled_{name}(logdensity_fn, num_chains).")
    return options


def adaptive_hmc(
    logdensity_fn: Callable,
    *,
    num_warmup: int = 1000,
    metric: Any = None,
    paper_preset: bool = False,
    **options,
) -> SamplingAlgorithm:
    """Adaptive HMC for one chain, as a BlackJAX ``SamplingAlgorithm(init, step)`` whose state carries the tuner.

    ``init(position, rng_key) -> EngineState`` takes ONE chain's position (any pytree);
    ``step(rng_key, state) -> (EngineState, EngineInfo)`` advances that chain.  For several chains
    ``jax.vmap`` both over keys and positions: each chain then has its own tuner.  For one tuner shared
    by all chains (the pooled tuner of :func:`run_chains`), use :func:`pooled_adaptive_hmc`.

    The first ``num_warmup`` steps are warm-up (mass matrix, step size, GP-UCB
    with ``p_i = 1``); afterwards the arm still moves, with probability
    ``p_i = (i - k + 1)^(-1/2)`` after round ``i`` (``k`` = GP rounds in warm-up).

    Why adapting after warm-up is valid: every arm's kernel leaves the target
    invariant, the adaptation probability vanishes (diminishing adaptation) and
    the grid of arms is finite, so the chain remains ergodic (Wang, Mohamed &
    de Freitas 2013, section 4).  ``freeze_after=n`` stops moving the arm after
    ``n`` GP rounds (``"warmup"``: at the end of warm-up) for a fixed kernel.
    ``EngineInfo.adapt_probability`` records ``p_i``.  ``metric=``: Riemann-manifold HMC (module
    docstring); ``EngineInfo.fixed_point_converged`` then reports failed implicit solves.

    Examples
    --------
    >>> sampler = adaptive_hmc(logdensity_fn)                                          # doctest: +SKIP
    >>> states = jax.vmap(sampler.init)(positions, jax.random.split(key, 4))          # doctest: +SKIP
    >>> states, info = jax.jit(jax.vmap(sampler.step))(jax.random.split(key, 4), states)  # doctest: +SKIP
    """
    options = _single_chain_options({**options, "paper_preset": paper_preset}, "adaptive_hmc")
    build, options = _builder(metric, options, "adaptive_hmc")
    if metric is not None:
        options.setdefault("sequential_chains", False)  # one chain: nothing to run one after another
    # the user's jax.vmap batches this tuner: its solves stay traced (a host callback would run every round)
    options.setdefault("host_solves", False)
    engine = build(logdensity_fn, num_warmup=num_warmup, **options)
    return _one_chain(engine, partial(_start, build, engine, logdensity_fn, options=options))


def pooled_adaptive_hmc(
    logdensity_fn: Callable,
    num_chains: int,
    *,
    num_warmup: int = 1000,
    metric: Any = None,
    paper_preset: bool = False,
    **options,
) -> SamplingAlgorithm:
    """Adaptive HMC for ``num_chains`` chains that share one tuner (like ``blackjax.chees_adaptation(fn, num_chains)``).

    ``init(positions, rng_key)`` takes positions with a leading axis of size ``num_chains``;
    ``step(rng_key, state)`` advances every chain at once: do not ``jax.vmap`` it.  The chain-mean
    reward enters the GP once, with weight ``num_chains``.  ``pooled=False`` gives every chain its own
    tuner inside the one compiled step.  It also continues from ``gpucb_adaptation(...).run``'s
    ``adaptation_state`` (same ``num_warmup`` and options).  ``metric=``: Riemann-manifold HMC."""
    num_chains = _check_num_chains(num_chains)
    build, options = _builder(metric, {**options, "paper_preset": paper_preset}, "pooled_adaptive_hmc")
    engine = build(logdensity_fn, num_warmup=num_warmup, **options)
    return _many_chains(engine, logdensity_fn, num_chains, "pooled_adaptive_hmc",
                        partial(_start, build, engine, logdensity_fn, options=options))


def _check_num_chains(num_chains) -> int:
    if isinstance(num_chains, bool) or not isinstance(num_chains, (int, np.integer)) or num_chains < 1:
        raise ValueError(f"num_chains must be a positive integer (the size of the positions' leading axis); "
                         f"got {num_chains!r}.")
    return int(num_chains)


def _many_chains(engine, logdensity_fn, num_chains, name, start) -> SamplingAlgorithm:
    def init(positions, rng_key=None):
        check_chain_batch(logdensity_fn, positions, name, num_chains=num_chains)
        return start(positions, rng_key)

    return SamplingAlgorithm(init, engine.step)


def check_rng_key(rng_key, name: str) -> None:
    """Refuse a seed where a JAX key is expected (JAX's own error would not name the argument)."""
    dtype = getattr(rng_key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return
    if dtype == np.uint32 and np.ndim(rng_key) >= 1:  # a raw key, as jax.random.PRNGKey makes
        return
    raise ValueError(f"{name}: rng_key must be a JAX key, e.g. jax.random.key(0) (or jax.random.PRNGKey(0)); "
                     f"got {type(rng_key).__name__} {np.shape(rng_key)}.")


def check_chain_batch(logdensity_fn, positions, name: str, num_chains: int | None = None) -> None:
    """Refuse positions that are not a batch of chains, before anything compiles.

    A single chain's ``(d,)`` position has the shape of ``d`` chains of a scalar; reading it so samples
    the wrong target in silence.  When every leaf is one-dimensional and ``logdensity_fn`` also accepts
    the whole of ``positions`` as one position (returns a scalar), the reading is ambiguous and this
    raises with both fixes (for a bare array only: a pytree of ``(n,)`` leaves is ``n`` chains of scalar
    sites, as NumPyro's ``initialize_model`` gives them)."""
    if not callable(logdensity_fn):
        raise TypeError(f"{name}: logdensity_fn must be a callable position -> log density; got "
                        f"{type(logdensity_fn).__name__}. The arguments are (rng_key, logdensity_fn, positions, ...), "
                        "the key first as in BlackJAX.")
    leaves = jax.tree.leaves(positions)
    if not leaves:
        raise ValueError(f"{name}: positions is an empty pytree; give each chain's starting position, "
                         "stacked along a leading chain axis.")
    shapes = [tuple(np.shape(x)) for x in leaves]
    if any(len(shape) == 0 for shape in shapes) or len({shape[0] for shape in shapes}) != 1:
        raise ValueError(
            f"{name}: positions must have a leading chain axis of the same size on every leaf; got leaf shapes "
            f"{shapes}. For one chain: jax.tree.map(lambda x: x[None], position), or use adaptive_hmc's "
            "single-chain init.")
    size = shapes[0][0]
    if size == 0:
        raise ValueError(f"{name}: positions has 0 chains (leading axis of size 0); give at least one chain.")
    if any(int(np.prod(shape[1:])) == 0 for shape in shapes if len(shape) > 1):
        raise ValueError(f"{name}: positions has a leaf with no coordinates (leaf shapes {shapes}); every chain's "
                         "position needs at least one coordinate.")
    if num_chains is not None and size != num_chains:
        raise ValueError(f"{name} was built for num_chains={num_chains}, but positions has a leading axis of size "
                         f"{size}: stack {num_chains} positions, or build it with num_chains={size}.")
    # The mistake to catch is BlackJAX's one-chain habit, a bare (d,) array. A pytree of (n,) leaves is what
    # NumPyro's initialize_model gives for n chains of scalar sites, and a potential that sums accepts it whole
    # too, so only a bare array is tested.
    bare = len(leaves) == 1 and leaves[0] is positions
    if bare and len(shapes[0]) == 1 and _accepts_as_one_position(logdensity_fn, positions):
        raise ValueError(
            f"{name}: positions with leaf shapes {shapes} read as {size} chains of a scalar, but logdensity_fn also "
            f"takes them as ONE position of {sum(s[0] for s in shapes)} coordinates. For one chain, add the chain "
            f"axis: jax.tree.map(lambda x: x[None], position). For {size} chains of a one-dimensional target, give "
            f"shape ({size}, 1).")


def _accepts_as_one_position(logdensity_fn, positions) -> bool:
    try:
        out = jax.eval_shape(logdensity_fn, positions)
    except Exception:  # noqa: BLE001 - any failure means it is not one position
        return False
    return hasattr(out, "shape") and out.shape == ()


def run_chains(
    rng_key,
    logdensity_fn: Callable,
    positions,
    num_warmup: int = 1000,
    num_samples: int = 1000,
    *,
    metric: Any = None,
    paper_preset: bool = False,
    return_state: bool = False,
    **options,
) -> tuple[Any, EngineInfo]:
    """Warm up and sample with :func:`adaptive_hmc`; returns ``(samples, info)``.

    ``samples``: the position pytree with leading axes ``(chains, num_samples)``.
    ``info``: :class:`EngineInfo`, fields of shape ``(chains, num_warmup + num_samples)`` (chains first,
    as the samples); gradient evaluations = ``info.num_integration_steps`` summed (split by
    ``info.is_warmup``).  ``return_state=True`` returns ``(samples, info, state)``, ``state``
    the final :class:`EngineState` (its ``box`` and ``tuner`` are what
    :func:`ahmc.adapters.diagnostics.history_from_blackjax` needs for the reward surface, and
    :func:`tuning_snapshot` what a warm start needs).
    The run is one compiled program, compiled once per engine and shape: a second call with the
    same log density, options and shapes compiles nothing.  A ``jax.tree_util.Partial`` log density's
    arrays (its data), ``chain_data`` and a warm start's values are the program's arguments, so a refit
    on new data of the same shapes, cold or warm, compiles nothing either.

    Positions sharded along the chain axis (:func:`shard_chains`, or your own ``NamedSharding`` over a
    one-axis mesh) run sharded: each device advances its block of chains, the pooled tuner is one tuner
    for all of them (its chain means are cross-device reductions, its state replicated), and samples and
    info come back sharded along their chain axis (docs/devices.md).

    ``warm_start=snapshot`` (a :func:`tuning_snapshot`, or the path it was saved to) starts from an
    earlier fit's tuning: after a short check (:func:`ahmc.core.snapshot.check_fit`), the warm-up
    starts from its metric, step size and GP evidence, so ``num_warmup`` of a few hundred does
    (docs/warm_start.md).  A snapshot that does not fit warns and runs the cold warm-up, of
    ``max(num_warmup, 1000)`` iterations.

    ``metric=``: Riemann-manifold HMC (module docstring); the cost of a run is then
    ``info.num_gradient_evals`` (gradients plus metric evaluations), not ``num_integration_steps``.
    """
    check_rng_key(rng_key, "run_chains")
    check_chain_batch(logdensity_fn, positions, "run_chains")
    build, options = _builder(metric, {**options, "paper_preset": paper_preset}, "run_chains")
    options, positions, num_warmup, rng_key = _warm_start(
        logdensity_fn, positions, options, num_warmup, rng_key, "run_chains")
    with mesh_context(positions, "run_chains"):
        samples, info, state = _sample(rng_key, logdensity_fn, positions, num_warmup, num_samples, build=build,
                                       **options)
        info = _chains_first(info)
    return (samples, info, state) if return_state else (samples, info)


def run_many_chains(
    rng_key,
    logdensity_fn: Callable,
    starts,
    chains_per_superchain: int = 16,
    num_warmup: int = 300,
    num_samples: int = 100,
    *,
    devices=None,
    **options,
) -> tuple[Any, EngineInfo, np.ndarray]:
    """Many short chains, for accelerators: ``(samples, info, nested_rhat)``.

    ``starts`` (leading axis: superchains, at least 2) are the starting points; each starts
    ``chains_per_superchain`` chains (consecutive in ``samples``), all of them sharded over ``devices``
    (default ``jax.devices()``) and tuned by one pooled tuner in a short warm-up.  Convergence is judged
    by ArviZ's nested R-hat (Margossian et al. 2024, one value per coordinate; below about 1.01 it says
    the superchains agree), not by each chain's own mixing, which a few hundred iterations cannot show.
    ``options`` are :func:`run_chains`' (docs/devices.md)."""
    if isinstance(chains_per_superchain, bool) or not isinstance(chains_per_superchain, (int, np.integer)) \
            or chains_per_superchain < 1:
        raise ValueError(f"run_many_chains: chains_per_superchain must be a positive integer, got "
                         f"{chains_per_superchain!r}.")
    num_superchains = int(np.shape(jax.tree.leaves(starts)[0])[0]) if jax.tree.leaves(starts) else 0
    if num_superchains < 2:
        raise ValueError(f"run_many_chains: starts has {num_superchains} superchain(s); nested R-hat compares "
                         "superchains, so give at least 2 starting points (leading axis).")
    positions = shard_chains(superchain_positions(starts, int(chains_per_superchain)), devices)
    samples, info = run_chains(rng_key, logdensity_fn, positions, num_warmup, num_samples, **options)
    return samples, info, nested_rhat(samples, int(chains_per_superchain))


#: The warm-up a run falls back to when its warm-start snapshot does not fit (the default cold warm-up).
COLD_NUM_WARMUP = 1000


def _warm_start(logdensity_fn, positions, options: dict, num_warmup: int, rng_key, name: str):
    """``(options, positions, num_warmup, rng_key)`` of a run, its ``warm_start`` checked first.

    Without ``warm_start`` everything is returned unchanged (the same keys, so the same draws).  A fitting
    snapshot gives the engine the snapshot and the chains the check's last positions; one that does not
    fit is dropped and the warm-up lengthened to the cold one.  With ``metric`` in ``options`` (RMHMC) the
    check runs its transition and the snapshot must be of that metric."""
    if options.get("warm_start") is None:
        return options, positions, num_warmup, rng_key
    check_key, rng_key = jax.random.split(rng_key)
    cold = max(int(num_warmup), COLD_NUM_WARMUP)
    metric = options.get("metric")
    kernel = None if metric is None else kernel_for(metric, options)
    chain_data = options.get("chain_data")  # chain c targets logdensity_fn(x, data_c)
    per_chain = None if chain_data is None else (lambda data: (lambda x: logdensity_fn(x, data)), chain_data)
    snapshot, positions, _ = prepare_warm_start(
        logdensity_fn, positions, options["warm_start"], check_key, name=name, kernel=kernel,
        metric="" if metric is None else metric_name(metric), data_logdensity=per_chain,
        per_chain_data=chain_data is not None, fallback=f"Running the cold warm-up ({cold} iterations) instead.")
    if snapshot is None:
        return {**options, "warm_start": None}, positions, cold, rng_key
    return {**options, "warm_start": snapshot}, positions, num_warmup, rng_key


def tuning_snapshot(info, state: EngineState | None = None, *, metric: Any = None) -> TuningSnapshot:
    """The tuning of a finished run, for the next fit's ``warm_start``.

    ``tuning_snapshot(info, state)`` with what :func:`run_chains` returned (``return_state=True``), or
    ``tuning_snapshot(adaptation_info)`` with ``gpucb_adaptation(...).run``'s info.  ``snapshot.save(path)``
    keeps it beside the draws; ``TuningSnapshot.load(path)`` reads it back.  For a run with ``metric=``
    (RMHMC) give the same ``metric``: the snapshot then keeps the step size and GP evidence in that
    metric's units, and a warm start with another metric (or none) falls back to the cold warm-up."""
    if isinstance(info, GPUCBAdaptationInfo):  # (iterations, chains) fields
        state = info.adaptation_state
        last = (np.asarray(info.info.step_size)[-1], np.asarray(info.info.num_steps)[-1])
    elif state is None or not isinstance(info, EngineInfo):
        raise ValueError("tuning_snapshot needs run_chains(..., return_state=True)'s (info, state), or "
                         "gpucb_adaptation(...).run's info.")
    else:  # run_chains: (chains, iterations) fields
        last = (np.asarray(info.step_size)[:, -1], np.asarray(info.num_steps)[:, -1])
    return engine_snapshot(state, *last, source="blackjax", metric="" if metric is None else metric_name(metric))


def _uniform_steps_rmhmc(logdensity_fn, step_size, num_integration_steps, min_steps_fraction, metric, *,
                         softabs_alpha: float = DEFAULT_SOFTABS_ALPHA, fixed_point_tolerance: float | None = None,
                         max_fixed_point_iterations: int = DEFAULT_MAX_FIXED_POINT_ITERATIONS,
                         divergence_threshold: float = 1000.0) -> SamplingAlgorithm:
    """:func:`uniform_steps_hmc` with ``metric=``: RMHMC (a constant metric: dense HMC), one chain."""
    kernel = transition_kernel(metric, softabs_alpha=softabs_alpha, fixed_point_tolerance=fixed_point_tolerance,
                               max_fixed_point_iterations=max_fixed_point_iterations,
                               divergence_threshold=divergence_threshold)
    max_steps = jnp.asarray(num_integration_steps, jnp.int32)
    lowest = min_num_steps(max_steps, check_min_steps_fraction(min_steps_fraction), jnp)

    def init(position, rng_key=None):
        del rng_key
        return blackjax.mcmc.hmc.init(position, logdensity_fn)

    def step(rng_key, state):
        key_steps, key_kernel = jax.random.split(rng_key)
        num = jax.random.randint(key_steps, (), lowest, max_steps + 1)
        return kernel(key_kernel, state, logdensity_fn, step_size, None, num)

    return SamplingAlgorithm(init, step)
