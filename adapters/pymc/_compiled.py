"""PyMC models on the compiled JAX engine: ``sample_numpyro_ahmc``, beside PyMC's ``sample_numpyro_nuts``.

``pm.sample(step=AdaptiveHMC())`` runs in PyMC's Python loop, one chain per
process, each chain with its own tuner.  This path instead does what PyMC's
``pymc.sampling.jax.sample_numpyro_nuts`` does with NUTS: it turns the model's
log density into a JAX function (PyTensor's JAX backend), runs ahmc's NumPyro
kernel on it with vectorized chains, so that all chains feed **one pooled
tuner** and the whole loop is compiled, and converts the draws back to the
model's variables (constrained scale, deterministics included) in a DataTree
with PyMC's coordinates and dimensions.

Needs the ``pymc`` and ``numpyro`` extras.  PyMC's own JAX sampling helpers
(``get_jaxified_logp``, ``_get_batched_jittered_initial_points``,
``_postprocess_samples``, ...) do the model plumbing, as they do for
``sample_numpyro_nuts``.
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._extras import require

require("pymc", "pymc")
require("numpyro", "numpyro")
import jax  # noqa: E402
import numpyro  # noqa: E402
from arviz_base import from_dict, make_attrs  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402
from pymc.backends.arviz import coords_and_dims_for_inferencedata, find_constants, find_observations  # noqa: E402
from pymc.model import modelcontext  # noqa: E402
from pymc.sampling import jax as pymc_jax  # noqa: E402
from pymc.stats.convergence import log_warnings, run_convergence_checks  # noqa: E402
from pymc.util import _get_seeds_per_chain, get_default_varnames  # noqa: E402

from ..diagnostics import CONFIG_ATTR, FREE_VARS_ATTR, config_from_numpyro  # noqa: E402
from ..numpyro import TUNER_FIELDS, AdaptiveHMC, AdaptiveRMHMC, tuning_snapshot as _numpyro_snapshot  # noqa: E402
from ._step import refuse_discrete  # noqa: E402

from ahmc.core.snapshot import WarmStartWarning, load_snapshot, match_coordinates  # noqa: E402

from ._snapshot import SNAPSHOT_ATTR, value_coordinates  # noqa: E402

__all__ = ["sample_numpyro_ahmc", "jax_logdensity"]


#: NumPyro kernel field -> PyMC sample-stat name (as PyMC's step methods and ``sample_numpyro_nuts`` name them).
STAT_NAMES = {"num_steps": "n_steps", "accept_prob": "acceptance_rate", "diverging": "diverging",
              "step_size": "step_size", "max_steps": "max_steps", "reward": "reward", "tuning_round": "tuning_round",
              "arm_changed": "arm_changed", "adapt_probability": "adapt_probability", "restarted": "restarted", "retried": "retried",
              "energy": "energy", "fixed_point_converged": "fixed_point_converged",
              "num_gradient_evals": "n_grad_evals"}
EXTRA_FIELDS = ("diverging",) + TUNER_FIELDS
RMHMC_FIELDS = ("fixed_point_converged", "num_gradient_evals")


def jax_logdensity(model=None):
    """The model's log density (unconstrained value variables, a list of arrays in ``model.value_vars`` order)
    as a JAX function, compiled from the PyTensor graph by PyMC's JAX backend."""
    model = modelcontext(model)
    # PyMC's flag reads backwards: the default (negative_logp=True) returns +log p, the NUTS potential is the other.
    return pymc_jax.get_jaxified_logp(model)


def _initial_points(model, chains, initvals, seed, jitter, logdensity_fn):
    """PyMC's jittered start per chain (retried while the log density is not finite); a start that stays
    non-finite raises PyMC's ``SamplingError`` naming the variables (as ``pm.sample`` does)."""
    points = pymc_jax._get_batched_jittered_initial_points(model=model, chains=chains, initvals=initvals,
                                                          random_seed=seed, jitter=jitter, logp_fn=logdensity_fn)
    if chains == 1:
        points = [np.asarray(p)[None] for p in points]
    values = jax.vmap(logdensity_fn)([jax.numpy.asarray(p) for p in points])
    for chain, value in enumerate(np.asarray(values)):
        if not np.isfinite(value):  # without jitter PyMC does not check the start
            point = {v.name: np.asarray(p[chain]) for v, p in zip(model.value_vars, points)}
            model.check_start_vals(point)  # raises SamplingError with the offending variables
            raise ValueError(f"The log density is {value} at chain {chain}'s start; give `initvals` where "
                             "the model is finite (see model.debug()).")
    return points


def _stats(extra: dict, *, chains: int) -> dict[str, np.ndarray]:
    """NumPyro extra fields (chains, draws) -> PyMC-named sample stats; ``lp`` is the model log density."""
    stats = {STAT_NAMES[name]: np.asarray(value).reshape(chains, -1) for name, value in extra.items()
             if name in STAT_NAMES}
    stats["lp"] = -np.asarray(extra["potential_energy"]).reshape(chains, -1)
    return stats


def _to_model_variables(model, var_names, keep_untransformed):
    """Draws of the value variables -> the model's variables, by PyMC's post-processing (built once)."""
    chosen = model.unobserved_value_vars if var_names is None else [
        v for v in model.unobserved_value_vars if v.name in var_names]
    outputs = list(get_default_varnames(chosen, include_transformed=keep_untransformed))
    jax_fn = pymc_jax.get_jaxified_graph(inputs=model.value_vars, outputs=outputs)

    def convert(raw):
        result = pymc_jax._postprocess_samples(jax_fn, raw, postprocessing_vectorize="vmap")
        return {v.name: np.asarray(r) for v, r in zip(outputs, result)}

    return convert


def _root_attrs(mcmc, model, riemannian: bool) -> dict:
    """The DataTree's root attributes: the tuning configuration, the free variables and the tuning snapshot."""
    # The free variables: the correlation hint of the tuning summary should not pair a variable with
    # its own deterministic transform.
    attrs = {CONFIG_ATTR: config_from_numpyro(mcmc).to_json(),
             FREE_VARS_ATTR: json.dumps([rv.name for rv in model.free_RVs])}
    if not riemannian:
        # named by the model's value variables (the kernel's list position has no names)
        snapshot = _numpyro_snapshot(mcmc)
        attrs[SNAPSHOT_ATTR] = dataclasses.replace(
            snapshot, coordinates=value_coordinates(model, model.value_vars)).to_json()
    return attrs


def _check_arguments(model, **counts) -> None:
    """Errors for a model this route cannot sample and for bad ``draws``, ``tune``, ``chains``."""
    refuse_discrete(model.value_vars, "sample_numpyro_ahmc",
                    "Marginalize them out (pymc_extras.marginalize), or use pm.sample(step=[AdaptiveHMC(vars=...), "
                    "pm.Metropolis(vars=...)]) with a compound step.")
    if not model.value_vars:
        raise ValueError("The model has no free variables to sample.")
    for name, value in counts.items():
        if int(value) != value or value < (0 if name == "tune" else 1):
            raise ValueError(f"`{name}` must be a {'non-negative' if name == 'tune' else 'positive'} integer, "
                             f"got {value!r}.")


def _in_model_order(warm_start, model):
    """The snapshot in the model's value-variable order, unnamed (the kernel's position is a list in that
    order), or None after a ``WarmStartWarning`` when it holds another model's variables."""
    snapshot, reason = match_coordinates(load_snapshot(warm_start), value_coordinates(model, model.value_vars))
    if snapshot is None:
        warnings.warn(f"sample_numpyro_ahmc: warm_start not used: {reason}. The warm-up runs cold; give tune=1000.",
                      WarmStartWarning, stacklevel=3)
        return None
    return dataclasses.replace(snapshot, coordinates=())


def _collected(mcmc, lower=0, upper=None):
    """The run's kept iterations ``lower:upper``: ``(samples, extra fields)``, each ``(chains, draws, ...)``."""
    def window(tree):
        return jax.tree.map(lambda x: x[:, lower:upper], tree)
    return window(mcmc.get_samples(group_by_chain=True)), window(mcmc.get_extra_fields(group_by_chain=True))


def _run(mcmc, keys, init_params, fields, keep_warmup: bool):
    """Warm-up and draws in one compiled loop, as ``sample_numpyro_nuts`` runs NUTS: ``(warm-up, draws)``, each
    ``(samples, extra fields)`` (warm-up ``None`` unless ``keep_warmup``).

    NumPyro's public API keeps warm-up draws only through ``MCMC.warmup``, a loop compiled apart from
    ``run``'s (on Pima the whole call took 19.9 s that way, 12.4 s in one loop). So the warm-up is kept by
    stretching MCMC's collection window over the whole run: the window ``MCMC.warmup(collect_warmup=True)``
    sets, through NumPyro's private ``_set_collection_params``; without it, warm-up then run (the same draws).
    """
    if not keep_warmup:
        mcmc.run(keys, init_params=init_params, extra_fields=fields)
        return None, _collected(mcmc)
    tune = mcmc.num_warmup
    if not hasattr(mcmc, "_set_collection_params"):
        return _warmup_then_run(mcmc, keys, init_params, fields)
    total = tune + mcmc.num_samples
    mcmc._set_collection_params(0, total, total, "sample")
    mcmc.run(keys, init_params=init_params, extra_fields=fields)
    return _collected(mcmc, 0, tune), _collected(mcmc, tune)


def _warmup_then_run(mcmc, keys, init_params, fields):
    """NumPyro's public route to the warm-up's draws: ``MCMC.warmup`` then ``MCMC.run``, two compiled loops."""
    mcmc.warmup(keys, init_params=init_params, extra_fields=fields, collect_warmup=True)
    warm = _collected(mcmc)
    mcmc.run(mcmc.post_warmup_state.rng_key, extra_fields=fields)
    return warm, _collected(mcmc)


def sample_numpyro_ahmc(
    draws: int = 1000,
    *,
    tune: int = 1000,
    chains: int = 4,
    random_seed: Any = None,
    initvals: Any = None,
    jitter: bool = True,
    model=None,
    var_names: Sequence[str] | None = None,
    progressbar: bool = True,
    quiet: bool = False,
    keep_untransformed: bool = False,
    discard_tuned_samples: bool = True,
    compute_convergence_checks: bool = True,
    riemannian: bool = False,
    **options,
):
    """Sample a PyMC model with ahmc's AdaptiveHMC on NumPyro, all chains vectorized with one pooled tuner.

    The arguments are those of ``pymc.sampling.jax.sample_numpyro_nuts`` (``draws``, ``tune``,
    ``chains``, ``random_seed``, ``initvals``, ``jitter``, ``model``, ``var_names``, ``progressbar``,
    ``quiet``, ``keep_untransformed``, ``compute_convergence_checks``) plus ``discard_tuned_samples``
    (``False`` keeps the warm-up draws and stats as ``warmup_posterior`` / ``warmup_sample_stats``: most
    GP rounds happen there, so keep them to rebuild the tuning history).  Every other keyword is a
    tuning knob of :class:`ahmc.adapters.numpyro.AdaptiveHMC` (``step_size_bounds``,
    ``num_steps_bounds``, ``dense_mass``, ``objective``, ``freeze_after``, ...), with its defaults.

    ``riemannian=True`` runs :class:`ahmc.adapters.numpyro.AdaptiveRMHMC` instead (adaptive
    Riemann-manifold HMC; its knobs ``metric``, ``softabs_alpha``, ``fixed_point_tolerance``,
    ``max_fixed_point_iterations``).  A callable ``metric`` receives the flat unconstrained position:
    the value variables (``model.value_vars``, e.g. ``sigma_log__``) raveled in model order.  The
    stats then add ``fixed_point_converged`` and ``n_grad_evals`` (gradients plus metric evaluations).

    Returns a DataTree: ``posterior`` (the model's variables), ``sample_stats`` with PyMC's names
    (``step_size``, ``n_steps``, ``acceptance_rate``, ``diverging``, ``energy``, ``lp``) and the
    tuner's (``max_steps``, ``reward``, ``tuning_round``, ``arm_changed``, ``adapt_probability``,
    ``restarted``), ``observed_data`` / ``constant_data``, and the attribute ``ahmc_config`` (search
    box and GP settings) that :func:`ahmc.adapters.diagnostics.history_from_datatree` reads, and
    ``ahmc_tuning_snapshot``: the run's tuning, which :func:`tuning_snapshot` reads for the next fit's
    ``warm_start=`` (docs/warm_start.md).

    Examples
    --------
    >>> with model:                                            # doctest: +SKIP
    ...     idata = sample_numpyro_ahmc(draws=1000, tune=1000, chains=4, random_seed=1)
    """
    model = modelcontext(model)
    _check_arguments(model, draws=draws, tune=tune, chains=chains)
    if options.get("warm_start") is not None:
        options["warm_start"] = _in_model_order(options["warm_start"], model)
    logdensity_fn = jax_logdensity(model)
    kernel_class = AdaptiveRMHMC if riemannian else AdaptiveHMC
    kernel = kernel_class(potential_fn=lambda position: -logdensity_fn(position), **options)
    fields = EXTRA_FIELDS + (RMHMC_FIELDS if riemannian else ())
    (seed,) = _get_seeds_per_chain(random_seed, 1)
    points = _initial_points(model, chains, initvals, seed, jitter, logdensity_fn)
    # One chain: NumPyro's single-chain mode (an unbatched key and start), else the kernel sees a batch of one.
    init_params = [jax.numpy.asarray(p if chains > 1 else p[0]) for p in points]

    mcmc = MCMC(kernel, num_warmup=int(tune), num_samples=int(draws), num_chains=int(chains),
                chain_method="vectorized", progress_bar=progressbar and not quiet)
    keys = jax.random.key(int(seed))
    keys = jax.random.split(keys, int(chains)) if chains > 1 else keys
    to_model_variables = _to_model_variables(model, var_names, keep_untransformed)
    groups: dict[str, Any] = {}
    start = time.perf_counter()
    keep_warmup = bool(tune) and not discard_tuned_samples
    warm, (samples, extra) = _run(mcmc, keys, init_params, fields, keep_warmup=keep_warmup)
    elapsed = time.perf_counter() - start

    if warm is not None:
        groups["warmup_posterior"] = to_model_variables(warm[0])
        groups["warmup_sample_stats"] = _stats(warm[1], chains=chains)
    groups["posterior"] = to_model_variables(samples)
    groups["sample_stats"] = _stats(extra, chains=chains)
    observed, constant = find_observations(model), find_constants(model)
    if observed:
        groups["observed_data"] = observed
    if constant:
        groups["constant_data"] = constant
    coords, dims = coords_and_dims_for_inferencedata(model)
    root_attrs = _root_attrs(mcmc, model, riemannian)
    # sampling_time includes JAX's compilation of the warm-up and sampling loops, as in sample_numpyro_nuts.
    posterior_attrs = make_attrs({"sampling_time": elapsed, "tuning_steps": int(tune),
                                  "sampler": f"ahmc.adapters.numpyro.{kernel_class.__name__}"},
                                 inference_library=numpyro)
    tree = from_dict(groups, coords=coords, dims=dims, sample_dims=["chain", "draw"], save_warmup=True,
                     attrs={"/": root_attrs, "posterior": posterior_attrs,
                            "sample_stats": {CONFIG_ATTR: root_attrs[CONFIG_ATTR]}})
    if compute_convergence_checks:
        warnings_ = run_convergence_checks(tree, model)
        if not quiet:
            log_warnings(warnings_)
    return tree
