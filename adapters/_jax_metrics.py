"""Position-dependent metrics G(x) for Riemann-manifold HMC (JAX).

Every metric acts on the *flattened* unconstrained position ``x`` (the order of
``jax.flatten_util.ravel_pytree``: dict keys sorted).  The kinetic energy is
that of a Gaussian momentum ``p ~ N(0, G(x))``:

    K(x, p) = 0.5 log det G(x) + 0.5 p^T G(x)^{-1} p   (+ constant),

so ``H = -log pi(x) + K(x, p)`` has ``pi(x)`` as its x-marginal.

The kinds (the names the PyMC adapter uses too):

* ``"softabs"`` (default): Betancourt's (2013) SoftAbs of the Hessian of
  ``-log pi``: eigenvalues ``lambda -> lambda coth(alpha lambda)``, which is
  ``|lambda|`` for ``|lambda| >> 1/alpha`` and ``1/alpha`` at 0.  Its
  position-gradient needs third derivatives of ``log pi``; we write it with
  the eigen-decomposition's divided differences (as Betancourt 2013 does),
  which stay finite when eigenvalues coincide (autodiff through ``eigh``
  does not: Neal's funnel has a repeated eigenvalue everywhere).
* ``"diagonal_softabs"``: SoftAbs of the Hessian's *diagonal* alone,
  ``g_i = h_ii coth(alpha h_ii)``, a diagonal metric (below).  It needs nothing
  from the user either, skips the eigen-decomposition and the ``(d, d, d)``
  contractions, and keeps what a hierarchical model's scales need (on Neal's
  funnel it is close to the expected Fisher information); it ignores
  correlations, as a diagonal mass matrix does.
* a callable ``flat_position -> (d, d)`` matrix, e.g.
  :func:`fisher_logistic_metric`; its derivative tensor comes from
  ``jax.jacfwd`` and the kinetic energy matches BlackJAX's
  ``metrics.gaussian_riemannian`` (tested).  A callable that returns a
  ``(d,)`` vector is a *diagonal* metric ``diag(g(x))``, as in BlackJAX's
  convention: O(d) algebra and a ``(d, d)`` Jacobian of ``g`` instead of a
  Cholesky factor and a ``(d, d, d)`` tensor (on the 10-d funnel 14x-23x
  less time per unit than the same metric as a matrix; BENCHMARKS.md@036b7d1).
* :func:`constant_metric`: not Riemannian at all; the engine runs plain HMC
  with the dense inverse mass matrix ``G^{-1}`` (no implicit solver), so it
  costs what dense-metric HMC costs.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "DEFAULT_SOFTABS_ALPHA",
    "ConstantMetric",
    "FisherLogisticMetric",
    "RiemannianMetric",
    "constant_metric",
    "diagonal_softabs_metric",
    "fisher_logistic_metric",
    "resolve_metric",
    "riemannian_from_diagonal",
    "softabs_metric",
]

DEFAULT_SOFTABS_ALPHA = 1e6  # the softness Betancourt (2013) uses in his examples


class RiemannianMetric(NamedTuple):
    """What the generalized leapfrog needs from G(x), on flat vectors.

    at(x) -> cache                  G(x) factorized, with its x-derivatives (the costly part)
    sample_momentum(cache, key)     p ~ N(0, G(x))
    kinetic_energy(cache, p)        K(x, p), BlackJAX's normalization (log(2 pi) terms included)
    velocity(cache, p)              dK/dp = G(x)^{-1} p
    kinetic_grad_x(cache, p)        dK/dx = 0.5 tr(G^{-1} dG/dx_k) - 0.5 p^T G^{-1} dG/dx_k G^{-1} p
    velocity_at(x, p)               G(x)^{-1} p without derivatives (the position solve)
    matrix(x)                       G(x), or its diagonal for a diagonal metric (BlackJAX's convention)
    velocity_derivative(cache, u, r)  d/dt G(x + t r)^{-1} p at t = 0 for u = G(x)^{-1} p, i.e.
                                    -G^{-1} (sum_k r_k dG/dx_k) u, from the cache (the position solve's chord
                                    step), or None: the solve is then plain fixed-point iteration
    """

    at: Callable
    sample_momentum: Callable
    kinetic_energy: Callable
    velocity: Callable
    kinetic_grad_x: Callable
    velocity_at: Callable
    matrix: Callable
    velocity_derivative: Callable


class ConstantMetric(NamedTuple):
    """A fixed metric (mass matrix) ``matrix``; runs ordinary HMC with ``inverse_matrix``."""

    matrix: Any
    inverse_matrix: Any


def constant_metric(matrix) -> ConstantMetric:
    """A constant metric ``G`` (a symmetric positive-definite ``(d, d)`` mass matrix).

    Sampling uses ordinary HMC (BlackJAX's velocity Verlet) with the dense
    inverse mass matrix ``G^{-1}``: the cost of dense-metric HMC, no fixed point.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"constant_metric needs a square (d, d) matrix; got shape {matrix.shape}.")
    _check_spd("constant_metric(matrix)", matrix)
    return ConstantMetric(matrix, np.linalg.inv(matrix))


class FisherLogisticMetric:
    """``G(beta) = X^T diag(s (1 - s)) X + I / prior_variance``; callable ``beta -> G(beta)``.

    Besides being a plain metric callable, it knows its derivatives in closed form:
    with ``w' = s (1 - s) (1 - 2 s)``, ``dG/dbeta_k = X^T diag(w' X_k) X``, so
    ``dK/dbeta`` costs O(N d^2) (leverages and one pass over the data) instead of
    the O(N d^3) derivative tensor that autodiff of a generic metric builds.
    """

    def __init__(self, X, prior_variance: float):
        self.X = np.asarray(X, dtype=np.float64)
        self.prior_variance = float(prior_variance)

    def __call__(self, beta):
        design = jnp.asarray(self.X, beta.dtype)
        s = jax.nn.sigmoid(design @ beta)
        return (design.T * (s * (1.0 - s))) @ design + jnp.eye(self.X.shape[1], dtype=beta.dtype) / self.prior_variance

    def riemannian(self) -> RiemannianMetric:
        generic = riemannian_from_callable(self)

        def at(x):
            design = jnp.asarray(self.X, x.dtype)
            s = jax.nn.sigmoid(design @ x)
            weights = s * (1.0 - s)
            g = (design.T * weights) @ design + jnp.eye(x.shape[0], dtype=x.dtype) / self.prior_variance
            chol = jnp.linalg.cholesky(g)
            inverse = jax.scipy.linalg.cho_solve((chol, True), jnp.eye(x.shape[0], dtype=x.dtype))
            leverage = jnp.sum((design @ inverse) * design, axis=1)  # X_n G^{-1} X_n^T (a matmul: XLA's
            # triangular solve with 500 right-hand sides was 35x slower on CPU)
            slope = weights * (1.0 - 2.0 * s)
            return {"chol": chol, "slope": slope, "trace": 0.5 * design.T @ (leverage * slope)}

        def kinetic_grad_x(cache, p):
            design = jnp.asarray(self.X, p.dtype)
            projected = design @ jax.scipy.linalg.cho_solve((cache["chol"], True), p)
            return cache["trace"] - 0.5 * design.T @ (projected**2 * cache["slope"])

        # No chord step in the position solve (velocity_derivative=None): its directional derivative
        # costs O(N d) passes over the data, about what the metric values it saves cost (measured:
        # same time per step, fewer units; BENCHMARKS.md@036b7d1), and plain iteration keeps the draws as before.
        return generic._replace(at=at, kinetic_grad_x=kinetic_grad_x, velocity_derivative=None)


def fisher_logistic_metric(X, prior_variance: float = 100.0) -> FisherLogisticMetric:
    """Expected Fisher information + prior precision of Bayesian logistic regression.

    ``G(beta) = X^T diag(s (1 - s)) X + I / prior_variance`` with
    ``s = sigmoid(X beta)`` (Girolami & Calderhead 2011, section 7).  ``beta``
    is the whole flat position, so ``X`` must carry a column of ones if the
    model has an intercept (as its first coordinate, say).  A callable
    ``beta -> G(beta)``; RMHMC uses its closed-form derivatives.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"fisher_logistic_metric needs a 2-d design matrix X; got shape {X.shape}.")
    if not prior_variance > 0:
        raise ValueError(f"prior_variance must be > 0; got {prior_variance!r}.")
    return FisherLogisticMetric(X, prior_variance)


def _check_spd(name: str, matrix: np.ndarray) -> None:
    if not np.all(np.isfinite(matrix)):
        raise ValueError(f"{name} is not finite; the metric must be a finite positive-definite matrix.")
    if not np.allclose(matrix, matrix.T, rtol=1e-6, atol=1e-8 * max(1.0, np.abs(matrix).max())):
        raise ValueError(f"{name} is not symmetric; return (G + G.T) / 2 or a symmetric matrix.")
    if np.linalg.eigvalsh(matrix).min() <= 0:
        raise ValueError(f"{name} is not positive definite; the metric must be a positive-definite matrix.")


def check_metric_at(metric_fn: Callable, flat_position) -> None:
    """Raise ValueError unless a user metric is a symmetric PD (d, d) matrix or a positive (d,) diagonal
    at a concrete position."""
    if isinstance(flat_position, jax.core.Tracer):
        return
    dim = flat_position.shape[0]
    value = metric_fn(flat_position)
    if isinstance(value, jax.core.Tracer):
        return
    value = np.asarray(value, dtype=np.float64)
    if value.shape == (dim,):
        if not (np.all(np.isfinite(value)) and np.all(value > 0)):
            raise ValueError(f"metric(x) returned a diagonal with non-positive or non-finite entries at the initial "
                             f"position ({value}); a diagonal metric must be finite and > 0 everywhere.")
        return
    if value.shape != (dim, dim):
        raise ValueError(
            f"metric(x) must return a ({dim}, {dim}) matrix, or a ({dim},) vector for a diagonal metric, for the "
            f"flattened position of size {dim}; got shape {value.shape}."
        )
    _check_spd("metric(x) at the initial position", value)


def _log_2pi_term(dim, dtype):
    return 0.5 * dim * jnp.log(2.0 * jnp.pi).astype(dtype)


def riemannian_from_callable(metric_fn: Callable) -> RiemannianMetric:
    """A user metric G(x): Cholesky factor and the (d, d, d) derivative tensor by ``jax.jacfwd``."""
    derivative = jax.jacfwd(metric_fn)

    def at(x):
        g = metric_fn(x)
        chol = jnp.linalg.cholesky(g)
        inverse = jax.scipy.linalg.cho_solve((chol, True), jnp.eye(x.shape[0], dtype=x.dtype))
        dg = derivative(x)  # dg[i, j, k] = dG_ij / dx_k
        return {"chol": chol, "inverse": inverse, "dg": dg, "trace": 0.5 * jnp.einsum("ji,ijk->k", inverse, dg)}

    def sample_momentum(cache, rng_key):
        chol = cache["chol"]
        return chol @ jax.random.normal(rng_key, chol.shape[:1], chol.dtype)

    def kinetic_energy(cache, p):
        chol = cache["chol"]
        z = jax.scipy.linalg.solve_triangular(chol, p, lower=True)
        return jnp.sum(jnp.log(jnp.diag(chol))) + 0.5 * jnp.sum(z**2) + _log_2pi_term(p.shape[0], p.dtype)

    def velocity(cache, p):
        return jax.scipy.linalg.cho_solve((cache["chol"], True), p)

    def kinetic_grad_x(cache, p):
        u = velocity(cache, p)
        return cache["trace"] - 0.5 * jnp.einsum("i,ijk,j->k", u, cache["dg"], u)

    def velocity_at(x, p):
        return jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(metric_fn(x)), True), p)

    def velocity_derivative(cache, u, r):
        return -cache["inverse"] @ jnp.einsum("ijk,j,k->i", cache["dg"], u, r)

    return RiemannianMetric(at, sample_momentum, kinetic_energy, velocity, kinetic_grad_x, velocity_at, metric_fn,
                            velocity_derivative)


def riemannian_from_diagonal(diagonal_fn: Callable, reverse: bool = False) -> RiemannianMetric:
    """A diagonal user metric ``G(x) = diag(g(x))`` with ``g = diagonal_fn(x)`` of shape ``(d,)``.

    Everything is elementwise: ``G^{-1} p = p / g``, ``log det G = sum log g``; the x-derivatives need
    only the Jacobian ``J[i, k] = dg_i / dx_k`` (``jax.jacfwd``, d forward passes of ``g``), where the
    dense route builds and contracts a ``(d, d, d)`` tensor.  ``reverse=True`` takes it by d reverse
    passes instead: faster when ``g`` is itself a forward-mode Jacobian (``model_fisher_metric``).
    """
    def twice(x):
        g = diagonal_fn(x)
        return g, g

    # The Jacobian with the value as jacfwd's aux output: g is evaluated once per metric value, not once
    # for the value and again inside the Jacobian (for "diagonal_softabs" g holds a whole Hessian).
    jacobian_and_value = jax.jacfwd(twice, has_aux=True)

    def at(x):
        if reverse:
            g, pullback = jax.vjp(diagonal_fn, x)
            dg = jax.vmap(pullback)(jnp.eye(x.shape[0], dtype=x.dtype))[0]
        else:
            dg, g = jacobian_and_value(x)
        return {"g": g, "dg": dg, "trace": 0.5 * (dg.T @ (1.0 / g))}

    def sample_momentum(cache, rng_key):
        g = cache["g"]
        return jnp.sqrt(g) * jax.random.normal(rng_key, g.shape, g.dtype)

    def kinetic_energy(cache, p):
        g = cache["g"]
        return 0.5 * jnp.sum(jnp.log(g)) + 0.5 * jnp.sum(p**2 / g) + _log_2pi_term(p.shape[0], p.dtype)

    def velocity(cache, p):
        return p / cache["g"]

    def kinetic_grad_x(cache, p):
        u = p / cache["g"]
        return cache["trace"] - 0.5 * (cache["dg"].T @ u**2)

    def velocity_at(x, p):
        return p / diagonal_fn(x)

    def velocity_derivative(cache, u, r):
        # d/dt diag(g(x + t r))^-1 p = -(J r) u / g for u = p / g.
        return -(cache["dg"] @ r) * u / cache["g"]

    return RiemannianMetric(at, sample_momentum, kinetic_energy, velocity, kinetic_grad_x, velocity_at, diagonal_fn,
                            velocity_derivative)


def _softabs_values(eigenvalues, alpha):
    """lambda coth(alpha lambda) and its derivative, with their limits at 0."""
    a_lam = alpha * eigenvalues
    small = jnp.abs(a_lam) < 1e-4
    # coth(40) = 1 and 1/sinh(40)^2 ~ 1e-35 in float64: clipping keeps derivatives finite (no inf/inf).
    safe = jnp.clip(jnp.where(small, 1.0, a_lam), -40.0, 40.0)
    value = jnp.where(small, 1.0 / alpha + alpha * eigenvalues**2 / 3.0, eigenvalues / jnp.tanh(safe))
    derivative = jnp.where(small, 2.0 * a_lam / 3.0, 1.0 / jnp.tanh(safe) - safe / jnp.sinh(safe) ** 2)
    return value, derivative


def softabs_metric(logdensity_fn: Callable, alpha: float = DEFAULT_SOFTABS_ALPHA) -> RiemannianMetric:
    """SoftAbs metric of the Hessian of ``-logdensity_fn`` (a function of the flat position)."""
    hessian = jax.hessian(lambda x: -logdensity_fn(x))
    third = jax.jacfwd(hessian)  # third[a, b, k] = d Hess_ab / dx_k

    def decompose(x):
        h = hessian(x)
        eigenvalues, vectors = jnp.linalg.eigh(0.5 * (h + h.T))
        g, dg = _softabs_values(eigenvalues, alpha)
        return eigenvalues, vectors, g, dg

    def at(x):
        eigenvalues, vectors, g, dg = decompose(x)
        # dG/dx_k = Q (J o (Q^T dHess/dx_k Q)) Q^T with the divided differences
        # J_ij = (g_i - g_j) / (lambda_i - lambda_j), and g'(lambda_i) on (near) ties.
        diff = eigenvalues[:, None] - eigenvalues[None, :]
        close = jnp.abs(diff) <= 1e-10 * (1.0 + jnp.abs(eigenvalues[:, None]))
        divided = jnp.where(close, dg[:, None], (g[:, None] - g[None, :]) / jnp.where(close, 1.0, diff))
        half_rotated = jnp.einsum("ai,abk->ibk", vectors, third(x))  # two contractions: 2x faster than one
        rotated = jnp.einsum("ibk,bj->ijk", half_rotated, vectors) * divided[:, :, None]
        trace = 0.5 * jnp.einsum("iik,i->k", rotated, 1.0 / g)
        return {"vectors": vectors, "g": g, "rotated": rotated, "trace": trace}

    def sample_momentum(cache, rng_key):
        g = cache["g"]
        return cache["vectors"] @ (jnp.sqrt(g) * jax.random.normal(rng_key, g.shape, g.dtype))

    def kinetic_energy(cache, p):
        g = cache["g"]
        w = cache["vectors"].T @ p
        return 0.5 * jnp.sum(jnp.log(g)) + 0.5 * jnp.sum(w**2 / g) + _log_2pi_term(p.shape[0], p.dtype)

    def velocity(cache, p):
        return cache["vectors"] @ ((cache["vectors"].T @ p) / cache["g"])

    def kinetic_grad_x(cache, p):
        v = (cache["vectors"].T @ p) / cache["g"]
        return cache["trace"] - 0.5 * jnp.einsum("i,ijk,j->k", v, cache["rotated"], v)

    def velocity_at(x, p):
        _, vectors, g, _ = decompose(x)
        return vectors @ ((vectors.T @ p) / g)

    def matrix(x):
        _, vectors, g, _ = decompose(x)
        return (vectors * g) @ vectors.T

    def velocity_derivative(cache, u, r):
        # In the eigenbasis dG/dx_k is rotated[..., k]: -Q diag(1/g) (sum_k r_k rotated_k) Q^T u.
        vectors = cache["vectors"]
        return -vectors @ (jnp.einsum("ijk,j,k->i", cache["rotated"], vectors.T @ u, r) / cache["g"])

    return RiemannianMetric(at, sample_momentum, kinetic_energy, velocity, kinetic_grad_x, velocity_at, matrix,
                            velocity_derivative)


def diagonal_softabs_metric(logdensity_fn: Callable, alpha: float = DEFAULT_SOFTABS_ALPHA) -> RiemannianMetric:
    """SoftAbs of the diagonal of the Hessian of ``-logdensity_fn``: ``diag(h_ii coth(alpha h_ii))``.

    A diagonal metric (:func:`riemannian_from_diagonal`); its Jacobian needs third derivatives of
    ``log pi``, by ``jax.jacfwd`` of the Hessian's diagonal (no ties to handle: no eigenvectors).
    """
    hessian = jax.hessian(lambda x: -logdensity_fn(x))

    def diagonal(x):
        return _softabs_values(jnp.diag(hessian(x)), alpha)[0]

    return riemannian_from_diagonal(diagonal)


def riemannian_for(metric_fn: Callable, flat_position) -> RiemannianMetric:
    """The diagonal route if ``metric_fn`` returns a ``(d,)`` vector at ``flat_position``, else the dense one."""
    if jax.eval_shape(metric_fn, flat_position).ndim == 1:
        return riemannian_from_diagonal(metric_fn)
    return riemannian_from_callable(metric_fn)


def resolve_metric(metric, softabs_alpha: float = DEFAULT_SOFTABS_ALPHA):
    """``metric`` argument -> ``ConstantMetric`` or a builder
    ``(logdensity_flat, flat_position) -> RiemannianMetric`` (the position only gives the shapes)."""
    if not softabs_alpha > 0:
        raise ValueError(f"softabs_alpha must be > 0 (larger = closer to |Hessian|); got {softabs_alpha!r}.")
    if isinstance(metric, str):
        if metric not in ("softabs", "diagonal_softabs"):
            raise ValueError(
                f"metric must be 'softabs', 'diagonal_softabs', a callable flat_position -> (d, d) matrix or "
                f"(d,) diagonal, fisher_logistic_metric(X) or constant_metric(matrix); got {metric!r}."
            )
        build = softabs_metric if metric == "softabs" else diagonal_softabs_metric
        return lambda logdensity_flat, flat_position: build(logdensity_flat, softabs_alpha)
    if isinstance(metric, ConstantMetric):
        return metric
    if callable(metric) and callable(getattr(metric, "riemannian", None)):  # a metric that knows its derivatives
        return lambda logdensity_flat, flat_position: metric.riemannian()
    if callable(metric):
        return lambda logdensity_flat, flat_position: riemannian_for(metric, flat_position)
    raise ValueError(
        f"metric must be 'softabs', 'diagonal_softabs', a callable flat_position -> (d, d) matrix or (d,) "
        f"diagonal, fisher_logistic_metric(X) or constant_metric(matrix); got {type(metric).__name__}."
    )
