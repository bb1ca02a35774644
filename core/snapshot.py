"""Tuning snapshots: what a finished run learned, kept to start the next fit of the model (a warm start).

A refit (new data each day, a cross-validation fold, a bootstrap resample) has nearly the same posterior
as the last fit, so most of its warm-up relearns what that fit knew.  A :class:`TuningSnapshot` keeps it:

* the inverse mass matrix and the warm-up's step size ``eps*``;
* the search box, the arm in use and the GP's evidence: each stored arm's unit coordinates in the box,
  its mean reward and the weight of its rounds (arms in the automatic box are relative to ``eps*``, so
  they carry over to a posterior of another scale);
* the chains' last positions (the next fit's check starts from them) and the run's changed options.

It is plain NumPy and JSON: ``snapshot.save("fit.json")`` (or ``.npz``) and ``TuningSnapshot.load``.
The adapters take one from a finished run and start from it (``warm_start=``); before they trust it
they run a short check (:func:`check_fit`): the chains, started at the snapshot's positions with its
metric and arm, must keep the snapshot's scale (variance ratios) and accept.  A snapshot that fails
falls back to the cold warm-up, with the reason.

>>> import numpy as np
>>> from ahmc.core.snapshot import TuningSnapshot, check_fit
>>> snap = TuningSnapshot(inverse_mass_matrix=np.ones(2), step_size=0.9, step_size_bounds=(0.45, 1.8),
...                       num_steps_bounds=(1, 14), arm=(1.1, 5), positions=np.zeros((4, 2)))
>>> draws = np.random.default_rng(0).normal(size=(4, 100, 2))
>>> check_fit(snap, draws, acceptance_rate=0.9).fits
True
>>> check_fit(snap, 30.0 * draws, acceptance_rate=0.9).fits
False
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

__all__ = ["TuningSnapshot", "FitReport", "WarmStartWarning", "check_fit", "check_metric", "load_snapshot", "metric_name",
           "match_coordinates",
           "prior_evidence", "SNAPSHOT_FORMAT", "CHECK_ITERATIONS", "MAX_VARIANCE_RATIO", "MIN_ACCEPTANCE"]

SNAPSHOT_FORMAT = 1
# The check: this many iterations at the snapshot's arm, the first third discarded.  With 4 chains that
# is ~130 draws per coordinate after burn-in: a variance ratio's log has sd ~0.15 to ~0.35 (ESS 100 to 20).
CHECK_ITERATIONS = 60
# A coordinate's variance may differ from the snapshot's by this factor (the 90th percentile of them,
# so noise in a few of many coordinates does not reject a good snapshot) and their geometric mean by
# its square root; a scale change beyond it re-runs the cold warm-up.
MAX_VARIANCE_RATIO = 3.0
# Below this mean acceptance at the snapshot's arm, its step size is too long for the new posterior.
MIN_ACCEPTANCE = 0.3


def _array(value, dtype=float):
    return np.asarray(value, dtype=dtype)


@dataclass(frozen=True, eq=False)
class TuningSnapshot:
    """What a run's tuning learned (NumPy arrays; flat unconstrained coordinates of dimension ``d``).

    inverse_mass_matrix : (d,) or (d, d)   the metric at the end of the run
    step_size           : float            ``eps*``, the warm-up's dual-averaging step size
    step_size_bounds    : (lo, hi)         the box the GP searched (absolute step sizes)
    num_steps_bounds    : (lo, hi)         its range of ``L``
    arm                 : (eps, L)         the arm in use at the end of the run
    positions           : (C, d)           the chains' last positions
    gp_arms             : (n, 2)           unit coordinates (step size, L) in the box of the GP's arms
    gp_rewards          : (n,)             their mean rewards
    gp_counts           : (n,)             the weight of their rounds (a pooled round of C chains: C)
    arm_unit            : (2,)             unit coordinates of ``arm``
    options             : dict             the run's tuning options that differ from the defaults
    source              : str              which adapter took it
    coordinates         : ((name, size),)  the named blocks of the flat coordinates, in order (empty:
                                           unnamed; then only the dimension is checked)
    metric              : str              Riemann-manifold HMC's metric (``"softabs"``, ``"fisher"``, a
                                           callable's type name); "" for HMC with a mass matrix.  An RMHMC
                                           snapshot's ``inverse_mass_matrix`` is the identity: ``G(x)`` is
                                           computed afresh on the new posterior, and ``eps`` is in its units
    draw_variances      : (d,) or None     the posterior's variances from the run's draws (the JAX routes: the
                                           last mass-matrix window's); the check compares with the larger of
                                           them and the inverse mass matrix's diagonal (:attr:`variances`)
    """

    inverse_mass_matrix: Any
    step_size: float
    step_size_bounds: tuple
    num_steps_bounds: tuple
    arm: tuple
    positions: Any
    gp_arms: Any = field(default_factory=lambda: np.zeros((0, 2)))
    gp_rewards: Any = field(default_factory=lambda: np.zeros(0))
    gp_counts: Any = field(default_factory=lambda: np.zeros(0))
    arm_unit: Any = field(default_factory=lambda: np.full(2, 0.5))
    options: dict = field(default_factory=dict)
    source: str = ""
    coordinates: tuple = ()
    metric: str = ""
    draw_variances: Any = None

    def __post_init__(self):
        imm = _array(self.inverse_mass_matrix)
        if imm.ndim not in (1, 2) or (imm.ndim == 2 and imm.shape[0] != imm.shape[1]) or imm.shape[0] < 1:
            raise ValueError(f"TuningSnapshot: inverse_mass_matrix must be (d,) or (d, d); got shape {imm.shape}.")
        positions = np.atleast_2d(_array(self.positions))
        if positions.shape[1] != imm.shape[0]:
            raise ValueError(f"TuningSnapshot: positions must be (chains, {imm.shape[0]}); got {positions.shape}.")
        arms = _array(self.gp_arms).reshape(-1, 2)
        rewards, counts = _array(self.gp_rewards).reshape(-1), _array(self.gp_counts).reshape(-1)
        if not (len(arms) == len(rewards) == len(counts)):
            raise ValueError("TuningSnapshot: gp_arms, gp_rewards and gp_counts must have one row per arm.")
        if not (math.isfinite(self.step_size) and self.step_size > 0):
            raise ValueError(f"TuningSnapshot: step_size must be > 0; got {self.step_size!r}.")
        for name, value in (("inverse_mass_matrix", imm), ("positions", positions)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "step_size", float(self.step_size))
        object.__setattr__(self, "step_size_bounds", tuple(float(v) for v in self.step_size_bounds))
        object.__setattr__(self, "num_steps_bounds", tuple(int(v) for v in self.num_steps_bounds))
        object.__setattr__(self, "arm", (float(self.arm[0]), int(self.arm[1])))
        object.__setattr__(self, "gp_arms", np.clip(arms, 0.0, 1.0))
        object.__setattr__(self, "gp_rewards", rewards)
        object.__setattr__(self, "gp_counts", counts)
        object.__setattr__(self, "arm_unit", np.clip(_array(self.arm_unit).reshape(2), 0.0, 1.0))
        blocks = tuple((str(name), int(size)) for name, size in self.coordinates)
        if blocks and sum(size for _, size in blocks) != imm.shape[0]:
            raise ValueError(f"TuningSnapshot: coordinates {blocks} do not add up to the dimension {imm.shape[0]}.")
        object.__setattr__(self, "coordinates", blocks)
        object.__setattr__(self, "metric", str(self.metric))
        if self.draw_variances is not None:
            variances = _array(self.draw_variances).reshape(-1)
            if variances.shape != (imm.shape[0],) or not np.all(np.isfinite(variances) & (variances > 0)):
                raise ValueError(f"TuningSnapshot: draw_variances must be {imm.shape[0]} positive numbers or None.")
            object.__setattr__(self, "draw_variances", variances)

    @property
    def dim(self) -> int:
        return int(self.inverse_mass_matrix.shape[0])

    @property
    def variances(self) -> np.ndarray:
        """The posterior's per-coordinate variances the check compares with: the larger of ``draw_variances``
        and the inverse mass matrix's diagonal (the diagonal alone when the snapshot has no draw variances).

        Each errs low in its own way: a Fisher estimate where the posterior is not Gaussian (it is the
        geometric mean of the draws' variance and a gradient-based bound), a window's draws where they have
        not yet spread over a wide coordinate (which the gradients see).
        """
        imm = self.inverse_mass_matrix
        diagonal = np.diag(imm).copy() if imm.ndim == 2 else imm.copy()
        return diagonal if self.draw_variances is None else np.maximum(self.draw_variances, diagonal)

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data = {name: value.tolist() if isinstance(value, np.ndarray) else value for name, value in data.items()}
        return {"format": SNAPSHOT_FORMAT, **data}

    @classmethod
    def from_dict(cls, data) -> "TuningSnapshot":
        data = dict(data)
        version = data.pop("format", SNAPSHOT_FORMAT)
        if version != SNAPSHOT_FORMAT:
            raise ValueError(f"TuningSnapshot: format {version!r} is not {SNAPSHOT_FORMAT}; take a new snapshot.")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"TuningSnapshot: unknown fields {sorted(unknown)}.")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=_plain)

    @classmethod
    def from_json(cls, text: str | bytes) -> "TuningSnapshot":
        return cls.from_dict(json.loads(text))

    def save(self, path) -> None:
        """Write to ``path``: JSON text, or NumPy's ``.npz`` when the name ends so."""
        path = str(path)
        if path.endswith(".npz"):
            np.savez(path, snapshot=np.asarray(self.to_json()))
        else:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(self.to_json())

    @classmethod
    def load(cls, path) -> "TuningSnapshot":
        path = str(path)
        if path.endswith(".npz"):
            with np.load(path) as archive:
                return cls.from_json(str(archive["snapshot"]))
        with open(path, encoding="utf-8") as handle:
            return cls.from_json(handle.read())


class WarmStartWarning(UserWarning):
    """A warm-start snapshot did not fit the model and the run fell back to the cold warm-up."""


def load_snapshot(value) -> TuningSnapshot:
    """A snapshot from a :class:`TuningSnapshot` or the path of a saved one; a clear error otherwise."""
    if isinstance(value, TuningSnapshot):
        return value
    if isinstance(value, (str, os.PathLike)):
        if not os.path.exists(value):
            raise ValueError(f"warm_start={str(value)!r}: no such file; give a TuningSnapshot or the path "
                             "snapshot.save(path) wrote.")
        return TuningSnapshot.load(value)
    raise ValueError("warm_start must be a TuningSnapshot (e.g. ahmc.adapters.blackjax.tuning_snapshot(info, "
                     f"state)) or the path of a saved one; got {type(value).__name__}.")


def _plain(value):
    """JSON for the NumPy scalars and tuples an options dict may hold."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in a snapshot")


class FitReport(NamedTuple):
    """The warm-start check's verdict.

    fits                 whether the snapshot is used
    reason               why not ("" when it fits)
    variance_ratio       (d,) the check's variance over the snapshot's, per coordinate (None: not run)
    acceptance_rate      mean acceptance at the snapshot's arm (NaN: not run)
    """

    fits: bool
    reason: str
    variance_ratio: Any = None
    acceptance_rate: float = math.nan


def check_dimension(snapshot: TuningSnapshot, dim: int) -> FitReport | None:
    """A failing report when the model's dimension is not the snapshot's (None when it is)."""
    if snapshot.dim != dim:
        return FitReport(False, f"the snapshot has {snapshot.dim} parameters (flat, unconstrained) and this "
                                f"model {dim}: it was taken from another model")
    return None


def match_coordinates(snapshot: TuningSnapshot, coordinates) -> tuple[TuningSnapshot | None, str]:
    """``(snapshot in the order of coordinates, "")``, or ``(None, reason)`` when the model's parameters
    are not the snapshot's.

    ``coordinates``: the model's ``(name, size)`` blocks in the order of its flat coordinates.  A snapshot
    with named blocks is permuted to that order (the JAX routes ravel a dict by sorted name, PyMC's step
    in model order); an unnamed one must have the dimension.
    """
    blocks = tuple((str(name), int(size)) for name, size in coordinates)
    failed = check_dimension(snapshot, sum(size for _, size in blocks))
    if failed is not None:
        return None, failed.reason
    if not snapshot.coordinates or snapshot.coordinates == blocks:
        return snapshot, ""
    if sorted(snapshot.coordinates) != sorted(blocks):
        return None, (f"the snapshot's parameters are {dict(snapshot.coordinates)} and this model's "
                      f"{dict(blocks)}: it was taken from another model")
    starts, offset = {}, 0
    for name, size in snapshot.coordinates:
        starts[name], offset = offset, offset + size
    order = np.concatenate([np.arange(starts[name], starts[name] + size) for name, size in blocks])
    imm = snapshot.inverse_mass_matrix
    imm = imm[np.ix_(order, order)] if imm.ndim == 2 else imm[order]
    variances = None if snapshot.draw_variances is None else snapshot.draw_variances[order]
    return dataclasses.replace(snapshot, inverse_mass_matrix=imm, positions=snapshot.positions[:, order],
                               coordinates=blocks, draw_variances=variances), ""


def metric_name(metric) -> str:
    """What a snapshot records of a Riemannian ``metric`` argument: its name, or a callable's (type) name."""
    if isinstance(metric, str):
        return metric
    return getattr(metric, "__name__", None) or type(metric).__name__


def check_metric(snapshot: TuningSnapshot, metric: str) -> FitReport | None:
    """A failing report when the run's Riemannian metric (``""``: a mass matrix) is not the snapshot's:
    its step size is in the units of another metric (None when they agree)."""
    if snapshot.metric == metric:
        return None
    def described(name):
        return f"metric={name!r}" if name else "a mass matrix (no metric=)"
    return FitReport(False, f"the snapshot was taken with {described(snapshot.metric)} and this run uses "
                            f"{described(metric)}: its step sizes are in another metric's units")


def check_fit(snapshot: TuningSnapshot, draws, acceptance_rate: float) -> FitReport:
    """Whether a short run started from ``snapshot`` keeps its scale and acceptance.

    ``draws``: (chains, iterations, d) flat positions of the check run (its first third is dropped as
    burn-in); ``acceptance_rate``: its mean acceptance probability.  An RMHMC snapshot (``metric``)
    is judged by acceptance alone: it holds no mass matrix whose scale could be wrong, the metric is
    recomputed on the new posterior, and the acceptance at its arm says whether ``eps`` still fits.
    """
    draws = np.asarray(draws, dtype=float)
    if draws.ndim != 3:
        raise ValueError(f"draws must be (chains, iterations, d); got shape {draws.shape}.")
    failed = check_dimension(snapshot, draws.shape[-1])
    if failed is not None:
        return failed
    kept = draws[:, draws.shape[1] // 3:].reshape(-1, draws.shape[-1])
    ratio = np.var(kept, axis=0, ddof=1) / np.maximum(snapshot.variances, np.finfo(float).tiny)
    acceptance = float(acceptance_rate)
    if snapshot.metric:
        ratio = np.ones(draws.shape[-1])  # no mass matrix to compare the draws' scale with
    log_ratio = np.log(np.where(ratio > 0, ratio, np.finfo(float).tiny))
    spread = float(np.quantile(np.abs(log_ratio), 0.9)) if np.all(np.isfinite(log_ratio)) else math.inf
    overall = float(np.exp(np.mean(log_ratio))) if np.all(np.isfinite(log_ratio)) else math.inf
    limit = math.log(MAX_VARIANCE_RATIO)
    if not (acceptance >= MIN_ACCEPTANCE):
        reason = (f"at the snapshot's arm (eps = {snapshot.arm[0]:.3g}, L = {snapshot.arm[1]}) the chains accept "
                  f"{acceptance:.2f} of proposals (below {MIN_ACCEPTANCE}): the posterior's scale has changed")
    # The geometric mean may sit lower than above: 60 transitions of a slowly mixing posterior do not spread
    # over all of it, so they underestimate its variance, while a wider spread means a wider posterior.
    elif not (spread <= limit and -limit <= math.log(overall) <= limit / 2):
        reason = (f"the posterior's variances are {overall:.3g} times the snapshot's (geometric mean; 90% of "
                  f"coordinates within a factor {math.exp(spread):.3g}), beyond what a warm start allows (each "
                  f"within a factor {MAX_VARIANCE_RATIO}, their geometric mean in [1/{MAX_VARIANCE_RATIO}, "
                  f"sqrt({MAX_VARIANCE_RATIO})])")
    else:
        return FitReport(True, "", ratio, acceptance)
    return FitReport(False, reason, ratio, acceptance)


def prior_evidence(snapshot: TuningSnapshot, step_size_unit, num_steps_unit, max_weight: float):
    """The snapshot's GP evidence on a grid: ``(arms, rewards, weights, start_arm)`` for ``Tuner.prefill``.

    Each stored arm is snapped to the nearest point of the grid whose unit coordinates are given (arms
    that meet are pooled); its weight is its rounds' weight, at most ``max_weight``: earlier rewards were
    measured on another posterior, so a few new rounds outweigh them.  ``start_arm`` is the snapshot's arm.
    """
    step_size_unit, num_steps_unit = np.asarray(step_size_unit), np.asarray(num_steps_unit)
    num_l = len(num_steps_unit)

    def index(unit):
        i = int(np.argmin(np.abs(step_size_unit - unit[0])))
        return i * num_l + int(np.argmin(np.abs(num_steps_unit - unit[1])))

    pooled: dict[int, list[float]] = {}
    for unit, reward, count in zip(snapshot.gp_arms, snapshot.gp_rewards, snapshot.gp_counts):
        if count > 0 and math.isfinite(reward):
            total = pooled.setdefault(index(unit), [0.0, 0.0])
            total[0] += reward * count
            total[1] += count
    arms = np.array(list(pooled), dtype=np.int32)
    counts = np.array([c for _, c in pooled.values()], dtype=float)
    rewards = np.array([s / c for s, c in pooled.values()], dtype=float)
    return arms, rewards, np.minimum(counts, float(max_weight)), index(snapshot.arm_unit)
