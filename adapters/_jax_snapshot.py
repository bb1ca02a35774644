"""Warm starts on the JAX routes: a snapshot from a finished engine state, and the check before it is used.

:func:`engine_snapshot` reads a :class:`ahmc.core.snapshot.TuningSnapshot` off an :class:`EngineState`
(the BlackJAX and NumPyro adapters call it on their final state).  :func:`prepare_warm_start` runs the
check of :func:`ahmc.core.snapshot.check_fit` before anything else compiles: a short HMC run at the
snapshot's metric and arm, from its positions.  When the snapshot fits, the engine starts from it and
the chains from the check's last positions; when it does not, the caller runs the cold warm-up and the
user is told why.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import blackjax.mcmc.hmc as hmc

from ahmc.core.snapshot import (CHECK_ITERATIONS, FitReport, TuningSnapshot, WarmStartWarning, check_fit,
                                check_metric, load_snapshot, match_coordinates)

__all__ = ["engine_snapshot", "load_snapshot", "prepare_warm_start", "WarmStartWarning"]


def coordinates(tree) -> tuple:
    """The ``(name, size)`` blocks of one chain's position pytree, in ``ravel_pytree``'s order (a dict's
    keys by name: a NumPyro model's sites, the compiled PyMC route's value variables)."""
    def name(path):
        if len(path) == 1 and isinstance(path[0], jax.tree_util.DictKey):
            return str(path[0].key)
        return jax.tree_util.keystr(path)

    return tuple((name(path), int(np.size(leaf))) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0])


def _first_chain(tree, batched: bool):
    return jax.tree.map(lambda x: np.asarray(x)[0], tree) if batched else jax.tree.map(np.asarray, tree)


def engine_snapshot(state, step_size, num_steps, *, options=None, source: str = "",
                    metric: str = "") -> TuningSnapshot:
    """The tuning of a finished run from its final :class:`EngineState`.

    ``step_size`` and ``num_steps``: the arm in use (the last iteration's, e.g. ``info.step_size[:, -1]``);
    one tuner per chain (``pooled=False``) gives chain 0's GP.  ``options``: the tuning options set.
    ``metric``: an RMHMC run's metric name (``_jax_rmhmc.metric_name``); its snapshot keeps no mass matrix.
    """
    tuner = state.tuner
    batched = np.ndim(tuner.round) > 0
    tuner = _first_chain(tuner, batched)
    grid_shape = tuner.grid_variance.shape
    buffer = tuner.buffer
    occupied = buffer.count > 0

    def unit(arm):
        rows, cols = np.divmod(np.asarray(arm), grid_shape[1])
        return np.stack([rows / max(grid_shape[0] - 1, 1), cols / max(grid_shape[1] - 1, 1)], axis=-1)

    flat = jax.vmap(lambda p: ravel_pytree(p)[0])(state.position)
    da = state.step_size_adaptation
    return TuningSnapshot(
        inverse_mass_matrix=np.ones(flat.shape[-1]) if metric else np.asarray(state.inverse_mass_matrix, float),
        metric=metric,
        step_size=float(np.exp(np.asarray(da.log_step_size_avg))),
        step_size_bounds=tuple(np.asarray(state.box.step_size, float).tolist()),
        num_steps_bounds=tuple(np.asarray(state.box.num_steps).tolist()),
        arm=(float(np.ravel(step_size)[0]), int(np.ravel(num_steps)[0])),
        positions=np.asarray(flat, float),
        gp_arms=unit(buffer.arm[occupied]), gp_rewards=np.asarray(buffer.mean_reward[occupied], float),
        gp_counts=np.asarray(buffer.count[occupied], float), arm_unit=unit(tuner.arm),
        options=_storable(options or {}), source=source,
        coordinates=coordinates(jax.tree.map(lambda x: x[0], state.position)),
        draw_variances=None if metric else _window_variances(state))


def _window_variances(state):
    """The last mass-matrix window's variances of the draws, or None (no window closed)."""
    variances = np.asarray(state.mass_matrix_adaptation.draw_variance, float)
    return variances if np.all(np.isfinite(variances) & (variances > 0)) else None


def _storable(options: dict) -> dict:
    """The options a snapshot can keep as JSON (a callable objective is left out)."""
    return {name: (list(value) if isinstance(value, tuple) else value) for name, value in options.items()
            if not callable(value)}


def _split_data(data):
    """``(arrays, rebuild)``: the array leaves of ``data`` (traced in the check) and a :class:`_Rebuild` that puts
    them back among its other leaves (kept static: Python numbers, strings, callables)."""
    leaves, treedef = jax.tree.flatten(data)
    is_array = tuple(isinstance(leaf, (np.ndarray, jax.Array)) and np.ndim(leaf) > 0 for leaf in leaves)
    static = tuple(None if a else leaf for leaf, a in zip(leaves, is_array))
    return [leaf for leaf, a in zip(leaves, is_array) if a], _Rebuild(treedef, static, is_array)


@dataclasses.dataclass(frozen=True)
class _Rebuild:
    """``data``'s tree from its array leaves (its other leaves kept); hashable when they are, so that the
    check's program is compiled once for every refit of the same shapes (:func:`_check_program`)."""

    treedef: Any
    static_leaves: tuple
    is_array: tuple

    def __call__(self, arrays):
        it = iter(arrays)
        return jax.tree.unflatten(self.treedef, [next(it) if a else leaf
                                                 for leaf, a in zip(self.static_leaves, self.is_array)])


@dataclasses.dataclass(frozen=True)
class _Constant:
    """``make`` of a log density without data arguments: ``make(anything) = logdensity_fn``."""

    logdensity_fn: Callable

    def __call__(self, _):
        return self.logdensity_fn


@dataclasses.dataclass(frozen=True)
class _Unravel:
    """``ravel_pytree``'s unravel for one chain's position, compared by the position's structure (hashable,
    unlike the closure it calls)."""

    treedef: Any
    shapes: tuple
    dtypes: tuple
    unravel: Callable = dataclasses.field(compare=False, hash=False)

    @classmethod
    def of(cls, position, unravel):
        """``unravel``: ``ravel_pytree(position)``'s."""
        leaves, treedef = jax.tree.flatten(position)
        return cls(treedef, tuple(np.shape(x) for x in leaves), tuple(str(jnp.result_type(x)) for x in leaves),
                   unravel)

    def __call__(self, flat):
        return self.unravel(flat)


def _data_of(logdensity_fn):
    """``(make, data)`` for a log density: a ``jax.tree_util.Partial``'s leaves are its data (arguments of the
    check's program), any other function is its own ``make``."""
    if isinstance(logdensity_fn, jax.tree_util.Partial):
        leaves, treedef = jax.tree.flatten(logdensity_fn)
        return _Rebuild(treedef, (None,) * len(leaves), (True,) * len(leaves)), list(leaves)
    return _Constant(logdensity_fn), ()


def _check_program(make: Callable, rebuild: Callable, unravel: Callable, kernel: Callable | None = None,
                   per_chain_data: bool = False):
    """The check's compiled program: ``(keys, starts, eps, L, imm, data arrays) -> (draws, acceptance)``,
    ``CHECK_ITERATIONS`` transitions per chain with ``L_t ~ U{1..L}`` on ``make(rebuild(arrays))``: HMC, or
    ``kernel`` (BlackJAX's kernel signature; an RMHMC run's transition).  ``per_chain_data``: the arrays
    have a leading chain axis, chain ``c`` samples its own data's posterior (``run_chains(chain_data=)``)."""
    kernel = kernel or hmc.build_kernel()

    def one_chain(key, position, eps, max_steps, imm, arrays):
        density = make(rebuild(arrays))
        flat_logdensity = lambda flat: density(unravel(flat))  # noqa: E731

        def body(state, key):
            step_key, length_key = jax.random.split(key)
            steps = jax.random.randint(length_key, (), 1, max_steps + 1)
            state, info = kernel(step_key, state, flat_logdensity, eps, imm, steps)
            return state, (state.position, info.acceptance_rate)

        state = hmc.init(position, flat_logdensity)
        _, (draws, accept) = jax.lax.scan(body, state, jax.random.split(key, CHECK_ITERATIONS))
        return draws, accept

    return jax.jit(jax.vmap(one_chain, in_axes=(0, 0, None, None, None, 0 if per_chain_data else None)))


_cached_check_program = functools.lru_cache(maxsize=8)(_check_program)


def _check_program_for(make, *rest):
    """:func:`_check_program`, compiled once per log density and shapes when ``make`` is one of this module's
    (a plain function or a ``Partial``'s structure, run_chains): other callers' ``make`` is a new function
    per call, whose cached program would only hold on to its compiled code."""
    if not isinstance(make, (_Constant, _Rebuild)):
        return _check_program(make, *rest)
    try:
        return _cached_check_program(make, *rest)
    except TypeError:  # an unhashable static leaf of the data
        return _check_program(make, *rest)


def _check_run(logdensity_fn, snapshot: TuningSnapshot, start, rng_key, unravel, data_logdensity=None,
               kernel=None, per_chain_data=False):
    """``(flat draws (C, n, d), mean acceptance)`` of the check: HMC at the snapshot's arm, ``L_t ~ U{1..L}``.

    The snapshot's values and, with ``data_logdensity = (make, data)`` (``make(data)`` is the log density),
    the data's arrays (or a ``jax.tree_util.Partial`` log density's) are the compiled program's arguments, not
    constants: a refit on new data of the same shapes runs the program compiled before (docs/warm_start.md).
    ``per_chain_data``: the data have a leading chain axis, chain ``c`` checked on ``make(data_c)``.
    """
    eps, max_steps = snapshot.arm
    make, data = data_logdensity if data_logdensity is not None else _data_of(logdensity_fn)
    arrays, rebuild = _split_data(data)
    args = (jax.random.split(rng_key, start.shape[0]), start, jnp.asarray(eps, start.dtype),
            jnp.asarray(max_steps, jnp.int32), jnp.asarray(snapshot.inverse_mass_matrix, start.dtype))
    try:
        draws, accept = _check_program_for(make, rebuild, unravel, kernel, per_chain_data)(*args, arrays)
    except jax.errors.JAXTypeError:  # a model that needs its data concrete (NumPy on it): the data as constants
        if per_chain_data:
            raise
        draws, accept = _check_program(make, lambda _: data, unravel, kernel)(*args, [])
    return np.asarray(draws), float(np.nanmean(np.asarray(accept)))


def prepare_warm_start(logdensity_fn, positions, warm_start, rng_key, *, name: str, fallback: str,
                       first_row: int = 0, data_logdensity=None, kernel=None, metric: str = "",
                       per_chain_data: bool = False):
    """``(snapshot or None, positions, report)`` for a run asked to start from ``warm_start``.

    ``positions`` has a leading chain axis.  The check runs its chains from the snapshot's positions
    (cycled to the chain count, from row ``first_row``); a fitting snapshot returns the check's last positions as the run's
    start.  A failing one warns (:class:`WarmStartWarning`, with the reason and ``fallback``, what the
    caller does instead) and returns ``(None, positions, report)``.  ``data_logdensity``: see :func:`_check_run`.
    ``kernel`` and ``metric``: an RMHMC run's transition kernel and metric name (the snapshot's must match).
    ``per_chain_data``: ``data_logdensity``'s data have a leading chain axis (``run_chains``' ``chain_data``);
    every chain is checked on its own data's posterior and the verdict is one for all.
    """
    snapshot = load_snapshot(warm_start)
    first = jax.tree.map(lambda x: x[0], positions)
    flat0, unravel_fn = ravel_pytree(first)
    unravel = _Unravel.of(first, unravel_fn)
    num_chains = int(np.shape(jax.tree.leaves(positions)[0])[0])
    snapshot, reason = match_coordinates(snapshot, coordinates(first))
    other_metric = None if snapshot is None else check_metric(snapshot, metric)
    if snapshot is None:
        report = FitReport(False, reason)
    elif other_metric is not None:
        report = other_metric
    else:
        rows = (first_row + np.arange(num_chains)) % snapshot.positions.shape[0]
        start = jnp.asarray(snapshot.positions[rows], flat0.dtype if jnp.issubdtype(flat0.dtype, jnp.floating)
                            else jnp.float32)
        if per_chain_data:
            make, data = data_logdensity
            densities = jax.vmap(lambda f, data_c: make(data_c)(unravel(f)))(start, data)
        else:
            densities = jax.vmap(lambda f: logdensity_fn(unravel(f)))(start)
        finite = np.all(np.isfinite(np.asarray(densities)))
        if not finite:
            report = FitReport(False, "the log density is not finite at the snapshot's positions")
        else:
            draws, acceptance = _check_run(logdensity_fn, snapshot, start, rng_key, unravel, data_logdensity,
                                           kernel, per_chain_data)
            report = check_fit(snapshot, draws, acceptance)
    if not report.fits:
        warnings.warn(f"{name}: warm_start not used: {report.reason}. {fallback}", WarmStartWarning, stacklevel=3)
        return None, positions, report
    last = jnp.asarray(draws[:, -1], start.dtype)
    return snapshot, jax.vmap(unravel)(last), report
