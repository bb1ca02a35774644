"""Running the JAX engine: a whole run as one compiled program, engines and programs reused across calls.

The public entry point is :func:`ahmc.adapters.blackjax.run_chains`; the NumPyro kernel steps the
engine from NumPyro's own loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._jax_engine import build_engine
from ._jax_setup import _check_finite

__all__ = ["sample", "compiled_init"]


def sample(rng_key, logdensity_fn, positions, num_warmup=1000, num_samples=1000, *, build=None, **options):
    """Warm up and sample with infinite adaptation: ``(samples, info, final EngineState)``.

    ``samples`` has leading axes ``(chains, num_samples)``; ``info`` fields have shape
    ``(num_warmup + num_samples, chains)``, warm-up first.  ``build`` makes the engine
    (default :func:`build_engine`; the RMHMC entry point passes its own).  The public
    entry point is :func:`ahmc.adapters.blackjax.run_chains` (``metric=`` for RMHMC).
    """
    build = build or build_engine
    engine = _engine_for(build, logdensity_fn, num_warmup, options)
    if build is build_engine and engine.scan_draws is not None:
        # The plain engine: the whole run is one compiled program (initial state, warm-up, draws), which
        # compiles in about two thirds of the time of the two phases apart and skips the eager
        # initialisation; a start outside the support is still refused before it (cheap compile).
        _check_start(logdensity_fn, positions, _chain_data(options))
        # Short runs scan ``step`` for the draws too: one traced iteration compiles faster (eight schools
        # 6.3 -> 5.3 s) than ``scan_draws``' cheaper loop saves at run time; long runs take that loop.
        draws = engine.scan_draws if num_samples >= SEGMENTED_MIN_SAMPLES else None
        return _whole_run_jit(engine.init, engine.step, draws, rng_key, positions, num_warmup, num_samples)
    init_key, warm_key, sample_key = jax.random.split(rng_key, 3)
    state = engine.init(positions, init_key)
    state, warm_info = _scan(engine.step, warm_key, state, num_warmup, keep_positions=False)
    state, (draws, sample_info) = _scan_draws(engine, sample_key, state, num_samples, num_warmup)
    info = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), warm_info, sample_info)
    samples = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), draws)
    return samples, info, state


#: From this many draws per chain on, ``run_chains`` samples with ``scan_draws`` (segmented rounds, no warm-up
#: code in the loop), below it with the warm-up's own ``step``: the same draws; the specialised loop costs
#: about a second more to compile and saves 0.03-0.07 s per 1000 draws on the quick models (eight schools,
#: Pima; docs/decisions.md, "One traced step for short runs").
SEGMENTED_MIN_SAMPLES = 5000


def _whole_run(init, step, scan_draws, rng_key, positions, num_warmup, num_samples):
    """What :func:`sample` returns, with the same keys and draws, as one traced function (``scan_draws=None``:
    the draws too are a scan of ``step``)."""
    init_key, warm_key, sample_key = jax.random.split(rng_key, 3)
    state = init(positions, init_key)
    if scan_draws is None:
        keys = jnp.concatenate([jax.random.split(warm_key, num_warmup), jax.random.split(sample_key, num_samples)])
        state, (draws, info) = _one_loop(step, state, keys, num_warmup, num_samples)
    else:
        state, warm_info = _scan_impl(step, warm_key, state, num_warmup, False)
        state, (draws, sample_info) = scan_draws(sample_key, state, num_samples, num_warmup)
        info = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), warm_info, sample_info)
    samples = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), draws)
    return samples, info, state


def _one_loop(step, state, keys, num_warmup, num_samples):
    """Warm-up and draws as one scan of ``step``: one traced iteration in the program, not two (the
    compile is most of a short run's time).  The draws go to a buffer row by row; warm-up iterations
    write row 0, which the first draw overwrites."""
    buffer = jax.tree.map(lambda x: jnp.zeros((num_samples,) + x.shape, x.dtype), state.position)

    def body(carry, key_and_index):
        state, buffer = carry
        key, index = key_and_index
        state, info = step(key, state)
        if num_samples:  # no draws (a warm-up only run): nothing to write
            row = jnp.maximum(index - num_warmup, 0)
            buffer = jax.tree.map(lambda b, x: jax.lax.dynamic_update_index_in_dim(b, x, row, 0), buffer,
                                  state.position)
        return (state, buffer), info

    (state, draws), info = jax.lax.scan(body, (state, buffer), (keys, jnp.arange(keys.shape[0])))
    return state, (draws, info)


_whole_run_jit = jax.jit(_whole_run, static_argnums=(0, 1, 2, 5, 6))


def compiled_init(engine, logdensity_fn, positions, rng_key, data=()):
    """``engine.init(positions, rng_key)`` as one compiled program, the start's density checked first.

    Run op by op, the initial state (first step size search, metric, tuner, windows) costs a hundred small
    compilations, about 1.3 s on Pima, more than the whole of NumPyro's NUTS initialisation; compiled, a
    few tenths.  Under a trace (NumPyro's ``parallel`` chains) the check is left to the engine.  ``data``:
    the engine's ``chain_data``, as a 1-tuple (empty without)."""
    if not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves((positions, rng_key))):
        _check_start(logdensity_fn, positions, data)
    return _init_jit(engine.init, positions, rng_key)


def _check_start(logdensity_fn, positions, data=()):
    """Refuse a start outside the support before the run's program compiles (a cheap program of its own)."""
    _check_finite(*_start_density(logdensity_fn, positions, *data))


_init_jit = jax.jit(lambda init, positions, rng_key: init(positions, rng_key), static_argnums=0)
_start_density = jax.jit(lambda fn, positions, *data: jax.vmap(jax.value_and_grad(fn))(positions, *data),
                         static_argnums=0)


def _chain_data(options) -> tuple:
    data = options.get("chain_data")
    return () if data is None else (data,)


_ENGINES: dict = {}
_MAX_ENGINES = 16


def _frozen(value):
    """A hashable stand-in for an option value (TypeError for arrays, whose equality is not a bool)."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (np.ndarray, jax.Array)):
        raise TypeError("arrays are not cached")
    hash(value)
    return value


def _engine_for(build, logdensity_fn, num_warmup, options):
    """The engine for these arguments, reused across calls: its step functions are the jitted loops' static
    arguments, so a second ``run_chains`` with the same log density and options compiles nothing anew.
    Options holding arrays are built afresh (no cache)."""
    try:
        key = (build, logdensity_fn, int(num_warmup), _frozen(options))
    except TypeError:
        return build(logdensity_fn, num_warmup=num_warmup, **options)
    if key not in _ENGINES:
        if len(_ENGINES) >= _MAX_ENGINES:
            _ENGINES.pop(next(iter(_ENGINES)))
        _ENGINES[key] = build(logdensity_fn, num_warmup=num_warmup, **options)
    return _ENGINES[key]


def _scan_draws(engine, rng_key, state, num_samples, first_iteration):
    """The draws after warm-up, compiled: ``engine.scan_draws`` when the engine has one."""
    if engine.scan_draws is None:
        return _scan(engine.step, rng_key, state, num_samples, True)
    return _scan_draws_jit(engine.scan_draws, rng_key, state, num_samples, first_iteration)


_scan_draws_jit = jax.jit(lambda scan_draws, key, state, n, first: scan_draws(key, state, n, first),
                          static_argnums=(0, 3, 4))


def _scan(step, rng_key, state, num_steps, keep_positions):
    return _scan_jit(step, rng_key, state, num_steps, keep_positions)


def _scan_impl(step, rng_key, state, num_steps, keep_positions):
    def body(state, key):
        state, info = step(key, state)
        return state, ((state.position, info) if keep_positions else info)

    keys = jax.random.split(rng_key, num_steps)
    return jax.lax.scan(body, state, keys)


_scan_jit = jax.jit(_scan_impl, static_argnums=(0, 3, 4))
