"""``AdaptiveRMHMC``: Riemann-manifold HMC (Girolami & Calderhead 2011) with the same GP-UCB tuning, and its metrics."""

from __future__ import annotations

import math
from typing import Any, NamedTuple
import numpy as np
import pytensor
import pytensor.tensor as pt
from pymc.blocking import RaveledVars
from pymc.model import modelcontext
from pymc.pytensorf import compile as compile_pytensor
from pymc.pytensorf import join_nonshared_inputs, rewrite_pregrad
from pymc.step_methods.hmc.base_hmc import HMCStepData
from pymc.step_methods.hmc.integration import IntegrationError
from pymc.step_methods.hmc.quadpotential import QuadPotential, QuadPotentialFull
from pytensor.gradient import jacobian
from ahmc.core.space import RMHMC_NUM_STEPS_CAP
from ahmc.core.config import resolve_options
from ahmc.core.snapshot import metric_name
from .. import _riemann
from .._pymc_fisher import assemble_fisher, fisher_parts, flatten_parts, unflatten_parts
from .._riemann import Geometry, NotPositiveDefiniteError
from ._step import _samples_every_variable, AdaptiveHMC, MODEL_METRICS, STATS


#: Stats that :class:`AdaptiveRMHMC` adds to :data:`STATS`.
RMHMC_STATS = (
    ("fixed_point_converged", bool, [], "both fixed points of every generalized leapfrog step converged "
                                        "(False: the proposal was rejected)"),
    ("n_grad_evals", np.int64, [], "calls of the compiled model function (log density, gradient, metric "
                                   "and its derivatives) in this iteration"),
)


class ConstantMetric:
    """A position-independent metric: :class:`AdaptiveRMHMC` runs plain HMC with this mass matrix."""

    def __init__(self, matrix):
        self.matrix = _check_spd(np.asarray(matrix, dtype=np.float64), "constant_metric(matrix)")
        self.dim = len(self.matrix)

    def __call__(self, position):
        return pt.as_tensor_variable(self.matrix)

    def __repr__(self):
        return f"constant_metric(<{self.dim} x {self.dim} matrix>)"


class FisherLogisticMetric:
    """Expected Fisher information of a logistic regression plus the Gaussian prior's precision."""

    def __init__(self, X, prior_variance):
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or not np.all(np.isfinite(X)):
            raise ValueError(f"fisher_logistic_metric: X must be a finite 2-d design matrix (observations x "
                             f"coefficients); got shape {X.shape}.")
        if not (np.isfinite(prior_variance) and prior_variance > 0):
            raise ValueError(f"fisher_logistic_metric: prior_variance must be a finite number > 0; "
                             f"got {prior_variance!r}.")
        self.X, self.prior_variance, self.dim = X, float(prior_variance), X.shape[1]

    def __call__(self, position):
        p = pt.sigmoid(pt.dot(self.X, position))
        weighted = self.X * (p * (1.0 - p))[:, None]
        return pt.dot(self.X.T, weighted) + pt.eye(self.dim) / self.prior_variance

    def __repr__(self):
        return f"fisher_logistic_metric(<{self.X.shape[0]} x {self.dim} X>, prior_variance={self.prior_variance})"


def constant_metric(matrix) -> ConstantMetric:
    """A fixed metric ``G``: :class:`AdaptiveRMHMC` then is HMC with dense mass matrix ``G``.

    It costs what HMC with PyMC's dense ``QuadPotentialFull`` costs (it is exactly that).
    ``matrix`` must be symmetric positive definite, sized like the flat position.
    """
    return ConstantMetric(matrix)


def fisher_logistic_metric(X, prior_variance=100.0) -> FisherLogisticMetric:
    """``G(beta) = X^T diag(p (1 - p)) X + I / prior_variance`` with ``p = sigmoid(X beta)``.

    The expected Fisher information of a Bernoulli-logit likelihood plus the precision of
    an isotropic ``N(0, prior_variance)`` prior (Girolami & Calderhead 2011, section 7).
    ``X`` is the design matrix in the coordinates of the flat position, so that the
    model's logits are ``X @ position``: include a column of ones for an intercept that
    is the first coefficient.
    """
    return FisherLogisticMetric(X, prior_variance)


def _check_spd(matrix, name, *, where=""):
    """Raise ValueError unless ``matrix`` is finite, square, symmetric and positive definite."""
    fix = (" Return a symmetric positive-definite (d, d) matrix of the flat position (e.g. a Fisher "
           "information plus a prior precision), or leave metric=None for SoftAbs.")
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or not np.all(np.isfinite(matrix)):
        raise ValueError(f"{name}{where} must be a finite square matrix; got shape {matrix.shape} "
                         f"(finite: {bool(np.all(np.isfinite(matrix)))}).{fix}")
    scale = max(float(np.max(np.abs(matrix))), 1e-300)
    if not np.allclose(matrix, matrix.T, rtol=1e-8, atol=1e-10 * scale):
        raise ValueError(f"{name}{where} is not symmetric (max |G - G^T| = "
                         f"{float(np.max(np.abs(matrix - matrix.T))):.3g}).{fix}")
    try:
        np.linalg.cholesky(matrix)
    except np.linalg.LinAlgError:
        raise ValueError(f"{name}{where} is not positive definite (smallest eigenvalue "
                         f"{float(np.linalg.eigvalsh(matrix)[0]):.3g}).{fix}") from None
    return matrix


def _geometry_function(step, metric, softabs_alpha, initial_point):
    """Compile, once, ``x -> (log pi, grad, G or Hessian, dG/dx or dHessian/dx)`` of the flat position.

    With ``metric=None`` (or ``"diagonal_softabs"``) the third output is the Hessian of ``-log pi`` and SoftAbs is applied
    in NumPy; with ``"fisher"`` / ``"diagonal_fisher"`` it is the model's Fisher metric (``_pymc_fisher``);
    otherwise it is ``metric(x)``.  All derivatives come from PyTensor autodiff.
    Variables the step does not sample are read from the same shared variables PyMC's own
    logp function uses, so compound steps see their current values.
    """
    model, shared = step._model, step._logp_dlogp_func
    givens = [(var, shared._extra_vars_shared[var.name]) for var in shared._extra_vars]
    model_metric = isinstance(metric, str) and metric in MODEL_METRICS
    # The model's Fisher metric is built on the value variables, joined into the flat position with the cost.
    fisher = fisher_parts(model, step.vars) if model_metric else None
    parts = flatten_parts(fisher) if model_metric else []
    (cost, *joined), flat = join_nonshared_inputs(point=initial_point,
                                                  outputs=[rewrite_pregrad(model.logp()), *parts],
                                                  inputs=step.vars, make_inputs_shared=False)
    size = int(sum(np.size(initial_point[v.name]) for v in step.vars))
    grad = pytensor.grad(cost, flat)
    hessian_metric = metric is None or metric == "diagonal_softabs"
    if hessian_metric:
        matrix = _jacobian(-grad, flat)
    else:
        if model_metric:
            matrix = assemble_fisher(unflatten_parts(joined, fisher), flat, _jacobian,
                                     diagonal=metric == "diagonal_fisher")
        else:
            matrix = pt.cast(pt.as_tensor_variable(metric(flat)), "float64")
            if matrix.ndim not in (1, 2):
                raise ValueError(f"metric(position) must return a (d, d) matrix, or a (d,) vector for a diagonal "
                                 f"metric, with d = {size}; it returned a {matrix.ndim}-d tensor.")
        _check_initial_metric(compile_pytensor([flat], matrix, givens=givens, on_unused_input="ignore",
                                               mode="FAST_COMPILE"), step, initial_point)
        if matrix.ndim == 1:  # a diagonal metric, BlackJAX's convention (the JAX adapters' fast route)
            matrix = pt.diag(matrix)
    derivative = _jacobian(matrix.ravel(), flat).reshape((size, size, size)).transpose(2, 0, 1)
    # PyMC's compile turns parameter checks into -inf (as its own logp function does), not errors.
    function = compile_pytensor([flat], [cost, grad, matrix, derivative], givens=givens, on_unused_input="ignore")
    if hessian_metric:
        soften = _riemann.softabs if metric is None else _riemann.diagonal_softabs

        def evaluate(x):
            logp, gradient, hessian, hessian_grad = function(x)
            G, dG = soften(hessian, hessian_grad, softabs_alpha)
            return _riemann.geometry(x, logp, gradient, G, dG)
    else:
        def evaluate(x):
            return _riemann.geometry(x, *function(x))
    return evaluate, function


def _check_initial_metric(metric_function, step, initial_point):
    """Before any derivative is compiled: the user's metric at the initial point must be (d, d) SPD."""
    x = np.concatenate([np.ravel(initial_point[v.name]) for v in step.vars]).astype(np.float64)
    matrix = np.asarray(metric_function(x))
    if matrix.shape == (len(x),):
        if not (np.all(np.isfinite(matrix)) and np.all(matrix > 0)):
            raise ValueError(f"metric returned a diagonal with non-positive or non-finite entries at the initial "
                             f"point ({matrix}); a diagonal metric must be finite and > 0 everywhere.")
        return
    if matrix.shape != (len(x), len(x)):
        raise ValueError(f"metric(position) must return a ({len(x)}, {len(x)}) matrix, or a ({len(x)},) vector for "
                         f"a diagonal metric, for the flat position of {step.vars}; it returned shape {matrix.shape}.")
    _check_spd(matrix, "metric", where=" at the initial point")


def _jacobian(expression, wrt):
    """Jacobian by a vectorized graph (one pass); PyTensor's scan when an op cannot be vectorized."""
    try:
        return jacobian(expression, wrt, vectorize=True, disconnected_inputs="ignore")
    except NotImplementedError:
        return jacobian(expression, wrt, disconnected_inputs="ignore")


class _RiemannState(NamedTuple):
    """What BaseHMC and AdaptiveHMC read from a state (q, q_grad, energy, model_logp), plus the geometry."""

    q: Any  # RaveledVars
    p: np.ndarray
    q_grad: np.ndarray
    energy: float
    model_logp: float
    geometry: Geometry


class FixedPointError(IntegrationError):
    """A fixed point of the generalized leapfrog did not converge: the proposal is rejected."""


class _GeneralizedLeapfrogIntegrator:
    """The generalized leapfrog behind PyMC's integrator interface (``compute_state``, ``step``).

    Counts every geometry evaluation of the running iteration (``evaluations``) and records
    whether every fixed point converged (``converged``).  The geometry of the returned draw is
    kept, so the next iteration starts without evaluating it again (``reuse``: only when the step
    samples every free variable, as in :class:`_LeapfrogReusingStart`).
    """

    def __init__(self, evaluate, tolerance, max_iterations, reuse):
        self._evaluate, self._tolerance, self._max_iterations = evaluate, tolerance, max_iterations
        self.reuse = bool(reuse)
        self._kept: Geometry | None = None
        self.start: Geometry | None = None
        self.evaluations, self.converged = 0, True

    def geometry_at(self, x) -> Geometry:
        self.evaluations += 1
        return self._evaluate(np.asarray(x, dtype=np.float64))

    def begin(self, position) -> Geometry | None:
        """Reset the counters; the geometry at the iteration's start (None if log pi is not finite)."""
        self.evaluations, self.converged = 0, True
        kept = self._kept
        if kept is not None and np.array_equal(kept.position, position):
            self.start = kept
        else:
            try:
                self.start = self.geometry_at(position)
            except NotPositiveDefiniteError:
                self.start = None
        return self.start

    def keep(self, geom: Geometry):
        self._kept = geom if self.reuse else None

    def new_chain(self):
        self._kept = None

    def compute_state(self, q, p) -> _RiemannState:
        geom = self.start
        if geom is None:  # non-finite start: BaseHMC raises its "Bad initial energy" SamplingError
            return _RiemannState(q, p, np.zeros_like(q.data), np.inf, -np.inf, None)
        return _RiemannState(q, p, geom.grad, _riemann.hamiltonian(geom, p), geom.logp, geom)

    def step(self, step_size, state: _RiemannState) -> _RiemannState:
        try:
            with np.errstate(all="ignore"):  # an exploding fixed point is reported below, not warned about
                result = _riemann.generalized_leapfrog(self.geometry_at, state.geometry, state.p, step_size,
                                                       self._tolerance, self._max_iterations)
        except NotPositiveDefiniteError as error:
            raise IntegrationError(f"non-finite density or metric not positive definite on the path: {error}") \
                from None
        if not result.converged:
            self.converged = False
            raise FixedPointError(f"generalized leapfrog fixed point did not converge in "
                                  f"{self._max_iterations} iterations (step size {step_size:.3g})")
        geom = result.geometry
        q = RaveledVars(geom.position, state.q.point_map_info)
        return _RiemannState(q, result.momentum, geom.grad, _riemann.hamiltonian(geom, result.momentum),
                             geom.logp, geom)


class _RiemannMomentum(QuadPotential):
    """Momentum ``p ~ N(0, G(x))`` at the iteration's start (set by the step before each draw)."""

    def __init__(self, size, rng=None):
        super().__init__(rng=rng)
        self._n, self.dtype = size, "float64"
        self.geometry: Geometry | None = None

    def random(self):
        if self.geometry is None:
            return np.zeros(self._n)
        return _riemann.sample_momentum(self.geometry, self.rng)

    def update(self, sample, grad, tune):
        pass  # nothing to adapt: the metric is G(x)

    def raise_ok(self, map_info=None):
        pass

    def reset(self):
        pass

    def stats(self):
        if self.geometry is None:
            return {"largest_eigval": np.nan, "smallest_eigval": np.nan}
        eigvals = np.linalg.eigvalsh(self.geometry.metric)
        return {"largest_eigval": float(eigvals[-1]), "smallest_eigval": float(eigvals[0])}


class AdaptiveRMHMC(AdaptiveHMC):
    """Riemann-manifold HMC with ``(eps, L)`` tuned by annealed GP-UCB while the chain runs.

    The sampler of the paper's sections 2 and 5.2: momentum ``p ~ N(0, G(x))``, the
    Hamiltonian ``-log pi(x) + 1/2 log det G(x) + 1/2 p^T G(x)^{-1} p`` and the implicit
    generalized leapfrog; warm-up, rounds, rewards, annealing and stats are those of
    :class:`AdaptiveHMC` (the warm-up dual-averages ``eps*``; there is no mass matrix to adapt).

    Parameters
    ----------
    metric : callable, ConstantMetric or None
        ``None`` (default): SoftAbs of the Hessian of ``-log pi`` (Betancourt 2013).
        ``"diagonal_softabs"``: SoftAbs of the Hessian's diagonal alone, a diagonal metric (as in
        the JAX adapters; here it costs what SoftAbs costs, the third derivatives included).
        ``"fisher"``: the model's expected Fisher information, read off its variables' distributions
        (each parameter's Fisher information through the chain rule, each free variable's own expected
        curvature; the paper's logistic-regression metric, the funnel's); ``"diagonal_fisher"``: its
        diagonal.  Normal, Cauchy, StudentT, Laplace, HalfNormal, HalfCauchy, Exponential, LogNormal,
        Gamma, InverseGamma, Beta, free Uniform with fixed bounds, MvNormal (its covariance too), and
        observed Bernoulli, Binomial, Poisson, Categorical, Multinomial; any other variable is a
        ``ValueError`` naming it.
        A callable
        gets the flat PyTensor position (the step's value variables raveled in model order,
        transformed, e.g. ``sigma_log__``) and returns a PyTensor ``(d, d)`` symmetric
        positive-definite matrix, or a positive ``(d,)`` vector for a diagonal metric (BlackJAX's
        convention; here it is made a matrix, the JAX adapters keep it elementwise); its
        derivatives come from PyTensor.
        :func:`fisher_logistic_metric` and :func:`constant_metric` build common ones; a
        constant metric runs ordinary HMC with PyMC's dense ``QuadPotentialFull``.
    softabs_alpha : float
        SoftAbs softness: eigenvalues ``lam`` of the Hessian become ``lam coth(alpha lam)``,
        about ``|lam|`` when ``|lam| >> 1/alpha`` and ``1/alpha`` at 0.
    fixed_point_tolerance : float
        A fixed point stops when every coordinate changes by at most ``tol * (1 + |value|)``.
    max_fixed_point_iterations : int
        Per fixed point; if one does not converge the proposal is rejected (stat
        ``fixed_point_converged`` False; PyMC also counts it as a divergence).
    max_integration_time : float, optional
        Longest integration time of the automatic box, ``L <= ceil(T / eps*)``: default 2 pi
        (a constant metric, which is plain HMC, keeps AdaptiveHMC's 4 pi).  With the 10-d funnel's SoftAbs metric, 4 pi made longer trajectories
        whose position solves failed more often, and the short test's chains stuck in v
        (ESS 6 of 800 draws); 2 pi mixed.
    **kwargs
        As for :class:`AdaptiveHMC` (``scaling``, ``potential`` and ``adapt_mass_matrix`` do not apply;
        ``jump_estimate`` is ``"transition"``, the jumps made, measured in ``G`` at their start: a
        trajectory's intermediate steps would need ``G`` there, and AdaptiveRMHMC's chains were
        measured with these rewards; a constant metric follows AdaptiveHMC's default).

    Cost: every leapfrog step evaluates the log density, its gradient, ``G`` and ``dG/dx``
    once per position fixed-point iteration (stat ``n_grad_evals``), plus O(d^3) linear
    algebra; SoftAbs needs third derivatives of the log density (O(d) reverse passes of the
    Hessian graph).  It pays when the posterior's curvature changes across it (funnels,
    logistic regressions with strong correlations) and ``d`` is at most a few tens.
    """

    name = "adaptive_rmhmc"
    stats_dtypes_shapes = {name: (dtype, shape) for name, dtype, shape, _ in STATS + RMHMC_STATS}

    def __init__(self, vars=None, *, metric=None, softabs_alpha=1e6, fixed_point_tolerance=1e-6,
                 max_fixed_point_iterations=20, max_integration_time=None, model=None, **kwargs):
        # Fold config= and paper_preset= into flat options first, so the RMHMC defaults below fill only what is unset.
        tuning, kwargs = resolve_options(kwargs, type(self).__name__)
        kwargs = {**tuning, **kwargs}
        if not isinstance(metric, ConstantMetric):
            # AdaptiveHMC's per-chain reward noise was measured for plain HMC; SoftAbs on the 10-d
            # funnel mixed worse with it (short test: ESS 18-34 of 800 draws vs >= 40), so keep 0.1.
            kwargs.setdefault("noise_variance", 0.1)
            kwargs.setdefault("num_steps_cap", RMHMC_NUM_STEPS_CAP)
        if max_integration_time is not None or not isinstance(metric, ConstantMetric):
            kwargs["max_integration_time"] = 2 * math.pi if max_integration_time is None else max_integration_time
        if not isinstance(metric, ConstantMetric) and kwargs.setdefault("jump_estimate", "transition") != "transition":
            raise ValueError(f"AdaptiveRMHMC measures each jump in its metric G(x) and takes jump_estimate="
                             f"'transition' only (a constant_metric runs AdaptiveHMC's estimates); "
                             f"got {kwargs['jump_estimate']!r}.")
        for name in ("potential", "scaling", "adapt_mass_matrix", "dense_mass", "metric_recipe"):
            if name in kwargs:
                raise ValueError(f"AdaptiveRMHMC takes no {name}: the metric G(x) replaces the mass matrix. Give "
                                 f"metric=constant_metric(M) for a fixed mass matrix M, or use AdaptiveHMC.")
        if not (metric is None or (isinstance(metric, str) and metric in ("diagonal_softabs", *MODEL_METRICS))
                or callable(metric)):
            raise ValueError(f"metric must be None (SoftAbs), \"diagonal_softabs\", \"fisher\", \"diagonal_fisher\", "
                             f"a callable of the flat position returning a (d, d) matrix or (d,) diagonal, "
                             f"fisher_logistic_metric(X) or constant_metric(M); got {metric!r}.")
        if not (isinstance(softabs_alpha, (int, float)) and math.isfinite(softabs_alpha) and softabs_alpha > 0):
            raise ValueError(f"softabs_alpha must be a finite number > 0 (e.g. 1e6); got {softabs_alpha!r}.")
        if not (isinstance(fixed_point_tolerance, (int, float)) and 0 < fixed_point_tolerance < 1):
            raise ValueError(f"fixed_point_tolerance must be a number in (0, 1), e.g. 1e-6; "
                             f"got {fixed_point_tolerance!r}.")
        if not (isinstance(max_fixed_point_iterations, (int, np.integer)) and max_fixed_point_iterations >= 1):
            raise ValueError(f"max_fixed_point_iterations must be an integer >= 1, e.g. 20; "
                             f"got {max_fixed_point_iterations!r}.")
        self.metric, self.softabs_alpha = metric, float(softabs_alpha)
        self.fixed_point_tolerance = float(fixed_point_tolerance)
        self.max_fixed_point_iterations = int(max_fixed_point_iterations)
        model = modelcontext(model)
        if isinstance(metric, ConstantMetric):  # plain HMC with dense mass matrix G (momentum ~ N(0, G))
            super().__init__(vars, model=model, potential=QuadPotentialFull(np.linalg.inv(metric.matrix)), **kwargs)
            self._check_size(metric)
            self.potential.set_rng(self.rng.spawn(1)[0])
            self._riemann = None
            return
        super().__init__(vars, model=model, adapt_mass_matrix=False, **kwargs)
        self._check_size(metric)
        initial_point = kwargs.get("initial_point") or self._model.initial_point()
        evaluate, self._geometry_function = _geometry_function(self, metric, self.softabs_alpha, initial_point)
        self.potential = _RiemannMomentum(self._size, rng=self.rng.spawn(1)[0])
        self.integrator = _GeneralizedLeapfrogIntegrator(evaluate, self.fixed_point_tolerance,
                                                         self.max_fixed_point_iterations, _samples_every_variable(self))
        self._riemann = True
        self._divergence_retry = None  # the metric adapts to the curvature (and the JAX RMHMC has no retry either)

    def _warm_metric_name(self) -> str:
        """A warm start's snapshot must be of this metric: its step sizes are in the metric's units."""
        return "softabs" if self.metric is None else metric_name(self.metric)

    @property
    def _size(self):
        """Length of the flat position (the step's value variables, raveled)."""
        point = self._model.initial_point()
        return int(sum(np.size(point[v.name]) for v in self.vars))

    def _check_size(self, metric):
        size = self._size
        if getattr(metric, "dim", size) != size:
            raise ValueError(f"metric is {metric.dim} x {metric.dim} but the flat position of {self.vars} has "
                             f"{size} coordinates; build it for these variables (an intercept needs its column "
                             f"of ones in fisher_logistic_metric's X).")

    # ---- one iteration ---------------------------------------------------------------------
    def astep(self, q0):
        if self._riemann is None:  # constant metric: ordinary HMC, one model call per step (+1 at an unreused start)
            q, (stats,) = super().astep(q0)
            stats.update(fixed_point_converged=True,
                         n_grad_evals=int(stats["n_steps"]) + self.integrator.start_evaluations)
            return q, [stats]
        start = self.integrator.begin(q0.data)
        if start is None and np.isfinite(self._geometry_function(q0.data)[0]):
            raise ValueError(f"metric at the chain's current position is not symmetric positive definite: "
                             f"check metric for {self.vars}.")
        self.potential.geometry = start
        q, (stats,) = super().astep(q0)
        stats.update(fixed_point_converged=self.integrator.converged, n_grad_evals=self.integrator.evaluations)
        return q, [stats]

    def _record_round(self, previous, position, stats):
        """The round's jumps are measured in the metric at each iteration's start, ``dx^T G(x) dx``:
        Euclidean jumps in a funnel's mouth dwarf those in its neck whatever the arm, which would
        make the reward say where the chain is rather than how good the arm is."""
        if self._riemann is None:
            return super()._record_round(previous, position, stats)
        jump = self.potential.geometry.chol.T @ (np.asarray(position) - np.asarray(previous))
        return super()._record_round(np.zeros_like(jump), jump, stats)

    def _hamiltonian_step(self, start, p0, step_size) -> HMCStepData:
        result = super()._hamiltonian_step(start, p0, step_size)
        if self._riemann is not None:
            self.integrator.keep(result.end.geometry)  # the next iteration starts here
        return result
