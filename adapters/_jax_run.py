"""Running the JAX engine: a whole run as one compiled program, engines and programs reused across calls.

The public entry point is :func:`ahmc.adapters.blackjax.run_chains`; the NumPyro kernel steps the
engine from NumPyro's own loop."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._jax_engine import build_engine, engine_parts
from ._jax_setup import _check_finite, warm_inputs

__all__ = ["sample", "compiled_init"]


def sample(rng_key, logdensity_fn, positions, num_warmup=1000, num_samples=1000, *, build=None, **options):
    """Warm up and sample with infinite adaptation: ``(samples, info, final EngineState)``.

    ``samples`` has leading axes ``(chains, num_samples)``; ``info`` fields have shape
    ``(num_warmup + num_samples, chains)``, warm-up first.  ``build`` makes the engine
    (default :func:`build_engine`; the RMHMC entry point passes its own).  The public
    entry point is :func:`ahmc.adapters.blackjax.run_chains` (``metric=`` for RMHMC).
    """
    build = build or build_engine
    if build is build_engine:
        # The plain engine: the whole run is one compiled program (initial state, warm-up, draws), which
        # compiles in about two thirds of the time of the two phases apart and skips the eager
        # initialisation; a start outside the support is still refused before it (cheap compile).
        _check_start(logdensity_fn, positions, _chain_data(options))
        spec, inputs = _run_spec(logdensity_fn, int(num_warmup), int(num_samples), options)
        return _spec_run_jit(spec, rng_key, positions, inputs)
    engine = _engine_for(build, logdensity_fn, num_warmup, options)
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


class RunInputs(NamedTuple):
    """The arrays of a plain-engine run, arguments of its compiled program (not constants in it): the
    leaves of a ``jax.tree_util.Partial`` log density (its data), ``chain_data`` and a warm start's values
    (:class:`ahmc.adapters._jax_setup.WarmInputs`).  A refit on new data of the same shapes, or from
    another snapshot, runs the same program."""

    logdensity_leaves: tuple
    chain_data: Any
    warm_start: Any


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """The static half of a plain-engine run (hashable: equal specs share one compiled program).

    ``logdensity``: the log density, or a ``Partial``'s tree structure (its function included) when its
    leaves are :class:`RunInputs`; ``options_key``: the other options, frozen (:func:`_frozen`); ``options``:
    the same options as given, compared through ``options_key``."""

    logdensity: Any
    is_partial: bool
    num_warmup: int
    num_samples: int
    options_key: tuple
    options: dict = dataclasses.field(compare=False, hash=False)

    def build(self, inputs: RunInputs):
        """The engine of this run, its arrays ``inputs`` (traced under ``jax.jit``)."""
        logdensity_fn = (jax.tree.unflatten(self.logdensity, inputs.logdensity_leaves) if self.is_partial
                         else self.logdensity)
        options = dict(self.options)
        if inputs.chain_data is not None:
            options["chain_data"] = inputs.chain_data
        if inputs.warm_start is not None:
            options["warm_start"] = inputs.warm_start
        with jax.ensure_compile_time_eval():  # the options' checks evaluate concrete values, as outside a trace
            return build_engine(logdensity_fn, num_warmup=self.num_warmup, **options)


def _run_spec(logdensity_fn, num_warmup: int, num_samples: int, options: dict):
    """``(RunSpec, RunInputs)`` of a plain-engine run: the arrays apart from the rest.  Options holding
    other arrays (an ``inverse_mass_matrix``, a hook's state) stay in the spec, which then holds them by
    identity: such a run compiles anew, as a closure over them would."""
    is_partial = isinstance(logdensity_fn, jax.tree_util.Partial)
    leaves, logdensity = jax.tree.flatten(logdensity_fn) if is_partial else ((), logdensity_fn)
    rest = {name: value for name, value in options.items() if name not in ("chain_data", "warm_start")}
    warm = options.get("warm_start")
    if warm is not None:  # the snapshot's values as arrays: its GP evidence on this engine's grid
        engine = build_engine(logdensity_fn, num_warmup=num_warmup, **options)
        warm = warm_inputs(engine_parts(engine), warm)
    try:
        options_key = _frozen(rest)
    except TypeError:
        options_key = (_Identity(rest),)
    spec = RunSpec(logdensity, is_partial, num_warmup, num_samples, options_key, rest)
    return spec, RunInputs(tuple(leaves), options.get("chain_data"), warm)


@dataclasses.dataclass(frozen=True, eq=False)
class _Identity:
    """Options compared by identity (they hold arrays, whose equality is not a bool)."""

    value: Any


def _spec_run(spec: RunSpec, rng_key, positions, inputs: RunInputs):
    engine = spec.build(inputs)
    # Short runs scan ``step`` for the draws too: one traced iteration compiles faster (eight schools
    # 6.3 -> 5.3 s) than ``scan_draws``' cheaper loop saves at run time; long runs take that loop.
    draws = engine.scan_draws if spec.num_samples >= SEGMENTED_MIN_SAMPLES else None
    return _whole_run(engine.init, engine.step, draws, rng_key, positions, spec.num_warmup, spec.num_samples)


_spec_run_jit = jax.jit(_spec_run, static_argnums=0)


def traced(*trees) -> bool:
    """Whether any leaf of ``trees`` is a tracer: the call runs inside a JAX transformation (NumPyro's
    ``parallel`` chains trace ``init`` under ``pmap``), where concrete checks cannot run."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(trees))


def compiled_init(engine, logdensity_fn, positions, rng_key, data=(), check=True):
    """``engine.init(positions, rng_key)`` as one compiled program, the start's density checked first.

    Run op by op, the initial state (first step size search, metric, tuner, windows) costs a hundred small
    compilations, about 1.3 s on Pima, more than the whole of NumPyro's NUTS initialisation; compiled, a
    few tenths.  Under a trace (NumPyro's ``parallel`` chains) the check is left to the engine.  ``data``:
    the engine's ``chain_data``, as a 1-tuple (empty without).  ``check=False``: the caller has checked the
    start already (NumPyro's ``initialize_model`` does), which saves the check's program (0.2 s on Pima)."""
    if check and not traced(positions, rng_key):
        _check_start(logdensity_fn, positions, data)
    return _init_jit(engine.init, positions, rng_key)


def compiled_data_init(make_engine, make_logdensity, data, positions, rng_key, check=True):
    """:func:`compiled_init` for an engine built from ``data`` (NumPyro's model arguments): ``make_engine(data)``
    and ``make_logdensity(data)``.  The data's arrays are the programs' arguments, not constants, so a refit on
    new data of the same shapes finds both programs in JAX's persistent compilation cache (docs/warm_start.md;
    with the data as constants every refit compiled them again, 0.55-0.7 s on Pima).  A model that needs its
    data concrete (NumPy on it) gets them as constants."""
    from ._jax_snapshot import _split_data

    arrays, rebuild = _split_data(data)
    try:
        if check and not traced(positions, rng_key):
            _check_finite(*jax.jit(lambda p, a: _densities(make_logdensity(rebuild(a)), p))(positions, arrays))
        return jax.jit(lambda p, k, a: make_engine(rebuild(a)).init(p, k))(positions, rng_key, arrays)
    except jax.errors.JAXTypeError:
        return compiled_init(make_engine(data), make_logdensity(data), positions, rng_key, check=check)


def _check_start(logdensity_fn, positions, data=()):
    """Refuse a start outside the support before the run's program compiles (a cheap program of its own;
    a ``Partial``'s data are its arguments, as in the run's)."""
    density = _start_density_partial if isinstance(logdensity_fn, jax.tree_util.Partial) else _start_density
    _check_finite(*density(logdensity_fn, positions, *data))


_init_jit = jax.jit(lambda init, positions, rng_key: init(positions, rng_key), static_argnums=0)
def _densities(fn, positions, *data):
    return jax.vmap(jax.value_and_grad(fn))(positions, *data)


_start_density = jax.jit(_densities, static_argnums=0)
_start_density_partial = jax.jit(_densities)  # a Partial is a pytree: its data are traced


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
