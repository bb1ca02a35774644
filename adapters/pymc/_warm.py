"""Warm starts of the PyMC step: ``pm.sample(step=AdaptiveHMC(warm_start=snapshot))`` (docs/warm_start.md).

The check of :func:`ahmc.core.snapshot.check_fit` runs inside ``tune``: each chain's first
``CHECK_ITERATIONS`` iterations jump to one of the snapshot's positions and sample at its mass matrix
and arm.  A snapshot that fits starts the rest of tune (metric phase and GP rounds, planned for what
remains) from its mass matrix, step size and GP evidence; one that does not is dropped with a
:class:`~ahmc.core.snapshot.WarmStartWarning` and the rest of tune runs cold.  No extra model call,
no extra compile: the check's iterations are tune's.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import scipy.linalg
from pymc.blocking import RaveledVars

from ahmc.core.snapshot import (CHECK_ITERATIONS, WarmStartWarning, check_fit, check_metric, load_snapshot,
                                match_coordinates)
from ahmc.core.snapshot import prior_evidence

from ._snapshot import value_coordinates

#: Tune must leave room after the check for a metric phase and a few GP rounds.
MIN_TUNE_AFTER_CHECK = 50


class WarmStartMixin:
    """The warm-start side of :class:`AdaptiveHMC` (state: ``_snapshot``, ``_check``, ``_use_prior``)."""

    def _init_warm_start(self, warm_start, model, value_vars, weight):
        """Check ``warm_start`` against the model (its parameters' names and sizes) before sampling."""
        self._snapshot, self._check, self._use_prior = None, None, False
        self._warm_start_weight = float(weight)
        if warm_start is None:
            return
        name = type(self).__name__
        if not self._adapts_metric and not self._warm_metric_name():
            raise ValueError(f"{name}(warm_start=...) starts from the snapshot's mass matrix: drop potential= "
                             "and scaling=, and keep adapt_mass_matrix=True.")
        snapshot, reason = match_coordinates(load_snapshot(warm_start), value_coordinates(model, value_vars))
        other_metric = None if snapshot is None else check_metric(snapshot, self._warm_metric_name())
        if other_metric is not None:
            snapshot, reason = None, other_metric.reason
        if snapshot is None:
            warnings.warn(f"{name}: warm_start not used: {reason}. The warm-up runs cold; give tune=1000.",
                          WarmStartWarning, stacklevel=3)
        self._snapshot = snapshot

    def _warm_metric_name(self) -> str:
        """The Riemannian metric a snapshot must have been taken with ("": a mass matrix; AdaptiveRMHMC's own)."""
        return ""

    def _snapshot_metric(self):
        """The snapshot's inverse mass matrix in the shape of this step's potential (dense or diagonal)."""
        imm = self._snapshot.inverse_mass_matrix
        if hasattr(self.potential, "_initial_cov"):
            return imm if imm.ndim == 2 else np.diag(imm)
        return np.diag(imm).copy() if imm.ndim == 2 else imm

    def _start_potential(self, metric, mean):
        """Restart the warm-up's potential from ``metric`` (``None``: the cold start, PyMC's reset).

        PyMC restores a step's state between sequential chains and refuses one whose frozen fields (the
        potential's initial values) changed, so the snapshot's metric goes into the live fields only.
        A step that adapts no mass matrix (AdaptiveRMHMC: ``G(x)`` is the metric) keeps its potential."""
        if not self._adapts_metric:
            return
        potential = self.potential
        potential.reset()
        if metric is None:
            return
        metric, mean = np.asarray(metric, dtype=potential.dtype), np.asarray(mean, dtype=potential.dtype)
        if hasattr(potential, "_initial_cov"):
            potential._cov = metric.copy()
            potential._chol = scipy.linalg.cholesky(metric, lower=True)
            potential._foreground_cov = type(potential._foreground_cov)(
                potential._n, mean, metric, potential._initial_weight, potential.dtype)
            return
        potential.set_variance(metric)
        potential._step_size_var = potential._var.copy()  # the step size restarts from the snapshot's too
        potential._foreground_var = type(potential._foreground_var)(
            potential._n, mean, metric, potential._initial_weight, potential.dtype)

    def _restart_step_size(self, step_size):
        """Dual averaging from ``step_size`` (its initial value is not frozen: set in place)."""
        self.step_adapt._initial_step = float(step_size)
        self.step_adapt.reset()

    def _setup_warm_check(self, tune):
        """At a chain's start: the check phase, when tune leaves room for it."""
        self._check, self._use_prior = None, False
        if self._snapshot is None:
            return
        if tune < CHECK_ITERATIONS + MIN_TUNE_AFTER_CHECK:
            warnings.warn(f"{type(self).__name__}: warm_start not used: tune={tune} leaves no room for the "
                          f"snapshot's check ({CHECK_ITERATIONS} iterations) and a warm-up after it; give "
                          f"tune >= {CHECK_ITERATIONS + MIN_TUNE_AFTER_CHECK}.", WarmStartWarning, stacklevel=3)
            return
        self._check = {"draws": [], "accept": [], "tune": int(tune)}

    def _check_start(self, q0):
        """The check's first position: a snapshot position (the chain's own rng picks which), if finite."""
        row = self._snapshot.positions[int(self.rng.integers(self._snapshot.positions.shape[0]))]
        candidate = RaveledVars(np.asarray(row, dtype=q0.data.dtype), q0.point_map_info)
        logp, _ = self._logp_dlogp_func(candidate)
        return candidate if math.isfinite(float(logp)) else q0

    def _check_iteration(self, q0, step):
        """One of the check's iterations (``step``: the step's HMC iteration), ending the check after the last."""
        check = self._check
        if not check["draws"]:  # here, not in setup_chain: PyMC's reset_tuning resets the potential after it
            self._start_potential(self._snapshot_metric(), self._snapshot.positions.mean(axis=0))
            self.potential.is_adapting = False  # the check samples at the snapshot's metric, unchanged
            q0 = self._check_start(q0)
        self.adapt_step_size, self._arm, self._frozen, self._collect_steps = False, self._snapshot.arm, False, False
        q, stats = step(q0)
        check["draws"].append(np.array(q.data, dtype=float))
        check["accept"].append(float(stats["acceptance_rate"]))
        if len(check["draws"]) == CHECK_ITERATIONS:
            self._end_check()
        return q, stats

    def _end_check(self):
        """The verdict on this chain's check: continue tune from the snapshot, or run the rest of it cold."""
        check, self._check = self._check, None
        report = check_fit(self._snapshot, np.asarray(check["draws"])[None], float(np.nanmean(check["accept"])))
        self._apply_verdict(report, check["tune"], check["draws"][-1])

    def _apply_verdict(self, report, tune, last_draw, restart_potential=True, restart_step_size=True, warn=True):
        """Start the rest of tune from the snapshot (``report.fits``) or cold.  A pooled run restarts what its
        chains share (step size, diagonal mass matrix) once, so the other chains pass ``False`` for it."""
        self._use_prior = report.fits
        rest = tune - CHECK_ITERATIONS
        if not report.fits and warn:
            warnings.warn(f"{type(self).__name__}: warm_start not used: {report.reason}. The rest of tune "
                          f"({rest} iterations) runs cold; give tune=1000.", WarmStartWarning, stacklevel=3)
        fits = report.fits
        if restart_potential:
            self._start_potential(self._snapshot_metric() if fits else None,
                                  last_draw if fits else np.zeros(self.potential._n))
        if restart_step_size:
            self._restart_step_size(self._snapshot.step_size if fits else self._cold_step_size)
        self._reset_chain(rest)
        if hasattr(self.potential, "set_warmup"):
            self.potential.set_warmup(self._num_warmup)

    def _first_tuner_state(self, tuner, first_arm):
        """The GP rounds' first tuner state: the snapshot's evidence (reduced weight) and arm, or cold."""
        if not self._use_prior:
            return tuner.init()._replace(arm=np.asarray(first_arm, dtype=np.int32))
        space = tuner.space
        arms, rewards, weights, start = prior_evidence(self._snapshot, space.step_size_unit, space.num_steps_unit,
                                                       self._warm_start_weight)
        return tuner.prefill(arms, rewards, weights, start_arm=start)
