"""PyMC step method: HMC whose step size and path length an annealed GP-UCB bandit tunes.

>>> with model:                                            # doctest: +SKIP
...     idata = pm.sample(step=AdaptiveHMC())

Each chain runs in two phases.

* **Metric phase** (the first ``metric_fraction`` of ``tune``): PyMC's own
  dual averaging of the step size and its diagonal mass-matrix adaptation (as
  NUTS does), with ``L`` uniform on ``{1..ceil(warmup_integration_time / eps)}``.
  This yields ``eps*`` and the metric.
* **Rounds** (the rest of ``tune`` and all draws): the metric is fixed, since a
  changing metric would move the optimal ``eps``.  Every ``round_length``
  iterations the round's reward, measured in the whitened metric, goes to
  :func:`ahmc.core.gp_ucb`, which may move ``(eps, L)`` inside a box around
  ``eps*``.  Each iteration draws its leapfrog count uniformly from
  ``{1..L}`` (Wang, Mohamed & de Freitas 2013, Algorithm 2).  The schedule's
  ``k`` defaults to the number of rounds in tune, so the adaptation
  probability is 1 during tune and then decays as ``p_i = (i - k + 1)^(-1/2)``.
  At the end of tune the arm is set to the maximiser of the GP mean
  (``exploit_after_warmup``), since the last UCB proposal is often exploratory.

Adapting after tune is deliberate: every arm's kernel leaves the posterior
invariant, ``p_i -> 0`` and the grid of arms is finite, so the chain stays
ergodic (paper, section 4).  ``freeze_after="tune"`` stops it at the end of
tune.  Per-draw stats (``step_size``, ``max_steps``, ``tuning_round``,
``reward``, ``arm_changed``, ``adapt_probability``, the search box) are enough to
rebuild the tuning history from the returned DataTree.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._extras import require

require("pymc", "pymc")
from pymc.model import modelcontext  # noqa: E402
from pymc.stats.convergence import SamplerWarning  # noqa: E402
from pymc.step_methods.compound import Competence  # noqa: E402
from pymc.step_methods.hmc import integration  # noqa: E402
from pymc.step_methods.hmc.base_hmc import BaseHMC, BaseHMCState, DivergenceInfo, HMCStepData  # noqa: E402
from pymc.step_methods.hmc.hmc import HamiltonianMC  # noqa: E402
from pymc.step_methods.hmc.integration import IntegrationError  # noqa: E402
from pymc.step_methods.hmc.quadpotential import QuadPotentialDiag, QuadPotentialDiagAdapt, QuadPotentialDiagAdaptState  # noqa: E402
from pymc.step_methods.state import dataclass_state  # noqa: E402
from pymc.step_methods.step_sizes import DualAverageAdaptation  # noqa: E402
from pymc.util import get_value_vars_from_user_vars  # noqa: E402
from pymc.vartypes import discrete_types  # noqa: E402
from threadpoolctl import ThreadpoolController  # noqa: E402

from ahmc.core import adapt_probability, get_objective, gp_ucb, round_init, round_update, search_space

__all__ = ["AdaptiveHMC", "STATS"]

#: (name, dtype, shape, meaning): the single source of ``AdaptiveHMC.stats_dtypes_shapes``.
STATS = (
    ("step_size", np.float64, [], "step size eps used in this iteration"),
    ("step_size_bar", np.float64, [], "PyMC's dual-averaged step size (moves in warm-up only)"),
    ("n_steps", np.int64, [], "leapfrog steps (gradient evaluations) taken"),
    ("max_steps", np.int64, [], "L of the arm: n_steps is uniform on {1..max_steps}"),
    ("accept", np.float64, [], "Metropolis acceptance probability"),
    ("accepted", np.float64, [], "1.0 if the proposal was accepted (float, like Metropolis)"),
    ("diverging", bool, [], "the trajectory diverged"),
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


class _WarmupDiagAdapt(QuadPotentialDiagAdapt):
    """PyMC's diagonal mass-matrix adaptation with an off switch for the GP rounds."""

    _state_class = _WarmupDiagAdaptState

    def reset(self):
        super().reset()
        self.is_adapting = True

    def update(self, sample, grad, tune):
        super().update(sample, grad, tune and self.is_adapting)


@dataclass_state
class AdaptiveHMCState(BaseHMCState):
    _tuner_state: Any  # core TunerState (None during warm-up)
    _round_stats: Any  # core RoundStats of the running round
    _search_box: Any  # (eps_lo, eps_hi, L_lo, L_hi), None during warm-up
    _chain_iteration: int
    _num_warmup: int
    _num_tune_rounds: int


class AdaptiveHMC(BaseHMC):
    """HMC with ``(eps, L)`` tuned by annealed GP-UCB while the chain runs.

    Parameters
    ----------
    vars : list, optional
        Continuous variables to sample (default: all continuous ones).
    step_size_bounds : (float, float), optional
        Box for ``eps``; default ``eps* x step_size_factors`` (log grid of ``num_step_sizes``).
    num_steps_bounds : (int, int), optional
        Box for ``L``; default ``(1, ceil(max_integration_time / eps*))``, capped at ``num_steps_cap``.
    round_length : int
        Iterations per round, ``m`` (10: the paper's ``B / k`` for 1000 tune, 100 rounds).
    objective : {"normalized_esjd", "esjd", "esjd_per_gradient"} or callable
        Reward of a round; a callable gets ``(RoundStats, L)``.
    schedule : {"inverse_sqrt", "exponential"}
        Annealing of the adaptation probability ``p_i``; ``decay`` is the exponential's rate.
    k : int, optional
        ``p_i = max(i - k + 1, 1)^(-1/2)``; default the number of rounds in tune.
    freeze_after : int, "tune" or "warmup", optional
        Rounds after which the arm never moves (``"tune"``/``"warmup"``: at the end of tune).
    adapt_mass_matrix : bool
        Adapt a diagonal mass matrix during warm-up (ignored with ``potential``/``scaling``).
    initial_step_size : float, optional
        First step size (default: PyMC's ``0.25 / n**0.25``).
    metric_fraction : float, optional
        Share of tune before the GP rounds (default 0.5; 0 when both boxes are
        given and the mass matrix is fixed: the paper's algorithm).
    step_size_factors, max_integration_time, warmup_integration_time, num_steps_cap, num_step_sizes
        Automatic box and metric-phase ``L`` (defaults as in the JAX engine).
    exploit_after_warmup : bool
        Start the draws from the arm maximising the GP mean.
    capacity, lengthscale, noise_variance, alpha, delta
        Passed to :func:`ahmc.core.gp_ucb` (``capacity=64``: the GP update costs O(capacity^3)).
    **kwargs
        Passed to ``BaseHMC`` (``target_accept`` of the warm-up, ``Emax``, ``scaling``, ``potential``, ``model``, ...).
    """

    name = "adaptive_hmc"
    default_blocked = True
    stats_dtypes_shapes = {name: (dtype, shape) for name, dtype, shape, _ in STATS}
    _state_class = AdaptiveHMCState
    _progressbar_config = staticmethod(HamiltonianMC._progressbar_config)
    _make_progressbar_update_functions = staticmethod(HamiltonianMC._make_progressbar_update_functions)

    def __init__(self, vars=None, *, step_size_bounds=None, num_steps_bounds=None, round_length=10,
                 objective="normalized_esjd", schedule="inverse_sqrt", k=None, decay=0.01, freeze_after=None,
                 adapt_mass_matrix=True, initial_step_size=None, metric_fraction=None,
                 step_size_factors=(0.5, 2.0), max_integration_time=4 * math.pi, warmup_integration_time=2.0,
                 num_steps_cap=256, num_step_sizes=100, exploit_after_warmup=True, capacity=64,
                 lengthscale=0.2, noise_variance=0.1, alpha=4.0, delta=0.1, model=None, **kwargs):
        model = modelcontext(model)
        value_vars = model.continuous_value_vars if vars is None else get_value_vars_from_user_vars(vars, model)
        discrete = [v.name for v in value_vars if v.dtype in discrete_types]
        if discrete:
            raise ValueError(
                f"AdaptiveHMC needs gradients and cannot sample the discrete variable(s) {discrete}. Give them "
                f"their own step, e.g. pm.sample(step=[AdaptiveHMC(vars=[<continuous vars>]), pm.Metropolis(vars=[...])]), "
                f"or leave them out of vars and PyMC assigns one."
            )
        # Check every option before compiling anything (core raises ValueError on bad values).
        if step_size_bounds is not None:
            search_space(step_size_bounds, (1, 1))
        if num_steps_bounds is not None:
            search_space((1.0, 1.0), num_steps_bounds)
        self._tuner_options = dict(capacity=capacity, lengthscale=lengthscale, noise_variance=noise_variance,
                                   alpha=alpha, delta=delta, schedule=schedule, decay=decay)
        gp_ucb(search_space((1.0, 1.0), (1, 1)), k=1 if k is None else k, **self._tuner_options)
        self._objective = get_objective(objective)
        if not isinstance(round_length, (int, np.integer)) or round_length < 1:
            raise ValueError(f"round_length must be a positive integer; got {round_length!r}.")
        if not (freeze_after is None or freeze_after in ("tune", "warmup") or (isinstance(freeze_after, int) and freeze_after >= 0)):
            raise ValueError(f"freeze_after must be None, 'tune' or an integer >= 0; got {freeze_after!r}.")
        search_space(tuple(step_size_factors), (1, int(num_steps_cap)), num_step_sizes=num_step_sizes)
        for name, value in (("max_integration_time", max_integration_time),
                            ("warmup_integration_time", warmup_integration_time)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0; got {value!r}.")
        if initial_step_size is not None and not (math.isfinite(initial_step_size) and initial_step_size > 0):
            raise ValueError(f"initial_step_size must be a finite number > 0; got {initial_step_size!r}.")
        if metric_fraction is None:
            fixed_metric = not adapt_mass_matrix or bool({"potential", "scaling"} & set(kwargs))
            metric_fraction = 0.0 if step_size_bounds and num_steps_bounds and fixed_metric else 0.5
        if not 0 <= metric_fraction < 1:
            raise ValueError(f"metric_fraction must be in [0, 1); got {metric_fraction!r}.")
        self._step_size_bounds, self._num_steps_bounds = step_size_bounds, num_steps_bounds
        self._round_length, self._k, self._freeze_after = int(round_length), k, freeze_after
        self._metric_fraction, self._exploit = float(metric_fraction), bool(exploit_after_warmup)
        self._step_size_factors, self._num_step_sizes = tuple(step_size_factors), int(num_step_sizes)
        self._max_time, self._warmup_time = float(max_integration_time), float(warmup_integration_time)
        self._num_steps_cap = int(num_steps_cap)

        super().__init__(vars, model=model, **kwargs)
        if "potential" not in kwargs and "scaling" not in kwargs:  # replace BaseHMC's default metric
            size = self.potential._n
            rng = self.rng.spawn(1)[0]
            if adapt_mass_matrix:
                self.potential = _WarmupDiagAdapt(size, np.zeros(size), np.ones(size), 10, rng=rng)
            else:
                self.potential = QuadPotentialDiag(np.ones(size, dtype=self.potential.dtype), rng=rng)
            self.integrator = integration.CpuLeapfrogIntegrator(self.potential, self._logp_dlogp_func)
        if initial_step_size is not None:
            self.step_size = float(initial_step_size)
            self.step_adapt = DualAverageAdaptation(self.step_size, self.target_accept, 0.05, 0.75, 10)
        self._tuner_cache = self._settings_cache = (None, None)
        self._arm = None
        self._reset_chain(tune=0)

    # ---- per-chain state -------------------------------------------------------------------
    def _reset_chain(self, tune):
        rounds = int(tune * (1 - self._metric_fraction)) // self._round_length
        self._num_tune_rounds = rounds
        self._num_warmup = int(tune) - rounds * self._round_length
        self._chain_iteration = 0
        self._tuner_state = self._round_stats = self._search_box = None

    def setup_chain(self, rng, tune, draws):
        super().setup_chain(rng, tune, draws)
        self.step_adapt.reset()
        self.potential.reset()
        self._reset_chain(tune)

    def _schedule(self):
        """``(k, freeze_after)`` for this chain: k = rounds in tune unless given."""
        k = self._k if self._k is not None else max(self._num_tune_rounds, 1)
        at_tune_end = self._freeze_after in ("tune", "warmup")
        return k, self._num_tune_rounds + 1 if at_tune_end else self._freeze_after

    def _tuner(self):
        """The core tuner for this chain's box (rebuilt after a ``sampling_state`` restore)."""
        k, freeze = self._schedule()
        key = (tuple(self._search_box), k, freeze)
        if self._tuner_cache[0] != key:
            eps_lo, eps_hi, l_lo, l_hi = self._search_box
            space = search_space((eps_lo, eps_hi), (int(l_lo), int(l_hi)), num_step_sizes=self._num_step_sizes)
            self._tuner_cache = (key, gp_ucb(space, k=k, freeze_after=freeze, **self._tuner_options))
        return self._tuner_cache[1]

    def _round_settings(self):
        """``(eps, L, p_i, i)`` of the running round, cached per tuner state (by identity)."""
        if self._settings_cache[0] is not self._tuner_state:
            eps, num_steps = self._tuner().arm(self._tuner_state)
            i = int(self._tuner_state.round) + 1
            k, _ = self._schedule()
            p = adapt_probability(i, schedule=self._tuner_options["schedule"], k=k, decay=self._tuner_options["decay"])
            p = float(p) * (i < int(self._tuner_state.freeze_round))
            self._settings_cache = (self._tuner_state, (float(eps), int(num_steps), p, i))
        return self._settings_cache[1]

    def _start_rounds(self):
        """End of warm-up: freeze the metric, set the search box around eps*, start the tuner."""
        eps_star = float(self.step_adapt.current(False))
        lo, hi = self._step_size_factors
        eps_box = self._step_size_bounds or (eps_star * lo, eps_star * hi)
        l_box = self._num_steps_bounds or (1, self._steps_for(self._max_time, eps_star))
        self._search_box = np.array([*eps_box, *l_box], dtype=np.float64)
        if isinstance(self.potential, _WarmupDiagAdapt):
            self.potential.is_adapting = False
        tuner = self._tuner()
        first = tuner.space.arm_index(eps_star, self._steps_for(self._warmup_time, eps_star))
        self._tuner_state = tuner.init()._replace(arm=np.asarray(first, dtype=np.int32))
        self._round_stats = round_init(np, np.float64)

    # ---- one iteration ---------------------------------------------------------------------
    def astep(self, q0):
        if self._tuner_state is None and self._chain_iteration >= self._num_warmup:
            self._start_rounds()
        in_rounds = self._tuner_state is not None
        self.adapt_step_size = not in_rounds  # the tuner owns eps in the rounds
        self._arm = self._round_settings()[:2] if in_rounds else None
        q, (stats,) = super().astep(q0)
        stats.update(self._used)  # the step size actually used (step_adapt's stats overwrote it)
        stats.update(self._record_round(q0.data, q.data, stats) if in_rounds else _WARMUP_STATS)
        self._chain_iteration += 1
        return q, [stats]

    def _record_round(self, previous, position, stats):
        scale = getattr(self.potential, "_stds", None)
        round_stats = round_update(self._round_stats, previous, position, stats["n_steps"], stats["accept"],
                                   stats["diverging"], scale)
        out = {"tuning_round": self._round_settings()[3], "reward": np.nan, "arm_changed": False,
               "adapt_probability": self._round_settings()[2], **dict(zip(_BOX_STATS, self._search_box))}
        if int(round_stats.num_iterations) >= self._round_length:
            reward = self._objective(round_stats, self._arm[1])
            with _single_threaded_blas():
                self._tuner_state, info = self._tuner().update(self._tuner_state, reward, self.rng.uniform(), lazy=True)
            i, state = int(info.round), self._tuner_state
            if self._exploit and i == self._num_tune_rounds and i < int(state.freeze_round):  # tune ends: GP mean's best
                best = np.argmax(self._tuner().surrogate(self._tuner_state).mean)
                self._tuner_state = state._replace(arm=np.asarray(best, dtype=np.int32))
            changed = int(self._tuner_state.arm) != int(info.arm)
            out.update(reward=float(info.reward), arm_changed=changed)
            round_stats = round_init(np, np.float64)
        self._round_stats = round_stats
        return out

    def _hamiltonian_step(self, start, p0, step_size) -> HMCStepData:
        if self._arm is None:
            max_steps = self._steps_for(self._warmup_time, step_size)
        else:
            step_size, max_steps = self._arm
        n_steps = int(self.rng.integers(1, max_steps + 1))
        state = last = start
        div_info, energy_change, taken = None, np.inf, 0
        try:
            for _ in range(n_steps):
                last, taken = state, taken + 1
                state = self.integrator.step(step_size, state)
        except IntegrationError as err:
            div_info = DivergenceInfo("Integration failed.", err, last, None)
        else:
            energy_change = state.energy - start.energy
            if not np.isfinite(energy_change):
                div_info = DivergenceInfo("Divergence encountered, bad energy.", None, last, state)
                energy_change = np.inf
            elif abs(energy_change) > self.Emax:
                message = f"Divergence encountered, energy change larger than {self.Emax}."
                div_info = DivergenceInfo(message, None, last, state)
        accept = 1.0 if energy_change <= 0 else float(np.exp(-energy_change))
        accepted = div_info is None and self.rng.random() < accept
        end = state if accepted else start
        self._used = {"step_size": float(step_size), "max_steps": int(max_steps)}
        stats = {"n_steps": taken, "accept": accept, "accepted": float(accepted), "energy_error": energy_change,
                 "energy": end.energy, "model_logp": end.model_logp}
        return HMCStepData(end, accept, div_info, stats)

    def _steps_for(self, integration_time, step_size):
        """``L = ceil(T / eps)``, within ``[1, num_steps_cap]``."""
        return int(np.clip(math.ceil(integration_time / step_size), 1, self._num_steps_cap))

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
                 **dict(zip(_BOX_STATS, (np.nan, np.nan, 0, 0)))}
