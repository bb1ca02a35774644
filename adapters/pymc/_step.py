"""The PyMC step method :class:`AdaptiveHMC` (its potentials, integrator and stats); see :mod:`ahmc.adapters.pymc`."""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any

import numpy as np
import scipy.linalg

from .._extras import require

require("pymc", "pymc")
import pytensor  # noqa: E402
from pymc.model import modelcontext  # noqa: E402
from pymc.stats.convergence import SamplerWarning, WarningType  # noqa: E402
from pymc.step_methods.compound import Competence  # noqa: E402
from pymc.step_methods.hmc import integration  # noqa: E402
from pymc.step_methods.hmc.base_hmc import BaseHMC, BaseHMCState, DivergenceInfo, HMCStepData  # noqa: E402
from pymc.step_methods.hmc.integration import IntegrationError, State  # noqa: E402
from pymc.step_methods.hmc.quadpotential import (  # noqa: E402
    QuadPotentialDiag,
    QuadPotentialDiagAdapt,
    QuadPotentialDiagAdaptState,
    QuadPotentialFullAdapt,
    QuadPotentialFullAdaptState,
    WeightedVarianceState,
    _WeightedVariance,
)
from pymc.step_methods.state import dataclass_state  # noqa: E402
from pymc.step_methods.step_sizes import DualAverageAdaptation  # noqa: E402
from pymc.util import get_value_vars_from_user_vars  # noqa: E402
from pymc.vartypes import discrete_types  # noqa: E402
from threadpoolctl import ThreadpoolController  # noqa: E402

from ahmc.core.options import check_option_names, whole_number_pair  # noqa: E402
from ahmc.core.objectives import (NONFINITE_REWARD_MESSAGE, default_objective, get_objective,
                                  needs_center, round_arrays, round_init, round_update, step_jumps_estimate,
                                  step_jumps_init, step_jumps_update)
from ahmc.core.mass_matrix import (DENSE_AUTO_MAX_DIM, UNEXPLORED_PRODUCT, fisher_diagonal, prefers_dense,
                                   rescale_diagonal, rescue_unexplored, resolve_metric_recipe, shrink_correlations)
from ahmc.core.space import WARMUP_MAX_STEPS, check_min_steps_fraction, min_num_steps
from ahmc.core.retry import retry_log_acceptance
from ahmc.core.tuner import adapt_probability
from ahmc.core.schedule import automatic_box, metric_phase_max_steps, plan_warmup, stan_schedule, steps_for
from ahmc.core import Config, gp_ucb, search_space
from ahmc.core.config import GPConfig, resolve_options

from ._warm import WarmStartMixin

#: Metrics read off the model's variables (``_pymc_fisher``): its expected Fisher information, or the diagonal.
MODEL_METRICS = ("fisher", "diagonal_fisher")


#: ``metric_fraction`` with ``dense_mass=True``: one chain's dense estimate needs most of tune (five
#: seeds of the logistic regressions, docs/algorithm.md "Dense mass matrix": 0.9 against 0.5 raised the min ESS per
#: gradient from 0.37x to 0.99x PyMC's dense NUTS on breast cancer, d = 31).
DENSE_METRIC_FRACTION = 0.9


__all__ = ["AdaptiveHMC", "STATS"]


#: (name, dtype, shape, meaning): the single source of ``AdaptiveHMC.stats_dtypes_shapes``.
STATS = (
    ("step_size", np.float64, [], "step size eps used in this iteration"),
    ("step_size_bar", np.float64, [], "PyMC's dual-averaged step size (moves in warm-up only)"),
    ("n_steps", np.int64, [], "leapfrog steps (gradient evaluations) taken, a retry's included"),
    ("max_steps", np.int64, [], "L of the arm: n_steps is uniform on {lowest..max_steps}, lowest = "
                                "max(1, ceil(min_steps_fraction * max_steps)) (1 by default)"),
    ("acceptance_rate", np.float64, [], "Metropolis acceptance probability (PyMC NUTS's name)"),
    ("accepted", np.float64, [], "1.0 if the proposal was accepted (float, like Metropolis)"),
    ("diverging", bool, [], "the trajectory diverged (after a retry: the retry did too)"),
    ("retried", bool, [], "the trajectory diverged and the transition retried finer (divergence_retry)"),
    ("divergences", np.int64, [], "divergences after tune so far"),
    ("energy_error", np.float64, [], "H(end of trajectory) - H(start)"),
    ("energy", np.float64, [], "Hamiltonian at the returned draw"),
    ("model_logp", np.float64, [], "log density at the returned draw"),
    ("tuning_round", np.int64, [], "GP round of this iteration, 1, 2, ... (0 = warm-up)"),
    ("reward", np.float64, [], "reward of the round, on its last iteration; NaN elsewhere"),
    ("arm_changed", bool, [], "the tuner moved to a new arm after this iteration"),
    ("adapt_probability", np.float64, [], "p_i of this round (0 once frozen, NaN in warm-up)"),
    ("step_size_min", np.float64, [], "search box for eps: lower end (NaN in warm-up)"),
    ("step_size_max", np.float64, [], "search box for eps: upper end (NaN in warm-up)"),
    ("max_steps_min", np.int64, [], "search box for L: lower end (0 in warm-up)"),
    ("max_steps_max", np.int64, [], "search box for L: upper end (0 in warm-up)"),
    ("num_num_steps", np.int64, [], "values of L on the GP's grid: an automatic box's columns (0: every "
                                    "integer of a given num_steps_bounds, and in warm-up)"),
    ("log_num_steps", bool, [], "those columns are log-spaced (ahmc.core.space.grid_num_steps)"),
    ("dense_mass_matrix", bool, [], "the adapted mass matrix in force is dense (dense_mass=True after its first "
                                    "window, or 'auto' where the window kept the correlations)"),
    ("largest_eigval", np.float64, [], "PyMC potential stat"),
    ("smallest_eigval", np.float64, [], "PyMC potential stat"),
    ("process_time_diff", np.float64, [], "CPU time of the iteration"),
    ("perf_counter_diff", np.float64, [], "wall time of the iteration"),
    ("perf_counter_start", np.float64, [], "wall clock at the start of the iteration"),
    ("warning", SamplerWarning, None, "PyMC sampler warning (divergences, bad energy)"),
)


@dataclass_state
class _WarmupDiagAdaptState(QuadPotentialDiagAdaptState):
    is_adapting: bool
    _draws_foreground: WeightedVarianceState
    _grads_foreground: WeightedVarianceState
    _draws_background: WeightedVarianceState
    _grads_background: WeightedVarianceState
    _step_size_var: np.ndarray
    metric_moved: bool


# A variance that moved this much (log 10) since dual averaging last started leaves its step size far
# off: PyMC's first estimate replaces the identity after 101 draws, and dual averaging, which never
# restarts in PyMC, would carry the identity's step size (1e-3 of the right one on sds 1e-6 and 1e6)
# into the rounds.  The step restarts it then, as Stan does after every window.
METRIC_MOVE = math.log(10.0)
# Fewest metric-phase iterations a restarted dual averaging needs to settle; later moves keep it running.
MIN_RESTART_ITERATIONS = 20


class _WarmupDiagAdapt(QuadPotentialDiagAdapt):
    """PyMC's diagonal mass-matrix adaptation with an off switch for the GP rounds, and a rescue for
    coordinates the window's draws have not explored (:func:`ahmc.core.mass_matrix.rescue_unexplored`).

    PyMC's estimate is the draws' variance alone; one chain that starts with an identity metric on sds
    1e-6 and 1e6 moves the wide coordinate so little in a short metric phase that the estimate stays
    near 1 (measured: sd 0.037 of 1e6 after 300 tune).  Gradients at the same draws give the scale.
    """

    _state_class = _WarmupDiagAdaptState

    def __init__(self, *args, fisher=False, **kwargs):
        super().__init__(*args, **kwargs)
        # metric_recipe="fisher_diag": nutpie's sqrt(var x / var grad) from the same windows, instead of var x
        self.fisher = bool(fisher)

    def reset(self):
        super().reset()
        self.is_adapting = True
        # Unweighted draws and gradients of PyMC's foreground and background windows
        self._draws_foreground, self._grads_foreground = self._new_window()
        self._draws_background, self._grads_background = self._new_window()
        self._step_size_var, self.metric_moved = self._var.copy(), False

    def _new_window(self):
        return _WeightedVariance(self._n, dtype=self.dtype), _WeightedVariance(self._n, dtype=self.dtype)

    def update(self, sample, grad, tune):
        adapting = tune and self.is_adapting
        count, window = self._n_samples, self.adaptation_window
        super().update(sample, grad, adapting)
        self.metric_moved = False
        if not adapting:
            return
        if count > self._discard_window:  # the draws PyMC's windows take
            self._add_to_windows(sample, grad)
        if (self._early_update or count > window) and self._draws_foreground.n_samples > 1:  # PyMC set _var
            self._set_fisher() if self.fisher else self._rescue_unexplored()
        if count > 0 and count % window == 0:  # PyMC's background window became the foreground
            self._draws_foreground, self._grads_foreground = self._draws_background, self._grads_background
            self._draws_background, self._grads_background = self._new_window()
        if np.max(np.abs(np.log(self._var / self._step_size_var))) > METRIC_MOVE:
            self._step_size_var, self.metric_moved = self._var.copy(), True

    def _add_to_windows(self, sample, grad):
        for accumulator, value in ((self._draws_foreground, sample), (self._grads_foreground, grad),
                                   (self._draws_background, sample), (self._grads_background, grad)):
            accumulator.add_sample(value)

    def _rescue_unexplored(self):
        draws, grads = self._draws_foreground, self._grads_foreground
        grad_variance = grads.current_variance()
        variance = rescue_unexplored(self._var, draws.current_variance(), grad_variance,
                                     grad_variance + grads.mean ** 2)  # (PyMC's current_mean fails on numpy 2)
        self.set_variance(np.clip(variance, 1e-12, 1e12))  # PyMC's own clip

    def _set_fisher(self):
        """nutpie's diagonal from the window's draws and gradients (exact for a Gaussian); a coordinate whose
        gradient does not vary keeps PyMC's draw variance."""
        variance = fisher_diagonal(self._var, self._draws_foreground.current_variance(),
                                   self._grads_foreground.current_variance())
        self.set_variance(np.clip(variance, 1e-12, 1e12))  # PyMC's own clip

    def set_variance(self, variance):
        """Put ``variance`` into PyMC's live fields (the compiled kinetic energy reads the shared copy)."""
        self._var = np.asarray(variance, dtype=self.dtype).copy()
        self._stds = np.sqrt(self._var)
        self._inv_stds = 1.0 / self._stds
        self._var_pytensor.set_value(self._var)


@dataclass_state
class _WarmupFullAdaptState(QuadPotentialFullAdaptState):
    is_adapting: bool
    kept_correlations: bool
    _background_grads: WeightedVarianceState


def stan_windows(num_iterations: int) -> tuple[int, tuple[int, ...]]:
    """Stan's mass-matrix windows for a warm-up of ``num_iterations`` (:func:`ahmc.core.schedule.stan_schedule`,
    BlackJAX's) as ``(first, ends)``: draws ``first + 1 ..`` enter the estimate; a window closes after draw ``e``
    for ``e`` in ``ends``."""
    is_slow, is_end = stan_schedule(int(num_iterations))
    return (int(np.argmax(is_slow)) if is_slow.any() else 0), tuple(int(i) + 1 for i in np.flatnonzero(is_end))


class _WarmupFullAdapt(QuadPotentialFullAdapt):
    """A dense mass matrix estimated in Stan's windows, then fixed for the GP rounds.

    PyMC's own schedule (``init="adapt_full"``: the covariance of all draws since the
    previous window, re-factorised every iteration) suits NUTS's full-length tune; one chain
    of ahmc's shorter metric phase then still carries its transient into the estimate
    (measured on breast cancer, d = 31: a direction under-estimated 1000-fold).  Here every
    window starts afresh, the window's correlations are shrunk towards zero when it holds few
    draws for its dimension, then the estimate towards the identity as Stan does, and the matrix
    changes only at a window's end.
    """

    _state_class = _WarmupFullAdaptState

    def __init__(self, *args, auto=False, **kwargs):
        with warnings.catch_warnings():  # PyMC flags the class as experimental; ahmc tests it (test_pymc.py)
            warnings.filterwarnings("ignore", message="QuadPotentialFullAdapt is an experimental feature")
            super().__init__(*args, **kwargs)
        self.auto = bool(auto)  # dense_mass="auto": keep a window's correlations only where they stand out
        self.set_warmup(0)

    def set_warmup(self, num_iterations):
        """Windows for a metric phase of ``num_iterations`` (per chain, before its first draw)."""
        self.first_estimated, self.window_ends = stan_windows(int(num_iterations))

    def reset(self):
        super().reset()
        self.is_adapting = True
        self.kept_correlations = False  # the identity until the first window closes
        self._background_grads = _WeightedVariance(self._n, dtype=self.dtype)

    def update(self, sample, grad, tune):
        if not (tune and self.is_adapting):
            return
        self._n_samples += 1
        if self._n_samples <= self.first_estimated:
            return  # initial buffer: the chain is still arriving
        self._background_cov.add_sample(sample)
        if grad is not None:  # (PyMC's potentials may be updated without gradients)
            self._background_grads.add_sample(grad)
        if self._n_samples in self.window_ends:
            window, grads = self._background_cov, self._background_grads
            n = window.n_samples
            raw = window.current_covariance()
            cov = shrink_correlations(raw, n)  # a short window's missed directions must not freeze
            self.kept_correlations = not self.auto or bool(prefers_dense(raw, n))
            if not self.kept_correlations:  # correlations within noise: the diagonal does better
                cov = np.diag(np.diag(cov))
            cov = self._rescued(cov, grads)
            # Stan's regularisation, but towards each coordinate's own variance rather than 1e-3 in absolute
            # units: towards 1e-3 a coordinate with sd 1e-6 kept a variance near 1e-4 (its whitened sd 1e-4).
            variance = np.diag(cov)
            target = np.where(variance > 0, variance, 1e-3)
            self._cov = (n / (n + 5.0)) * cov + (5.0 / (n + 5.0)) * np.diag(target)
            try:
                self._chol = scipy.linalg.cholesky(self._cov, lower=True)
            except (scipy.linalg.LinAlgError, ValueError) as error:
                self._chol_error = error
            self._foreground_cov = window  # its mean centres the squares of the centred rewards
            self._background_cov = type(window)(self._n, dtype=self.dtype)
            self._background_grads = _WeightedVariance(self._n, dtype=self.dtype)

    def _rescued(self, cov, grads):
        """``cov`` with the coordinates the window's draws have not explored set to their gradients' scale
        (:func:`ahmc.core.mass_matrix.rescue_unexplored`, as the diagonal step does), correlations kept."""
        if grads.n_samples != self._background_cov.n_samples or grads.n_samples < 2:
            return cov
        grad_variance = grads.current_variance()
        variance = rescue_unexplored(np.diag(cov), np.diag(cov), grad_variance, grad_variance + grads.mean ** 2)
        return rescale_diagonal(cov, np.clip(variance, 1e-12, 1e12))  # PyMC's own clip

    def whiten(self, x):
        """``C^{-1} x`` for the covariance estimate ``C C^T`` (the inverse mass matrix)."""
        return scipy.linalg.solve_triangular(self._chol, x, lower=True)


# Energy span (nats) past which a trajectory counts as blown up and stops.  Far above any span a sound
# trajectory shows, even from a start 1e6 nats below the mode, and far below float64's overflow at
# 1e308: where an unstable leapfrog multiplies the energy by a steady factor per step, the trajectory
# stops well before its momentum overflows (a jump to overflow within one step ends it too, as NaN).
_BLOWN_UP_SPAN = 1e50


# A chain accepting fewer than this share of its proposals over the last STUCK_WINDOW tune iterations is
# reported as stuck (the JAX engine's threshold).
STUCK_ACCEPTANCE, STUCK_WINDOW = 0.05, 100


# Tune's GP rounds whose draws vary this many times more than the mass matrix assumes (in some coordinate)
# are reported: a well-adapted metric gives a ratio near 1 (within its estimation noise, a factor of 2).
SCALE_MISMATCH_RATIO = 10.0


# A tune step size (in the mass matrix's units) beyond this means a flat, improper posterior (the JAX engine's).
FLAT_STEP_SIZE = 1e10


class _LeapfrogReusingStart(integration.CpuLeapfrogIntegrator):
    """PyMC's leapfrog integrator, but the log density and gradient at a trajectory's start are
    those the previous iteration left at the chain's position (its accepted end, or its start).

    PyMC's ``BaseHMC`` evaluates them again at every start: one more model call per iteration,
    a quarter of the calls at AHMC's 3-4 leapfrog steps per draw.  Only for steps that sample
    every free variable (``reuse=True``): in a compound step another step may have moved a
    variable the density depends on while this step's position stayed put.
    """

    def __init__(self, potential, logp_dlogp_func, reuse):
        super().__init__(potential, logp_dlogp_func)
        self.reuse = bool(reuse)
        self.previous_end: State | None = None  # set by the step after each iteration
        self.start_evaluations = 0  # model calls of the last compute_state (0 or 1)

    def new_chain(self):
        self.previous_end = None

    def compute_state(self, q, p):
        end = self.previous_end
        reused = self.reuse and end is not None and np.array_equal(end.q.data, q.data)
        self.start_evaluations = 0 if reused else 1
        if not reused:
            return super().compute_state(q, p)
        v = self._potential.velocity(p, out=None)  # as in PyMC's compute_state, without the model call
        return State(q, p, v, end.q_grad, self._potential.energy(p, velocity=v) - end.model_logp, end.model_logp, 0)


def _check_step_options(cls, kwargs) -> None:
    """Unknown keyword arguments fail now, with the nearest valid name, instead of deep in PyTensor's compile
    (where ``BaseHMC`` sends every name it does not know)."""
    import inspect

    valid = set()
    for owner in (*cls.__mro__, pytensor.function):
        init = owner if owner is pytensor.function else owner.__dict__.get("__init__")
        if init is not None and callable(init):
            valid |= {name for name, p in inspect.signature(init).parameters.items()
                      if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name != "self"}
    check_option_names(kwargs, valid | set(Config.option_names()), cls.__name__)


def _samples_every_variable(step) -> bool:
    """Whether the step's density reads no variable that another step moves (no compound partner)."""
    return not getattr(step._logp_dlogp_func, "_extra_vars", True)


def refuse_discrete(value_vars, sampler: str, fix: str) -> None:
    """ValueError naming the discrete value variables (gradient-based samplers cannot take them) and the fix."""
    discrete = [v.name for v in value_vars if v.dtype in discrete_types]
    if discrete:
        raise ValueError(f"{sampler} needs gradients and cannot sample the discrete variable(s) {discrete}. {fix}")


@dataclass_state
class AdaptiveHMCState(BaseHMCState):
    _tuner_state: Any  # core TunerState (None during warm-up)
    _round_stats: Any  # core RoundStats of the running round (Python numbers)
    _search_box: Any  # (eps_lo, eps_hi, L_lo, L_hi), None during warm-up
    _chain_iteration: int
    _num_warmup: int
    _num_tune_rounds: int
    _step_jumps: Any  # core StepJumps of the running round (jump_estimate="trajectory")


_PROGRESS_STATS = ("divergences", "step_size", "max_steps", "n_steps")


# The Config options the PyMC step reads, in the order AdaptiveHMC.__init__ unpacks them.
_PYMC_OPTIONS = ("step_size_bounds", "num_steps_bounds", "round_length", "objective", "divergence_penalty",
                 "jump_estimate", "schedule", "k", "decay", "freeze_after", "adapt_mass_matrix", "initial_step_size",
                 "metric_fraction", "step_size_factors", "max_integration_time", "warmup_integration_time",
                 "num_steps_cap", "num_step_sizes", "exploit_after_warmup", "capacity", "lengthscale",
                 "noise_variance", "alpha", "delta", "min_steps_fraction", "dense_mass", "log_step_size",
                 "warm_start_weight", "divergence_retry", "num_num_steps", "log_num_steps", "initial_design")


# Config options of the JAX routes only: refused here rather than ignored.
_JAX_ONLY = {"restart_lost_chains": "PyMC runs each chain apart, so no chain can be restarted from another"}


def _pymc_tuning(tuning: dict, kwargs: dict, owner: str) -> tuple:
    """The PyMC step's values of the Config options (defaults: ``ahmc.core.Config``, with the step's own
    resolution of its ``None`` defaults), and BaseHMC's ``target_accept`` from ``target_acceptance_rate``."""
    for name, why in _JAX_ONLY.items():
        if name in tuning:
            raise ValueError(f"{owner}: {name} is not available in PyMC ({why}).")
    recipe = tuning.pop("metric_recipe", None)
    if recipe is not None:
        _, dense = resolve_metric_recipe(recipe, tuning.get("dense_mass", False))
        if recipe == "fisher_low_rank":
            raise ValueError(
                f"{owner}: metric_recipe={recipe!r} runs in the JAX routes only (BlackJAX's estimator); the PyMC step "
                "estimates 'welford_diag', 'welford_dense' or 'fisher_diag'. Use ahmc.adapters.pymc.sample_numpyro_ahmc("
                f"metric_recipe={recipe!r}) for this model, or one of those here.")
        tuning["dense_mass"] = dense
    if "target_acceptance_rate" in tuning:
        if "target_accept" in kwargs:
            raise ValueError(f"{owner}: give target_accept (PyMC's name) or target_acceptance_rate, not both.")
        kwargs["target_accept"] = tuning.pop("target_acceptance_rate")
    values = {**Config().options(), **tuning}
    values["jump_estimate"] = values["jump_estimate"] or "trajectory"
    values["noise_variance"] = GPConfig(noise_variance=values["noise_variance"]).resolved_noise_variance(
        one_chain_rounds=True)
    return tuple(values[name] for name in _PYMC_OPTIONS)


class AdaptiveHMC(WarmStartMixin, BaseHMC):
    """HMC with ``(eps, L)`` tuned by annealed GP-UCB while the chain runs.

    Parameters
    ----------
    vars : list, optional
        Continuous variables to sample (default: all continuous ones).
    step_size_bounds : (float, float), optional
        Box for ``eps``; default ``eps* x step_size_factors`` (log grid of ``num_step_sizes``).
    num_steps_bounds : (int, int), optional
        Box for ``L``; default ``(1, ceil(max_integration_time / eps*))``, capped at ``num_steps_cap``
        (1024, the longest trajectory of NUTS's default tree depth; warm-up's metric phase at 256).
    round_length : int
        Iterations per round, ``m`` (10: the paper's ``B / k`` for 1000 tune, 100 rounds).
    objective : {None, "normalized_ess", "normalized_esjd", "esjd", "esjd_per_gradient", "esjd_moments"} or callable
        Reward of a round; a callable gets ``(RoundStats, L)``.  ``None``: the paper's
        ``"normalized_esjd"`` for this step (one chain's rounds); ``PooledAdaptiveHMC`` with the adapted
        mass matrix: ``"normalized_ess"`` (the round's strict ESS per draw, means and squares, over
        ``sqrt(steps per draw)``, the JAX routes' default).
    divergence_penalty : float
        The reward is multiplied by ``exp(-divergence_penalty * f)``, ``f`` the round's
        fraction of divergent transitions (default 10; 0 = the paper's reward).
    divergence_retry : int or None
        In the rounds, a divergent trajectory retries once from the same momentum with the step size
        divided by this (default 8) for as many times the steps; the retry is accepted by delayed
        rejection (exact), so a chain in a funnel's neck moves instead of staying put.  ``None``: off.
    jump_estimate : {"trajectory", "transition"}
        How a round's mean squared jump (the reward's numerator) is measured.  ``"transition"``:
        the jumps the chain made (the paper).  ``"trajectory"`` (default): estimated from every
        leapfrog step of the round's trajectories, each step's squared jump from the start weighted
        by the acceptance probability had the trajectory stopped there
        (:func:`ahmc.core.objectives.step_jumps_estimate`).  Same target, less noise: one chain's 10-iteration
        round is all this tuner learns from (on Pima, 1.26x PyMC's NUTS in min ESS per gradient over
        50 seeds against 1.16x; docs/decisions.md).  It costs a few vector operations per
        trajectory.  Once the tuner is frozen (``freeze_after``) no reward can move the arm and the
        steps are not collected: the ``reward`` stat of those rounds is the made jumps'.
        :class:`AdaptiveRMHMC` measures jumps in its metric and takes ``"transition"`` only (with a
        ``constant_metric``, plain HMC, it follows this default).
    min_steps_fraction : float
        ``n_steps`` is uniform on ``{max(1, ceil(f L))..L}``: 0 (default) is the paper's
        ``{1..L}``; 0.5 the upper half, which gives more ESS of the means per gradient and
        less of the variances (docs/decisions.md, "Leapfrog jitter").
    schedule : {"inverse_sqrt", "exponential"}
        Annealing of the adaptation probability ``p_i``; ``decay`` is the exponential's rate.
    k : int, optional
        ``p_i = max(i - k + 1, 1)^(-1/2)``; default the number of rounds in tune.
    freeze_after : int, "tune" or "warmup", optional
        Rounds after which the arm never moves (``"tune"``/``"warmup"``: at the end of tune).
    adapt_mass_matrix : bool
        Adapt a diagonal mass matrix during warm-up (ignored with ``potential``/``scaling``).
    dense_mass : bool or "auto"
        Adapt a dense mass matrix instead (a ``QuadPotentialFullAdapt`` estimated in Stan's windows
        per chain, correlations shrunk for short windows); the reward's jumps are then whitened by
        its Cholesky factor.  For correlated posteriors of up to a few hundred dimensions (docs/algorithm.md,
        "Dense mass matrix").  ``"auto"``: estimate the dense matrix, but keep only its diagonal
        after a window whose correlations do not stand out from the noise of estimating them
        (:func:`ahmc.core.mass_matrix.prefers_dense`); above ``d = 200`` the diagonal adaptation runs instead.
    initial_step_size : float, optional
        First step size (default: PyMC's ``0.25 / n**0.25``).
    metric_fraction : float, optional
        Share of tune before the GP rounds (default 0.5; 0.9 with ``dense_mass=True`` or ``"auto"``,
        whose per-chain estimate needs the draws; 0 when both boxes are given and the mass matrix is
        fixed: the paper's algorithm).
    step_size_factors, max_integration_time, warmup_integration_time, num_steps_cap, num_step_sizes
        Automatic box and metric-phase ``L`` (defaults as in the JAX engine).
    exploit_after_warmup : bool
        Start the draws from the arm maximising the GP mean.
    capacity, lengthscale, noise_variance, alpha, delta, initial_design
        Passed to :func:`ahmc.core.gp_ucb` (``capacity=64``: the GP update costs O(capacity^3)).
        ``noise_variance=0.5`` (the JAX engine and :class:`AdaptiveRMHMC`: 0.1): each chain has its own
        tuner, and one chain's 10-iteration round is a noisy reward.  Measured on Pima, the rewards of
        repeated rounds at one arm have a standard deviation of ~35% of their mean, and the best reward
        seen is ~2x a good arm's mean, so in the tuner's units (best = ``alpha``, then 4) the noise sd was
        ~4 x 0.35 / 2 = 0.7, variance ~0.5. With ``alpha=8`` (the default since 2026-12-06) it is ~1.4: the
        GP trusts one round more than its noise warrants, which measured better (docs/decisions.md).
    pooled : bool
        ``True``: one tuner for all chains, as the JAX adapters have with vectorized chains.  Every
        round the chains' rewards are averaged into one observation of weight ``chains`` and every
        chain runs the same arm; in warm-up the chains share the dual averaging (their mean
        acceptance) and the diagonal mass-matrix estimate (all their draws), as the JAX engine does
        (a dense mass matrix stays per chain).  For that PyMC steps the chains in lockstep in one
        process (its population sampling, as for ``DEMetropolis``), so ``cores`` does not
        parallelize them (a ``UserWarning`` says so).  It raises the min ESS per gradient on the
        logistic regressions and on stochastic volatility (docs/decisions.md, "PyMC").  ``False`` (default):
        one tuner per chain, chains in separate processes with ``cores > 1``.
    **kwargs
        Passed to ``BaseHMC`` (``target_accept`` of the warm-up, ``Emax``, ``scaling``, ``potential``, ``model``, ...).
    """

    name = "adaptive_hmc"
    default_blocked = True
    stats_dtypes_shapes = {name: (dtype, shape) for name, dtype, shape, _ in STATS}
    _state_class = AdaptiveHMCState
    @staticmethod
    def _progressbar_config(n_chains=1):
        """PyMC's progress-bar columns: NUTS's (divergences, step size, gradients) plus the arm's ``L``."""
        from rich.progress import TextColumn
        from rich.table import Column

        columns = [
            TextColumn("{task.fields[divergences]}", table_column=Column("Divergences", ratio=1)),
            TextColumn("{task.fields[step_size]:0.3f}", table_column=Column("Step size", ratio=1)),
            TextColumn("{task.fields[max_steps]}", table_column=Column("L", ratio=1)),
            TextColumn("{task.fields[n_steps]}", table_column=Column("Grad evals", ratio=1)),
        ]
        return columns, {name: [0] * n_chains for name in _PROGRESS_STATS}

    @staticmethod
    def _make_progressbar_update_functions():
        def update_stats(stats):
            return {name: stats[name] for name in _PROGRESS_STATS} | {"failing": stats["divergences"] > 0}

        return (update_stats,)

    #: One tuner for all chains (PooledAdaptiveHMC, a population step method), or one per chain.
    pooled_step = False

    def __init__(self, vars=None, *, config=None, paper_preset=False, pooled=False, model=None, **kwargs):
        warm_start = kwargs.pop("warm_start", None)
        tuning, kwargs = resolve_options({"config": config, "paper_preset": paper_preset, **kwargs}, type(self).__name__)
        self._fisher_diag = tuning.get("metric_recipe") == "fisher_diag"
        (step_size_bounds, num_steps_bounds, round_length, objective, divergence_penalty, jump_estimate, schedule, k,
         decay, freeze_after, adapt_mass_matrix, initial_step_size, metric_fraction, step_size_factors,
         max_integration_time, warmup_integration_time, num_steps_cap, num_step_sizes, exploit_after_warmup,
         capacity, lengthscale, noise_variance, alpha, delta, min_steps_fraction, dense_mass,
         log_step_size, warm_start_weight, divergence_retry, num_num_steps,
         log_num_steps, initial_design) = _pymc_tuning(tuning, kwargs, type(self).__name__)
        _check_step_options(type(self), kwargs)
        if not isinstance(pooled, (bool, np.bool_)):
            raise ValueError(f"pooled must be True or False; got {pooled!r}.")
        if pooled and not self.pooled_step:
            fix = ("use PooledAdaptiveHMC(...) (the same options): one tuner for all chains is a population step "
                   "method, which PyMC steps in lockstep in one process" if type(self) is AdaptiveHMC
                   else "it tunes each chain alone")
            raise ValueError(f"{type(self).__name__}(pooled=True) is not available: {fix}.")
        model = modelcontext(model)
        value_vars = model.continuous_value_vars if vars is None else get_value_vars_from_user_vars(vars, model)
        refuse_discrete(value_vars, type(self).__name__,
                        f"Give them their own step, e.g. pm.sample(step=[{type(self).__name__}(vars=[<continuous "
                        f"vars>]), pm.Metropolis(vars=[...])]), or leave them out of vars and PyMC assigns one.")
        # Check every option before compiling anything (core raises ValueError on bad values).
        if step_size_bounds is not None:
            search_space(step_size_bounds, (1, 1))
        if num_steps_bounds is not None:
            search_space((1.0, 1.0), whole_number_pair("num_steps_bounds", num_steps_bounds))
        self._tuner_options = dict(capacity=capacity, lengthscale=lengthscale, noise_variance=noise_variance,
                                   alpha=alpha, delta=delta, schedule=schedule, decay=decay,
                                   initial_design=0 if warm_start is not None else initial_design)
        gp_ucb(search_space((1.0, 1.0), (1, 1)), k=1 if k is None else k, **self._tuner_options)
        self._adapts_metric = bool(adapt_mass_matrix) and not ({"potential", "scaling"} & set(kwargs))
        if objective is None:  # one chain's rounds keep the paper's reward; pooled rounds the strict ESS
            objective = default_objective(self._adapts_metric, one_chain_rounds=not self.pooled_step)
        self._objective = get_objective(objective, divergence_penalty)
        self._divergence_retry = divergence_retry
        # A built-in objective takes the round's sums in Python numbers (cheap); a user callable gets arrays.
        self._objective_takes_numbers = isinstance(objective, str)
        if jump_estimate not in ("trajectory", "transition"):
            raise ValueError(f"jump_estimate must be 'trajectory' (every leapfrog step, the default) or "
                             f"'transition' (the jumps made, the paper's); got {jump_estimate!r}.")
        self._jump_estimate = jump_estimate
        if not isinstance(round_length, (int, np.integer)) or round_length < 1:
            raise ValueError(f"round_length must be a positive integer; got {round_length!r}.")
        if not (freeze_after is None or freeze_after in ("tune", "warmup") or (isinstance(freeze_after, int) and freeze_after >= 0)):
            raise ValueError(f"freeze_after must be None, 'tune' or an integer >= 0; got {freeze_after!r}.")
        search_space(tuple(step_size_factors), (1, int(num_steps_cap)), num_step_sizes=num_step_sizes,
                     num_num_steps=num_num_steps, log_num_steps=log_num_steps)
        for name, value in (("max_integration_time", max_integration_time),
                            ("warmup_integration_time", warmup_integration_time)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0; got {value!r}.")
        if initial_step_size is not None and not (math.isfinite(initial_step_size) and initial_step_size > 0):
            raise ValueError(f"initial_step_size must be a finite number > 0; got {initial_step_size!r}.")
        if metric_fraction is None:
            fixed_metric = not self._adapts_metric
            # A dense matrix is estimated from one chain's draws: its error grows as sqrt(d / draws), and a
            # longer metric phase paid for itself in ESS per gradient (docs/decisions.md, "Dense mass matrix").
            metric_fraction = (0.0 if step_size_bounds and num_steps_bounds and fixed_metric
                               else DENSE_METRIC_FRACTION if dense_mass else 0.5)
        if not 0 <= metric_fraction < 1:
            raise ValueError(f"metric_fraction must be in [0, 1); got {metric_fraction!r}.")
        self._step_size_bounds, self._num_steps_bounds = step_size_bounds, num_steps_bounds
        self._round_length, self._k, self._freeze_after = int(round_length), k, freeze_after
        self._metric_fraction, self._exploit = float(metric_fraction), bool(exploit_after_warmup)
        self._step_size_factors, self._num_step_sizes = tuple(step_size_factors), int(num_step_sizes)
        self._log_step_size = bool(log_step_size)
        # The automatic box's L columns, as in the JAX routes; a given num_steps_bounds has every integer.
        self._l_columns = (None, False) if num_steps_bounds else (int(num_num_steps), bool(log_num_steps))
        self._max_time, self._warmup_time = float(max_integration_time), float(warmup_integration_time)
        self._num_steps_cap = int(num_steps_cap)
        self._warmup_max_steps = min(self._num_steps_cap, WARMUP_MAX_STEPS)  # the metric phase's L cap
        self._min_steps_fraction = check_min_steps_fraction(min_steps_fraction)
        if not (isinstance(dense_mass, (bool, np.bool_)) or (isinstance(dense_mass, str) and dense_mass == "auto")):
            raise ValueError(f"dense_mass must be True, False or 'auto'; got {dense_mass!r}.")
        if dense_mass and (not adapt_mass_matrix or {"potential", "scaling"} & set(kwargs)):
            raise ValueError(f"dense_mass={dense_mass!r} adapts a dense mass matrix: it needs adapt_mass_matrix=True "
                             f"and no potential or scaling (for a fixed dense matrix pass "
                             f"potential=QuadPotentialFull(cov)).")

        super().__init__(vars, model=model, **kwargs)
        if "potential" not in kwargs and "scaling" not in kwargs:  # replace BaseHMC's default metric
            self.potential = self._warmup_potential(dense_mass, adapt_mass_matrix)
        self.integrator = _LeapfrogReusingStart(self.potential, self._logp_dlogp_func, _samples_every_variable(self))
        self._uses_center = needs_center(self._objective)
        if self._uses_center and not isinstance(self.potential, (_WarmupDiagAdapt, _WarmupFullAdapt)):
            raise ValueError(
                f"objective={objective!r} measures the squares about the posterior mean estimated with the mass "
                f"matrix, so it needs an adapted mass matrix (adapt_mass_matrix=True and no potential, "
                f"scaling or Riemannian metric; got {type(self.potential).__name__}). "
                f"Use objective='normalized_esjd' or let the step adapt the mass matrix.")
        if initial_step_size is not None:
            self.step_size = float(initial_step_size)
            self.step_adapt = DualAverageAdaptation(self.step_size, self.target_accept, 0.05, 0.75, 10)
        self._tuner_cache = self._settings_cache = (None, None)
        self._arm = None
        self._cold_step_size = float(self.step_adapt.current(False))  # a failed warm start's restart
        self._init_warm_start(warm_start, model, value_vars, warm_start_weight)
        self._reset_chain(tune=0)

    def _warmup_potential(self, dense_mass, adapt_mass_matrix):
        """The metric the warm-up adapts (PyMC's ``init="adapt_full"`` / ``"adapt_diag"`` settings), or a fixed
        identity without adaptation."""
        size = self.potential._n
        rng = self.rng.spawn(1)[0]
        auto = isinstance(dense_mass, str)
        if dense_mass and not (auto and size > DENSE_AUTO_MAX_DIM):
            return _WarmupFullAdapt(size, np.zeros(size), np.eye(size), 10, rng=rng, auto=auto)
        if adapt_mass_matrix:
            return _WarmupDiagAdapt(size, np.zeros(size), np.ones(size), 10, rng=rng, fisher=self._fisher_diag)
        return QuadPotentialDiag(np.ones(size, dtype=self.potential.dtype), rng=rng)

    # ---- per-chain state -------------------------------------------------------------------
    def _reset_chain(self, tune):
        # The schedule every adapter reads (ahmc.core.schedule): metric phase, rounds in tune, k, freezing.
        self._plan = plan_warmup(
            int(tune), metric_fraction=self._metric_fraction, round_length=self._round_length,
            adapt_mass_matrix=self._adapts_metric, auto_box=not (self._step_size_bounds and self._num_steps_bounds),
            k=self._k,
            freeze_after=self._freeze_after)
        self._num_tune_rounds = self._plan.num_warmup_rounds
        self._num_warmup = self._plan.metric_phase_length
        self._chain_iteration = 0
        self._tune_length, self._late_tune_accept, self._tune_round_moments = int(tune), [], None
        self._tuner_state = self._round_stats = self._search_box = self._step_jumps = None
        self._step_values, self._collect_steps, self._frozen = None, False, False

    def setup_chain(self, rng, tune, draws):
        super().setup_chain(rng, tune, draws)
        self.integrator.new_chain()  # a new chain (perhaps with new data): evaluate its start afresh
        self._restart_step_size(self._cold_step_size)  # (a previous chain may have restarted it elsewhere)
        self.potential.reset()
        self._reset_chain(tune)
        if isinstance(self.potential, _WarmupFullAdapt):
            self.potential.set_warmup(self._num_warmup)
        self._setup_warm_check(int(tune))

    def _schedule(self):
        """``(k, freeze_after)`` of this chain's tuner (the plan's: k = rounds in tune unless given)."""
        return self._plan.k, self._plan.freeze_rounds

    def _tuner(self):
        """The core tuner for this chain's box (rebuilt after a ``sampling_state`` restore)."""
        k, freeze = self._schedule()
        key = (self._search_box, k, freeze)
        if self._tuner_cache[0] != key:
            eps_lo, eps_hi, l_lo, l_hi = self._search_box
            space = search_space((eps_lo, eps_hi), (int(l_lo), int(l_hi)), num_step_sizes=self._num_step_sizes,
                                 log_step_size=self._log_step_size or self._step_size_bounds is None,
                                 num_num_steps=self._l_columns[0], log_num_steps=self._l_columns[1])
            self._tuner_cache = (key, gp_ucb(space, k=k, freeze_after=freeze, **self._tuner_options))
        return self._tuner_cache[1]

    def _round_settings(self):
        """``(eps, L, p_i, i, round_stats)`` of the running round, cached per tuner state (by identity);
        ``round_stats`` are the per-iteration stats that stay fixed within the round."""
        if self._settings_cache[0] is not self._tuner_state:
            eps, num_steps = self._tuner().arm(self._tuner_state)
            i = int(self._tuner_state.round) + 1
            k, _ = self._schedule()
            p = adapt_probability(i, schedule=self._tuner_options["schedule"], k=k, decay=self._tuner_options["decay"],
                                  xp=math) * (i < int(self._tuner_state.freeze_round))
            round_stats = {"tuning_round": i, "reward": np.nan, "arm_changed": False, "adapt_probability": p,
                           **dict(zip(_BOX_STATS, self._search_box)),
                           "num_num_steps": self._l_columns[0] or 0, "log_num_steps": self._l_columns[1]}
            self._settings_cache = (self._tuner_state, (float(eps), int(num_steps), p, i, round_stats))
        return self._settings_cache[1]

    def _eps_star(self) -> float:
        """The warm-up's step size, around which the automatic box is centred."""
        return float(self.step_adapt.current(False))

    def _start_rounds(self):
        """End of warm-up: freeze the metric, set the search box around eps*, start the tuner."""
        eps_star = self._eps_star()
        auto_eps, auto_l = automatic_box(eps_star, self._step_size_factors, self._max_time, self._num_steps_cap)
        eps_box = self._step_size_bounds or tuple(auto_eps)
        l_box = self._num_steps_bounds or (1, int(auto_l))
        self._search_box = tuple(float(v) for v in (*eps_box, *l_box))  # Python numbers: a cheap cache key
        tuner = self._tuner()
        first = tuner.space.arm_index(eps_star, steps_for(self._warmup_time, eps_star, self._num_steps_cap))
        self._tuner_state = self._first_tuner_state(tuner, first)
        self._begin_rounds()

    def _begin_rounds(self):
        """This chain's side of the end of warm-up: the metric stops adapting, the first round starts."""
        if isinstance(self.potential, (_WarmupDiagAdapt, _WarmupFullAdapt)):
            self.potential.is_adapting = False
        self._round_stats = round_init(None)
        self._step_jumps = None  # started by the round's first trajectory (its arm's L)

    # ---- one iteration ---------------------------------------------------------------------
    def astep(self, q0):
        if self._check is not None:  # warm_start: the snapshot's check, at its metric and arm
            q, stats = self._check_iteration(q0, self._warmup_iteration)
            self._last_position = q.data
            return q, [stats]
        if self._search_box is None and self._chain_iteration >= self._num_warmup:
            self._start_rounds()
        in_rounds = self._search_box is not None
        self.adapt_step_size = not in_rounds  # the tuner owns eps in the rounds
        self._arm = self._round_settings()[:2] if in_rounds else None
        self._frozen = in_rounds and self._round_settings()[3] >= int(self._tuner_state.freeze_round)
        # Every step's jump only while a reward can still move the arm (a frozen tuner learns nothing).
        self._collect_steps = in_rounds and self._jump_estimate == "trajectory" and not self._frozen
        q, (stats,) = super().astep(q0)
        stats.update(self._used)  # the step size actually used (step_adapt's stats overwrote it)
        stats["dense_mass_matrix"] = getattr(self.potential, "kept_correlations", False)
        if getattr(self.potential, "metric_moved", False) and not in_rounds \
                and self._chain_iteration < self._num_warmup - MIN_RESTART_ITERATIONS:
            self._restart_step_size(self.step_adapt.current(True))
        self._round_reward = None
        stats.update(self._record_round(q0.data, q.data, stats) if in_rounds else _WARMUP_STATS)
        if self._round_reward is not None:  # the round ended: score its arm
            self._end_round(self._round_reward, stats)
        self._last_position = q.data
        self._check_tune_end(stats)
        self._chain_iteration += 1
        return q, [stats]

    def _warmup_iteration(self, q0):
        """One HMC iteration outside the rounds, with the warm-up's stats."""
        q, (stats,) = super().astep(q0)
        stats.update(self._used)
        stats["dense_mass_matrix"] = getattr(self.potential, "kept_correlations", False)
        stats.update(_WARMUP_STATS)
        return q, stats

    def _metric_variances(self):
        """The variances the mass matrix in force assumes, per coordinate (None for a metric it does not adapt)."""
        if isinstance(self.potential, _WarmupFullAdapt):
            return np.diag(np.asarray(self.potential._cov))
        if isinstance(self.potential, _WarmupDiagAdapt):
            return np.asarray(self.potential._var)
        return None

    def _scale_mismatch_warning(self):
        """A warning when the draws of tune's GP rounds (metric fixed) spread far more than the mass matrix
        assumes, or far less than their gradients allow (:data:`ahmc.core.mass_matrix.UNEXPLORED_PRODUCT`):
        the metric phase did not find the posterior's scale (e.g. sds 1e-6 and 1e6 in one model)."""
        moments, assumed = self._tune_round_moments, self._metric_variances()
        if moments is None or assumed is None or moments[0] < 20:
            return None
        count, total, squares, grad_squares = moments
        variance = squares / count - (total / count) ** 2
        ratio, product = variance / assumed, variance * grad_squares / count
        wide, narrow = int(np.argmax(ratio)), int(np.argmin(product))
        if ratio[wide] > SCALE_MISMATCH_RATIO:
            seen = f"draws vary {ratio[wide]:.3g} times more than its mass matrix assumes (flat coordinate {wide})"
        elif product[narrow] < UNEXPLORED_PRODUCT and np.any(grad_squares > 0):
            seen = (f"draws have explored about {math.sqrt(product[narrow]):.2g} of the scale their gradients show "
                    f"(flat coordinate {narrow}: var(x) * E[grad^2] = {product[narrow]:.2g}, at least 1 for draws "
                    "from the posterior)")
        else:
            return None
        return SamplerWarning(
            WarningType.BAD_PARAMS,
            f"AdaptiveHMC: at the end of tune this chain's {seen}: the warm-up did not find the posterior's scale, "
            "and the draws explore it too slowly to be trusted (low ESS). Give more tune, use PooledAdaptiveHMC (the "
            "chains' pooled estimate starts from their spread), or pass scaling= with the posterior variances.",
            "error", self.iter_count)

    def _check_tune_end(self, stats):
        """Report, as PyMC's own warning stat, a chain that ends tune without moving or with a mass matrix that
        does not fit its draws (its draws would not be the posterior's): PyMC logs it when sampling ends, from
        worker processes too."""
        if self._search_box is not None and self._chain_iteration < self._tune_length:
            end = getattr(self.integrator, "previous_end", None)  # the chain's position, with its gradient
            q = np.asarray(self._last_position, dtype=float)
            g = np.asarray(end.q_grad, dtype=float) if end is not None else np.zeros_like(q)
            moments = self._tune_round_moments or (0, *(np.zeros_like(q),) * 3)
            self._tune_round_moments = (moments[0] + 1, moments[1] + q, moments[2] + q * q, moments[3] + g * g)
        window = min(STUCK_WINDOW, self._tune_length)
        if self._chain_iteration >= self._tune_length - window and self._chain_iteration < self._tune_length:
            self._late_tune_accept.append(float(stats["accepted"]))
        if self._chain_iteration != self._tune_length - 1 or not self._late_tune_accept:
            return
        acceptance = float(np.mean(self._late_tune_accept))
        eps = self._eps_star()
        if not (math.isfinite(eps) and eps <= FLAT_STEP_SIZE):
            stats["warning"] = SamplerWarning(
                WarningType.BAD_PARAMS,
                f"AdaptiveHMC: tune's step size grew to {eps:.3g}: the log density is flat along some direction at "
                "every scale tried, as in an improper posterior (a flat prior that no likelihood term bounds). The "
                "draws keep growing without bound and represent no posterior. Give every parameter a proper prior, "
                "or check that the data enter the likelihood.", "error", self.iter_count)
        elif acceptance < STUCK_ACCEPTANCE:
            stats["warning"] = SamplerWarning(
                WarningType.BAD_ACCEPTANCE,
                f"AdaptiveHMC: this chain accepted {acceptance:.1%} of its proposals over the last {window} tune "
                "iterations: it is stuck, and its draws do not represent the posterior. Start it elsewhere "
                "(initvals), give more tune, or check the model for a region where the log density is not finite.",
                "error", self.iter_count)
        else:
            stats["warning"] = self._scale_mismatch_warning() or stats.get("warning")

    def _record_round(self, previous, position, stats):
        scale = getattr(self.potential, "_stds", None)
        # The mass matrix's window: its mean goes with the variances in _stds (fixed in the rounds).
        if isinstance(self.potential, _WarmupFullAdapt):  # dense: whiten by the covariance's Cholesky factor
            whiten = self.potential.whiten
            center = whiten(self.potential._foreground_cov.mean) if self._uses_center else None
            previous, position = whiten(previous), whiten(position)
        else:
            center = self.potential._foreground_var.mean if self._uses_center else None
        # the divergence penalty counts a divergence the retry rescued: the arm is still too coarse there
        round_stats = round_update(self._round_stats, previous, position, stats["n_steps"], stats["acceptance_rate"],
                                   stats["diverging"] or stats["retried"], scale, center)
        out = self._round_settings()[4]  # copied by the caller's stats.update
        if self._step_values is not None:
            if self._step_jumps is None:
                self._step_jumps = step_jumps_init(self._arm[1])
            self._step_jumps = step_jumps_update(self._step_jumps, self._step_values)
        if round_stats.num_iterations >= self._round_length:
            out = dict(out)
            if self._step_jumps is not None:  # jump_estimate="trajectory": every step's jump, not the made ones
                estimate = step_jumps_estimate(self._step_jumps, self._fewest_steps(self._arm[1]))
                if math.isfinite(estimate):
                    round_stats = round_stats._replace(sum_squared_jump=estimate * round_stats.num_iterations)
                self._step_jumps = None
            sums = round_stats if self._objective_takes_numbers else round_arrays(round_stats)
            reward = self._objective(sums, self._arm[1])
            if not math.isfinite(reward):  # counted as the worst reward so far; say so once
                warnings.warn(NONFINITE_REWARD_MESSAGE, UserWarning, stacklevel=2)
            self._round_reward = float(reward)  # scored by _end_round once the stats are complete
            round_stats = round_init(None)
        self._round_stats = round_stats
        return out

    def _end_round(self, reward, stats):
        """Give the round's reward to the tuner and record what it did in ``stats``."""
        stats.update(self._score(reward, self.rng.uniform(), weight=1.0))

    def _score(self, reward, uniform, weight):
        """One tuner update (and, at the end of tune, the move to the GP mean's best arm):
        ``{"reward", "arm_changed"}`` for the stats."""
        with contextlib.nullcontext() if self._frozen else _single_threaded_blas():  # frozen: no solves
            self._tuner_state, info = self._tuner().update(self._tuner_state, reward, uniform, weight, lazy=True)
        i, state = int(info.round), self._tuner_state
        if self._exploit and i == self._num_tune_rounds and i < int(state.freeze_round):  # tune ends: GP mean's best
            best = np.argmax(self._tuner().surrogate(self._tuner_state).mean)
            self._tuner_state = state._replace(arm=np.asarray(best, dtype=np.int32))
        return {"reward": float(info.reward), "arm_changed": int(self._tuner_state.arm) != int(info.arm)}

    def _hamiltonian_step(self, start, p0, step_size) -> HMCStepData:
        if self._arm is None:
            cap = int(metric_phase_max_steps(self._plan, self._chain_iteration, self._warmup_max_steps))
            max_steps = steps_for(self._warmup_time, step_size, cap)
        else:
            step_size, max_steps = self._arm
        lowest = self._fewest_steps(max_steps)
        n_steps = lowest + int(self.rng.random() * (max_steps - lowest + 1))  # uniform on {lowest..max_steps}
        trajectory = [] if self._collect_steps else None
        # In tune, whose step-size search tries steps large enough to blow a trajectory up (a log-scale
        # parameter can reach overflow within one step), a trajectory whose energy turns NaN or spans
        # more than _BLOWN_UP_SPAN nats stops there, as the divergence it would be at its end (the span
        # reads the same on the reversed trajectory, so HMC stays exact), and NumPy's overflow
        # warnings are silenced: the divergence reports it.  Not in the draws, whose arms stay in the
        # tuned box: the guard costs 2-4 us per iteration, about 2% of one on a cheap model.
        guard = self.tune
        with np.errstate(over="ignore", invalid="ignore") if guard else contextlib.nullcontext():
            end, div_info, energy_change, taken = self._integrate(start, step_size, n_steps, trajectory, guard)
            accept = 1.0 if energy_change <= 0 else float(np.exp(-energy_change))
            accepted = div_info is None and self.rng.random() < accept
            retried = div_info is not None and self._arm is not None and self._divergence_retry is not None
            if retried:
                end, accepted, div_info, extra = self._retry(start, step_size, n_steps, guard)
                taken += extra
            elif not accepted:
                end = start
            if isinstance(self.integrator, _LeapfrogReusingStart):
                self.integrator.previous_end = end  # the next iteration starts here
            self._step_values = None if trajectory is None else self._trajectory_values(start, trajectory, n_steps)
        self._used = {"step_size": float(step_size), "max_steps": int(max_steps)}
        stats = {"n_steps": taken, "acceptance_rate": accept, "accepted": float(accepted), "energy_error": energy_change,
                 "energy": end.energy, "model_logp": end.model_logp, "retried": retried}
        return HMCStepData(end, accept, div_info, stats)

    def _retry(self, start, step_size, n_steps, guard):
        """After a divergence in the rounds, one finer try from the same momentum, accepted by delayed
        rejection (:mod:`ahmc.core.retry`): ``(end, accepted, divergence info or None, leapfrog steps)``."""
        factor = self._divergence_retry
        fine, div_info, _, taken = self._integrate(start, step_size / factor, factor * n_steps, None, guard)
        if div_info is not None:
            return start, False, div_info, taken
        flipped = fine._replace(p=-fine.p, v=-fine.v)
        _, ghost_diverges, _, ghost_taken = self._integrate(flipped, step_size, n_steps, None, guard)
        # this step never accepts a divergent trajectory: both first tries' acceptances are 0
        log_ratio = retry_log_acceptance(float(start.energy), float(fine.energy), ghost_diverges is not None, 0.0, 0.0)
        accepted = math.log(self.rng.random()) < log_ratio
        return (fine if accepted else start), accepted, None, taken + ghost_taken

    def _integrate(self, start, step_size, n_steps, trajectory, guard):
        """``n_steps`` leapfrog steps from ``start``: ``(end, divergence info or None, energy error, steps
        taken)``; appends each state to ``trajectory`` unless it is None; ``guard``: stop a blown-up
        trajectory early."""
        state = last = start
        div_info, energy_change, taken = None, np.inf, 0
        energy_low = energy_high = float(start.energy)
        try:
            for _ in range(n_steps):
                last, taken = state, taken + 1
                state = self.integrator.step(step_size, state)
                if trajectory is not None:
                    trajectory.append(state)
                if not guard:
                    continue
                energy = float(state.energy)  # Python floats compare faster than NumPy scalars
                if energy < energy_low:
                    energy_low = energy
                elif energy > energy_high:
                    energy_high = energy
                elif energy == energy:
                    continue  # within the span so far: the common case
                else:
                    break  # NaN
                if energy_high - energy_low > _BLOWN_UP_SPAN:  # also when one of them is infinite
                    break
        except IntegrationError as err:
            div_info = DivergenceInfo("Integration failed.", err, last, None)
        else:
            energy_change = state.energy - start.energy
            if not np.isfinite(energy_change) or energy_high - energy_low > _BLOWN_UP_SPAN:
                div_info = DivergenceInfo("Divergence encountered, bad energy.", None, last, state)
                energy_change = np.inf
            # One-sided, as in PyMC's NUTS, Stan and BlackJAX: a large energy *drop* is a trajectory falling
            # toward the mode from a far start, accepted with probability 1; counting it as a divergence
            # (PyMC's HamiltonianMC does) kept such chains at their start for the whole run.
            elif energy_change > self.Emax:
                message = f"Divergence encountered, energy change larger than {self.Emax}."
                div_info = DivergenceInfo(message, None, last, state)
        return state, div_info, energy_change, taken

    def _trajectory_values(self, start, trajectory, n_steps):
        """Per leapfrog step ``l``: acceptance probability had the trajectory stopped there times the
        whitened squared jump from the start (0 where the energy error is not finite or above ``+Emax``,
        and for the steps after a blown-up one).  A few NumPy calls per trajectory, Python floats per step."""
        values = [0.0] * n_steps
        if not trajectory:
            return values
        jumps = np.array([s.q.data for s in trajectory])  # (n, d); np.array is cheaper than np.stack here
        jumps -= start.q.data
        if isinstance(self.potential, _WarmupFullAdapt):
            jumps = self.potential.whiten(jumps.T).T
        else:
            scale = getattr(self.potential, "_stds", None)
            if scale is not None:
                jumps /= scale
        squared = np.square(jumps, out=jumps).sum(axis=1).tolist()
        start_energy, limit = float(start.energy), self.Emax
        for steps, (state, jump) in enumerate(zip(trajectory, squared)):
            error = float(state.energy) - start_energy
            if math.isfinite(error) and error <= limit:
                values[steps] = jump if error <= 0 else math.exp(-error) * jump
        return values

    def _fewest_steps(self, max_steps) -> int:
        """Lowest leapfrog count of an iteration, ``n ~ U{lowest..max_steps}`` (1 unless ``min_steps_fraction``)."""
        return int(min_num_steps(max_steps, self._min_steps_fraction)) if self._min_steps_fraction else 1

    @staticmethod
    def competence(var, has_grad):
        if var.dtype in discrete_types or not has_grad:
            return Competence.INCOMPATIBLE
        return Competence.COMPATIBLE




_BLAS_CONTROLLER = None


def _single_threaded_blas():
    """Run the GP's small solves on one BLAS thread.  Inside PyMC's sampling loop a
    second OpenBLAS thread made a 128 x 128 solve 50-300x slower (87 ms; measured)."""
    global _BLAS_CONTROLLER
    if _BLAS_CONTROLLER is None:
        _BLAS_CONTROLLER = ThreadpoolController()
    return _BLAS_CONTROLLER.limit(limits=1, user_api="blas")


_BOX_STATS = ("step_size_min", "step_size_max", "max_steps_min", "max_steps_max")


_WARMUP_STATS = {"tuning_round": 0, "reward": np.nan, "arm_changed": False, "adapt_probability": np.nan,
                 **dict(zip(_BOX_STATS, (np.nan, np.nan, 0, 0))), "num_num_steps": 0, "log_num_steps": False}
