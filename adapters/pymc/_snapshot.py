"""Tuning snapshots of PyMC runs, for the next fit's ``warm_start=`` (docs/warm_start.md).

:func:`tuning_snapshot` reads one off the DataTree of either route: ``sample_numpyro_ahmc`` keeps its
snapshot as a JSON attribute; ``pm.sample(step=AdaptiveHMC())`` keeps what a snapshot needs in its
per-draw stats (each round's arm and reward, the search box, the warm-up's step size) and its draws,
whose variance in the model's unconstrained coordinates is the mass matrix the next fit starts from.
No JAX here: the step route stays free of it.
"""

from __future__ import annotations

import numpy as np
import pytensor
from pymc.model import modelcontext
from pytensor.graph.replace import clone_replace

from ahmc.core.config import Config
from ahmc.core.snapshot import TuningSnapshot, metric_name
from ahmc.core.space import search_space

from ..diagnostics import recorded_columns

__all__ = ["tuning_snapshot", "value_coordinates", "SNAPSHOT_ATTR"]

#: The DataTree attribute that keeps the compiled route's tuning snapshot (JSON).
SNAPSHOT_ATTR = "ahmc_tuning_snapshot"


def value_coordinates(model, value_vars) -> tuple:
    """The ``(name, size)`` blocks of the step's flat coordinates: its value variables in order."""
    point = model.initial_point()
    return tuple((var.name, int(np.size(point[var.name]))) for var in value_vars)


def _to_unconstrained(model, value_vars):
    """``(function, names)``: the function maps the free variables' values (``names``, as in the
    posterior) to the value variables' (``sigma`` to ``sigma_log__``), each transform applied forward."""
    free = list(model.free_RVs)
    inputs = [rv.type() for rv in free]  # every free variable: a transform's bounds may depend on another
    outputs = []
    for var in value_vars:
        rv = model.values_to_rvs[var]
        transform = model.rvs_to_transforms.get(rv)
        outputs.append(rv if transform is None else transform.forward(rv, *rv.owner.inputs))
    outputs = clone_replace(outputs, replace=dict(zip(free, inputs)))
    return pytensor.function(inputs, outputs, on_unused_input="ignore"), [rv.name for rv in free]


def _flat_draws(tree, model, value_vars) -> np.ndarray:
    """The posterior's draws in the step's flat unconstrained coordinates, ``(chains, draws, d)``."""
    posterior = tree["posterior"]
    function, names = _to_unconstrained(model, value_vars)
    missing = [name for name in names if name not in posterior]
    if missing:
        raise ValueError(f"tuning_snapshot: the posterior lacks {missing}; sample every free variable "
                         "(no var_names=) to take a snapshot.")
    values = [np.asarray(posterior[name]) for name in names]
    chains, draws = values[0].shape[:2]
    flat = np.empty((chains, draws, sum(size for _, size in value_coordinates(model, value_vars))))
    for c in range(chains):
        for t in range(draws):
            outputs = function(*[v[c, t] for v in values])
            flat[c, t] = np.concatenate([np.ravel(o) for o in outputs])
    return flat


def _round_evidence(tree, space) -> tuple:
    """``(unit arms (n, 2), mean rewards, counts)`` of chain 0's rounds (one tuner per chain), in tune too
    when the DataTree kept it (``discard_tuned_samples=False``)."""
    groups = [tree[name] for name in ("warmup_sample_stats", "sample_stats") if name in tree.children]

    def chain0(name):
        return np.concatenate([np.asarray(group[name])[0] for group in groups])

    rewards = chain0("reward")
    rounds = np.isfinite(rewards)
    steps, lengths = chain0("step_size")[rounds], chain0("max_steps")[rounds]
    num_l = len(space.num_steps)
    totals: dict[int, list[float]] = {}
    for eps, length, reward in zip(steps, lengths, rewards[rounds]):
        total = totals.setdefault(space.arm_index(float(eps), int(length)), [0.0, 0.0])
        total[0] += reward
        total[1] += 1.0
    index = np.array(list(totals), dtype=int)
    units = np.stack([space.step_size_unit[index // num_l], space.num_steps_unit[index % num_l]], axis=-1)
    counts = np.array([count for _, count in totals.values()])
    means = np.array([total / count for total, count in totals.values()])
    return units.reshape(-1, 2), means, counts


def _step_snapshot(tree, model, metric=None) -> TuningSnapshot:
    """A snapshot from a ``pm.sample(step=AdaptiveHMC())`` DataTree (its stats and draws); an
    ``AdaptiveRMHMC`` run's (its ``fixed_point_converged`` stat) keeps ``metric``'s name and no mass matrix."""
    stats = tree["sample_stats"] if "sample_stats" in tree.children else {}
    needed = ("reward", "step_size", "max_steps", "step_size_bar", "step_size_min", "step_size_max",
              "max_steps_min", "max_steps_max", "dense_mass_matrix")
    if any(name not in stats for name in needed):
        raise ValueError("tuning_snapshot needs a DataTree from pm.sample(step=AdaptiveHMC()) or "
                         "sample_numpyro_ahmc; this one has no AdaptiveHMC stats (or no ahmc_tuning_snapshot).")
    model = modelcontext(model)
    value_vars = model.continuous_value_vars
    if len(value_vars) != len(model.value_vars):
        raise ValueError("tuning_snapshot: the model has discrete variables; a snapshot keeps the tuning of "
                         "AdaptiveHMC over all of a model's variables.")
    flat = _flat_draws(tree, model, value_vars)
    box = tuple(float(np.asarray(stats[name])[0, -1]) for name in ("step_size_min", "step_size_max"))
    l_box = tuple(int(np.asarray(stats[name])[0, -1]) for name in ("max_steps_min", "max_steps_max"))
    space = search_space(box, l_box, num_step_sizes=Config().box.num_step_sizes, **recorded_columns(stats))
    arms, rewards, counts = _round_evidence(tree, space)
    arm = (float(np.asarray(stats["step_size"])[0, -1]), int(np.asarray(stats["max_steps"])[0, -1]))
    index = space.arm_index(*arm)
    num_l = len(space.num_steps)
    pooled = flat.reshape(-1, flat.shape[-1])
    dense = bool(np.asarray(stats["dense_mass_matrix"])[0, -1])
    riemannian = "fixed_point_converged" in stats
    if riemannian and metric is None:
        raise ValueError("tuning_snapshot: this DataTree is an AdaptiveRMHMC run; give its metric, as given to "
                         "the step (metric='softabs' for the default), e.g. tuning_snapshot(idata, "
                         "metric='fisher'): the snapshot's step sizes are in that metric's units.")
    if metric is not None and not riemannian:
        raise ValueError("tuning_snapshot: metric= applies to an AdaptiveRMHMC run's DataTree; this one is "
                         "AdaptiveHMC's (a mass matrix). Drop metric=.")
    name = metric_name(metric) if riemannian else ""
    if riemannian:
        imm = np.ones(flat.shape[-1])  # G(x) is recomputed on the new posterior
    else:
        imm = np.atleast_2d(np.cov(pooled, rowvar=False)) if dense else np.var(pooled, axis=0, ddof=1)
    return TuningSnapshot(
        inverse_mass_matrix=imm, step_size=float(np.asarray(stats["step_size_bar"])[0, -1]), metric=name,
        step_size_bounds=box, num_steps_bounds=l_box, arm=arm, positions=flat[:, -1],
        gp_arms=arms, gp_rewards=rewards, gp_counts=counts,
        arm_unit=(space.step_size_unit[index // num_l], space.num_steps_unit[index % num_l]),
        source="pymc", coordinates=value_coordinates(model, value_vars))


def tuning_snapshot(tree, model=None, *, metric=None) -> TuningSnapshot:
    """The tuning of a finished PyMC run, for the next fit's ``warm_start=``.

    ``tree``: the DataTree of ``pm.sample(step=AdaptiveHMC())`` (then ``model``, or the model context,
    maps its draws to the unconstrained coordinates: the mass matrix is their variance, chain 0's rounds
    are the GP's evidence) or of ``sample_numpyro_ahmc`` (its ``ahmc_tuning_snapshot`` attribute).
    For an ``AdaptiveRMHMC(metric=...)`` run give the same ``metric`` (``"softabs"`` for the default; required
    there): its step sizes are in that metric's units, and a refit with another metric falls back to the
    cold warm-up.
    """
    text = getattr(tree, "attrs", {}).get(SNAPSHOT_ATTR)
    if text is not None:
        return TuningSnapshot.from_json(text)
    return _step_snapshot(tree, model, metric)
