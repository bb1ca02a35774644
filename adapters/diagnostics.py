"""Tuning history from any adapter's output: an ArviZ DataTree (PyMC, NumPyro) or BlackJAX's info.

Import-light: nothing from a framework at module level.  A DataTree is read
by duck typing (``tree["sample_stats"]``, ``.data_vars``, ``.dims``,
``.attrs``), so xarray's DataTree and ArviZ's older InferenceData both work.
JAX is imported only by :func:`config_from_engine`, :func:`config_from_numpyro` and (given
``samples``) :func:`history_from_blackjax`.

Warm-up draws hold most GP rounds, so keep them: PyMC with
``pm.sample(..., discard_tuned_samples=False)``; NumPyro with
``mcmc.warmup(key, ..., collect_warmup=True)`` converted separately and stored
as the ``warmup_sample_stats`` group (see docs/diagnostics.md).  Rebuilding the
surrogate also needs a :class:`~ahmc.core.diagnostics.TuningConfig`: from the
``config`` argument, else the JSON attribute ``ahmc_config`` (root,
``sample_stats`` or ``warmup_sample_stats``); per-draw stats of the box, when
present, give each chain's search box (at its last draw): ``step_size_bounds``
/ ``num_steps_bounds`` (last axis ``(lo, hi)``) or, as the PyMC step records
them, ``step_size_min``, ``step_size_max``, ``max_steps_min``, ``max_steps_max`` (and the grid's
``L`` columns, ``num_num_steps`` and ``log_num_steps``).
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Mapping

import numpy as np

from ahmc.core import Config
from ahmc.core.config import GPConfig, resolve_options
from ahmc.core.mass_matrix import recipe_for_dimension, resolve_metric_recipe
from ahmc.core.diagnostics import (TuningConfig, TuningHistory, arm_parameters, strongest_correlation, tuning_history,
                                   varying_coordinates)

__all__ = ["history_from_datatree", "history_from_numpyro", "history_from_blackjax", "config_from_engine",
           "config_from_numpyro", "slowest_square", "worst_rhat"]

CONFIG_ATTR = "ahmc_config"
#: JSON list of the sampled variables (not deterministics): the correlation hint looks at these only.
FREE_VARS_ATTR = "ahmc_free_vars"
BOX_STATS = {"step_size_bounds": "step_size", "num_steps_bounds": "num_steps"}  # last axis: (lo, hi)
# Defaults shared by the adapters (ahmc.adapters._jax_engine.build_engine and ahmc.adapters.pymc.AdaptiveHMC).
ADAPTER_DEFAULTS = {"num_step_sizes": Config().box.num_step_sizes, "capacity": Config().gp.capacity,
                    "alpha": Config().gp.alpha,  # where the adapters' Config differs from core's gp_ucb
                    "initial_design": Config().gp.initial_design}  # 0 in trees made before 2026-12-08
# ahmc.adapters.pymc.AdaptiveHMC's per-chain tuner scores one chain's round, a noisier reward than the
# engine's pooled one (AdaptiveRMHMC keeps the shared 0.1).  Its trees have the PyMC box stats and no
# RMHMC stats (AdaptiveRMHMC with a constant metric is AdaptiveHMC: pass its config to replay it).
PYMC_HMC_DEFAULTS = {**ADAPTER_DEFAULTS, "noise_variance": GPConfig().resolved_noise_variance(one_chain_rounds=True)}
RMHMC_STAT = "fixed_point_converged"
# Options of the JAX RMHMC transition (ahmc.adapters._jax_rmhmc.build_rmhmc_engine), not of the tuner.
RMHMC_OPTIONS = ("metric", "softabs_alpha", "fixed_point_tolerance", "max_fixed_point_iterations", "integrator")
# The PyMC step's L columns (since 2026-12-06; older trees have every integer of the box).
COLUMN_STATS = ("num_num_steps", "log_num_steps")
SCALAR_BOX_STATS = {"step_size": ("step_size_min", "step_size_max"), "num_steps": ("max_steps_min", "max_steps_max")}


def _child(tree, name):
    try:
        return tree[name]
    except (KeyError, AttributeError, TypeError):
        return None


def _chain_draw(array) -> np.ndarray | None:
    """Values of a DataArray with dims (chain, draw, ...) in that order; None without both dims."""
    dims = tuple(getattr(array, "dims", ()))
    if "chain" not in dims or "draw" not in dims:
        return None
    rest = [d for d in dims if d not in ("chain", "draw")]
    return np.asarray(array.transpose("chain", "draw", *rest).values)


def _attr(name, *nodes):
    for node in nodes:
        attrs = getattr(node, "attrs", None) or {}
        if name in attrs:
            return attrs[name]
    return None


def _config_attr(*nodes):
    return _attr(CONFIG_ATTR, *nodes)


def recorded_columns(stats) -> dict:
    """``num_num_steps`` and ``log_num_steps`` as the PyMC step records them per draw (one setting for the
    whole run: chain 0's last draw), as keyword arguments of ``search_space``; ``{}`` for trees before
    2026-12-06, whose grid has every integer of the box."""
    columns = {}
    if "num_num_steps" in stats:
        columns["num_num_steps"] = int(np.asarray(stats["num_num_steps"])[0, -1]) or None  # 0: every integer
    if "log_num_steps" in stats:
        columns["log_num_steps"] = bool(np.asarray(stats["log_num_steps"])[0, -1])
    return columns


def _with_box(config, stats: dict):
    """Fill in the config's search box from per-draw box stats (removed from ``stats``) if it has none."""
    pymc_hmc = all(name in stats for name in SCALAR_BOX_STATS["step_size"]) and RMHMC_STAT not in stats
    for field, (low, high) in SCALAR_BOX_STATS.items():  # PyMC: one scalar stat per end
        if low in stats and high in stats:
            stats[f"{field}_pair"] = np.stack([stats.pop(low), stats.pop(high)], axis=-1)
    names = {**BOX_STATS, **{f"{field}_pair": field for field in SCALAR_BOX_STATS}}
    boxes = {field: stats.pop(name) for name, field in names.items() if name in stats}
    columns = recorded_columns(stats)  # PyMC: the box's L columns
    for name in COLUMN_STATS:
        stats.pop(name, None)
    base = TuningConfig.parse(config)
    if not boxes or (base is not None and base.step_size is not None and base.num_steps is not None):
        return base
    if len(boxes) != 2:
        raise ValueError(f"Give per-draw box stats for both the step size and L, or neither; got {sorted(boxes)}.")
    box = {}
    for field, values in boxes.items():  # (chains, draws, 2): each chain's box at its last draw
        last = np.asarray(values)[:, -1, :].astype(float if field == "step_size" else int)
        box[field] = last[0].tolist() if np.all(last == last[0]) else last.tolist()
    box.update(columns)
    if base is not None:
        return base._replace(**box)
    # No recorded config: the defaults of the adapter that made the tree.
    return TuningConfig(**box, **(PYMC_HMC_DEFAULTS if pymc_hmc else ADAPTER_DEFAULTS))


def history_from_datatree(tree, *, config=None, names: Mapping | None = None,
                          var_names=None) -> TuningHistory:
    """Tuning history of a PyMC or NumPyro run from its DataTree.

    Reads ``warmup_sample_stats`` (if present, flagged as warm-up) followed by
    ``sample_stats``.  ``config`` (a TuningConfig, dict or JSON) overrides the
    ``ahmc_config`` attribute; ``names`` maps canonical fields to stat names
    (see :func:`ahmc.core.diagnostics.tuning_history`).  ``var_names``: the posterior variables the
    correlation and variance hints look at (default: the JSON attribute ``ahmc_free_vars`` if present, else,
    inside a PyMC model's ``with`` block, its free variables, else all: a ``pm.Deterministic`` of a sampled
    variable would otherwise be reported as a strong posterior correlation).

    Examples
    --------
    >>> history = history_from_datatree(arviz_base.from_numpyro(mcmc))  # doctest: +SKIP
    >>> print(tuning_summary(history))                                   # doctest: +SKIP
    """
    warm, main = _child(tree, "warmup_sample_stats"), _child(tree, "sample_stats")
    parts = [(node, flag) for node, flag in ((warm, True), (main, False)) if node is not None]
    if not parts:
        raise ValueError("The DataTree has neither a 'sample_stats' nor a 'warmup_sample_stats' group.")
    common = set.intersection(*(set(node.data_vars) for node, _ in parts))
    stats, flags = {}, None
    for name in sorted(common):
        arrays = [_chain_draw(node[name]) for node, _ in parts]
        if any(a is None for a in arrays) or (arrays[0].ndim > 2 and name not in BOX_STATS):
            continue
        stats[name] = np.concatenate(arrays, axis=1)
        if flags is None:
            flags = np.concatenate([np.full(a.shape[:2], flag) for a, (_, flag) in zip(arrays, parts)], axis=1)
    if warm is None:
        flags = None  # no warm-up group: use the stats' own flag (PyMC's `tune`), if any
    config = config if config is not None else _config_attr(tree, main, warm)
    config = _with_box(config, stats)
    history = tuning_history(stats, config=config, names=names, is_warmup=flags)
    if var_names is None:
        free = _attr(FREE_VARS_ATTR, tree, main, _child(tree, "posterior"))
        var_names = json.loads(free) if free is not None else _free_variables_in_model_context()
    return _with_draws(history, stats, _posterior_columns(_child(tree, "posterior"), var_names))


def _free_variables_in_model_context():
    """The free variables of the PyMC model whose ``with`` block we are in (None outside one, or without
    PyMC): ``pm.sample``'s DataTree does not say which posterior variables are ``pm.Deterministic``s."""
    import sys

    if "pymc" not in sys.modules:
        return None
    pymc = sys.modules["pymc"]
    try:
        model = pymc.modelcontext(None)
    except TypeError:  # no model on the context stack
        return None
    return [rv.name for rv in model.free_RVs]


def _with_draws(history: TuningHistory, stats, columns) -> TuningHistory:
    """The history with what the draws ``columns = (chains x draws x d array, names)`` say: the slowest
    square, the worst R-hat, and the strongest correlation unless the metric is position-dependent (no mass
    matrix to suggest)."""
    if columns is None:
        return history
    draws, names = columns
    history = history._replace(slowest_square=slowest_square(draws, names), worst_rhat=worst_rhat(draws, names))
    config = history.config
    if config is not None and config.metric_recipe == "default":  # resolved by the dimension, known now
        recipe = recipe_for_dimension(config.metric_recipe, np.asarray(draws).shape[-1])
        history = history._replace(config=config._replace(metric_recipe=recipe))
    if _riemannian(stats):
        return history
    return history._replace(strongest_correlation=strongest_correlation(draws, names))


def slowest_square(draws, names=None):
    """``(ess_square, name, ess_coordinates, num_draws)`` of ``draws`` (chains, draws, d): the smallest
    bulk ESS (ArviZ's) of a coordinate's centred square, that coordinate's name (default ``x[i]``), the
    smallest bulk ESS of the coordinates and the number of draws.  Non-finite and constant coordinates
    are skipped; None without ``arviz_stats``, with fewer than 4 draws per chain or no varying coordinate.
    """
    found = _arviz_and_columns("ess", draws, names, min_chains=1)
    if found is None:
        return None
    ess, draws, names = found
    squares = (draws - draws.mean(axis=(0, 1))) ** 2
    ess_squares = np.asarray(ess(squares, method="bulk"), dtype=np.float64)
    ess_coordinates = np.asarray(ess(draws, method="bulk"), dtype=np.float64)
    slowest = int(np.argmin(ess_squares))
    return float(ess_squares[slowest]), names[slowest], float(ess_coordinates.min()), draws.shape[0] * draws.shape[1]


def _arviz_and_columns(function: str, draws, names, *, min_chains: int):
    """``(arviz_stats.<function>, draws, names)``, the draws (chains, draws, d) as float64 cut to their finite,
    non-constant coordinates (names default ``x[i]``); None without ``arviz_stats`` (the blackjax extra alone
    does not install ArviZ), with fewer than ``min_chains`` chains, 4 draws per chain or such coordinates."""
    try:
        import arviz_stats
    except ImportError:
        return None
    draws = np.asarray(draws, dtype=np.float64)
    num_chains, num_draws, dim = draws.shape
    names = [f"x[{i}]" for i in range(dim)] if names is None else list(names)
    keep = varying_coordinates(draws)
    if num_chains < min_chains or num_draws < 4 or not len(keep):
        return None
    return getattr(arviz_stats, function), draws[..., keep], [names[i] for i in keep]


def worst_rhat(draws, names=None):
    """``(rhat, name, num_chains)`` of ``draws`` (chains, draws, d): the largest rank-normalised split R-hat
    (ArviZ's) over the coordinates and that coordinate's name (default ``x[i]``).  A coordinate constant
    within each chain but not across them has an R-hat of inf or near it.  Non-finite and constant coordinates
    are skipped; None without ``arviz_stats``, with one chain, fewer than 4 draws per chain or no varying
    coordinate.
    """
    found = _arviz_and_columns("rhat", draws, names, min_chains=2)
    if found is None:
        return None
    rhat, draws, names = found
    with np.errstate(divide="ignore", invalid="ignore"):  # zero variance within every chain: inf
        values = np.asarray(rhat(draws, method="rank"), dtype=np.float64)
    values = np.where(np.isnan(values), -np.inf, values)
    worst = int(np.argmax(values))
    return float(values[worst]), names[worst], draws.shape[0]


def _posterior_columns(posterior, var_names=None):
    """``(chains x draws x d array, names)`` of a DataTree posterior group's numeric variables in
    ``var_names`` (default all), flattened; None without a posterior or such variables."""
    if posterior is None:
        return None
    columns, names = [], []
    for name, variable in posterior.data_vars.items():
        if var_names is not None and name not in var_names:
            continue
        values = _chain_draw(variable)
        if values is None or not np.issubdtype(values.dtype, np.number):
            continue
        flat = values.reshape(values.shape[0], values.shape[1], -1)
        shape = values.shape[2:]
        columns.append(flat)
        names += [name if not shape else f"{name}[{', '.join(map(str, np.unravel_index(i, shape)))}]"
                  for i in range(flat.shape[-1])]
    if not columns:
        return None
    return np.concatenate(columns, axis=-1), names


def history_from_blackjax(info, *, config=None, names: Mapping | None = None, search_box=None, samples=None,
                          **options) -> TuningHistory:
    """Tuning history of a BlackJAX run.

    ``info`` is the ``GPUCBAdaptationInfo`` of ``gpucb_adaptation(...).run`` (it carries the search
    box; fields ``(iterations, chains)`` as BlackJAX's ensemble adaptations give them) or the
    ``EngineInfo`` of ``run_chains`` (fields ``(chains, iterations)``, as its samples; per-step
    infos of ``adaptive_hmc``: stack them with ``axis=1``,
    ``jax.tree.map(lambda *x: jnp.stack(x, 1), *infos)``).  The
    surrogate needs ``config``, or the box (``info.search_box`` or
    ``search_box=``) plus the ``options`` the run was given (GP settings,
    ``num_step_sizes``, ...), resolved as in :func:`config_from_engine`.
    ``samples`` (optional): the draws, a position pytree with leading axes ``(chains, draws)``
    as :func:`ahmc.adapters.blackjax.run_chains` returns them; the history then holds their
    strongest correlation and slowest square (the summary's hints on ``dense_mass`` and variances).
    """
    engine_info = getattr(info, "info", info)
    time_first = engine_info is not info  # GPUCBAdaptationInfo: BlackJAX's (iterations, chains)
    search_box = getattr(info, "search_box", None) if search_box is None else search_box
    fields = engine_info._asdict() if hasattr(engine_info, "_asdict") else dict(engine_info)
    stats = {}
    for name, value in fields.items():
        value = np.asarray(value)
        stats[name] = value.T if (time_first and value.ndim == 2) else value  # -> (chains, iterations)
    if config is None and search_box is not None:
        config = config_from_engine(search_box, **options)
    final_arm = None
    tuner_state = getattr(info, "tuner_state", None)
    if tuner_state is not None and config is not None:  # the arm after the last update (e.g. the exploit move)
        arms = np.atleast_1d(np.asarray(tuner_state.arm))
        final_arm = tuple(np.array(v) for v in zip(*(arm_parameters(config, a) for a in arms)))
    history = tuning_history(stats, config=config, names=names, final_arm=final_arm)
    return _with_draws(history, stats, None if samples is None else _samples_columns(samples))


def _riemannian(stats) -> bool:
    """An RMHMC run: its stats say whether the implicit solves converged, and (the JAX engine, whose
    info always has that field) its cost counts metric evaluations beyond the leapfrog steps."""
    if RMHMC_STAT not in stats:
        return False
    if "num_gradient_evals" in stats and "num_integration_steps" in stats:
        return not np.array_equal(stats["num_gradient_evals"], stats["num_integration_steps"])
    return True


def _samples_columns(samples):
    """``(chains x draws x d array, names)`` of a position pytree with leading axes (chains, draws); leaves
    flattened in ``jax.tree_util`` order, named ``x[i]`` over the flattened position."""
    import jax  # samples are a JAX pytree

    leaves = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(samples)]
    if not leaves:
        return None
    flat = np.concatenate([leaf.reshape(leaf.shape[0], leaf.shape[1], -1) for leaf in leaves], axis=-1)
    return flat, [f"x[{i}]" for i in range(flat.shape[-1])]


def config_from_engine(search_box, *, paper_preset: bool = False, **options) -> TuningConfig:
    """The TuningConfig of a JAX-engine run (NumPyro or BlackJAX adapter).

    ``search_box`` is the engine's ``SearchBox`` (``state.box``,
    ``GPUCBAdaptationInfo.search_box``) or ``(step_size, num_steps)`` pairs;
    ``options`` are the keyword arguments the run was built with (defaults are
    read from :func:`ahmc.adapters._jax_engine.build_engine`).
    """
    from ._jax_engine import build_engine  # JAX, only here

    tuning, execution = resolve_options({**options, "paper_preset": paper_preset}, "config_from_engine")
    options = {**tuning, **execution}
    # An RMHMC run (AdaptiveRMHMC) adds transition options the tuner does not see; its engine has no mass matrix.
    rmhmc = {name: options[name] for name in RMHMC_OPTIONS if name in options}
    options = {name: value for name, value in options.items() if name not in rmhmc}
    if rmhmc:
        options["adapt_mass_matrix"] = False
    defaults = {name: p.default for name, p in inspect.signature(build_engine).parameters.items()
                if p.default is not inspect.Parameter.empty}
    engine = build_engine(lambda x: -0.5 * (x * x).sum(), num_warmup=1000, **options)
    space = engine.tuner.space

    def get(name):
        return options.get(name, defaults.get(name))

    step_size, num_steps = (np.asarray(v) for v in search_box)
    return TuningConfig(
        step_size=step_size.tolist(), num_steps=num_steps.astype(int).tolist(),
        num_step_sizes=int(get("num_step_sizes")),
        num_num_steps=int(space.shape[1]) if engine.config.auto_box else None,
        log_num_steps=bool(engine.config.log_num_steps),
        log_step_size=bool(space.log_step_size or engine.config.auto_box),
        initial_arm=int(engine.tuner.init().arm),
        capacity=int(get("capacity")), lengthscale=float(get("lengthscale")),
        noise_variance=GPConfig(noise_variance=get("noise_variance")).resolved_noise_variance(one_chain_rounds=False), alpha=float(get("alpha")), delta=float(get("delta")),
        initial_design=int(get("initial_design")), schedule=str(get("schedule")), k=options.get("k"), decay=float(get("decay")),
        dense_mass="auto" if isinstance(get("dense_mass"), str) else bool(get("dense_mass")),
        metric_recipe=resolve_metric_recipe(get("metric_recipe"), get("dense_mass"), get("adapt_mass_matrix"))[0],
    )


def history_from_numpyro(mcmc: Any, *, warmup=None, var_names=None) -> TuningHistory:
    """Tuning history of ``MCMC(AdaptiveHMC(...))`` after ``run``, in one call.

    ``warmup``: the DataTree of the warm-up, ``arviz.from_numpyro(mcmc)`` taken after
    ``mcmc.warmup(key, ..., collect_warmup=True)`` and before ``mcmc.run``; without it the report
    covers the sampling phase and says that the warm-up, where most GP rounds are, was not recorded.

    Examples
    --------
    >>> mcmc.warmup(key, *data, collect_warmup=True)                 # doctest: +SKIP
    >>> warmup = arviz.from_numpyro(mcmc)                            # doctest: +SKIP
    >>> mcmc.run(mcmc.post_warmup_state.rng_key, *data)              # doctest: +SKIP
    >>> print(tuning_summary(history_from_numpyro(mcmc, warmup=warmup)))  # doctest: +SKIP
    """
    import arviz_base

    tree = arviz_base.from_numpyro(mcmc)
    if warmup is not None:
        stats = _child(warmup, "sample_stats")
        if stats is None:
            raise ValueError("warmup must be the DataTree of arviz.from_numpyro(mcmc) taken after "
                             "mcmc.warmup(..., collect_warmup=True); it has no sample_stats group.")
        tree["warmup_sample_stats"] = stats
    return history_from_datatree(tree, config=config_from_numpyro(mcmc), var_names=var_names)


def config_from_numpyro(mcmc: Any) -> TuningConfig:
    """The TuningConfig of ``MCMC(AdaptiveHMC(...))`` after ``run`` (box from ``mcmc.last_state``)."""
    kernel = mcmc.sampler
    options = getattr(kernel, "options", None) or getattr(kernel, "_options", {})
    return config_from_engine(mcmc.last_state.engine.box, **options)
