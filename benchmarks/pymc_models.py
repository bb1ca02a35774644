"""PyMC versions of the benchmark models in :mod:`benchmarks.models`.

Each builder returns a ``pm.Model`` with a single free variable ``x``: an
unconstrained vector of length ``dim`` in the same coordinates as the JAX
model's flat parameter vector, so draws of every sampler are comparable and
the same starting points (``initvals={"x": position}``) can be given to each.
The log density equals the JAX one up to an additive constant; this is checked
numerically by :func:`max_logp_discrepancy` (and by ``tests/test_benchmarks.py``).

* ``pima``, ``ripley``, ``breast_cancer``: written as a PyMC user would,
  ``x ~ Normal(0, 10)`` (variance 100, paper 5.1) and ``y ~ Bernoulli(logit_p =
  x[0] + Xs @ x[1:])`` with the same standardized features (same loaders and
  :func:`benchmarks.models.standardize`).
* ``std_gauss_10``, ``diag_gauss_10``: ``x ~ Normal(mean, sd)``.
* ``corr_gauss_2``: ``x ~ MvNormal(mean, cov)``.
* ``stochastic_volatility``: ``x = pm.Flat(dim)`` plus one ``pm.Potential``
  transcribing the JAX log density term by term (same data, same
  parameterization ``x_1..x_T, log beta, alpha, gamma``).

Importing this module imports PyMC; nothing here imports JAX.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pymc as pm
import pytensor.tensor as pt

from .models import (
    PRIOR_VARIANCE,
    load_breast_cancer,
    load_pima,
    load_ripley,
    simulate_stochastic_volatility,
    standardize,
)

__all__ = ["PYMC_MODELS", "build", "logp_function", "max_logp_discrepancy"]


def logistic_regression(X: np.ndarray, y: np.ndarray) -> pm.Model:
    Xs = standardize(np.asarray(X, dtype=np.float64))
    dim = Xs.shape[1] + 1
    with pm.Model() as model:
        x = pm.Normal("x", 0.0, np.sqrt(PRIOR_VARIANCE), shape=dim)
        pm.Bernoulli("y", logit_p=x[0] + pt.dot(Xs, x[1:]), observed=np.asarray(y, dtype=np.int64))
    return model


def _pima() -> pm.Model:
    X, y, _ = load_pima()
    return logistic_regression(X, y)


def _ripley() -> pm.Model:
    X, y, _ = load_ripley()
    return logistic_regression(X, y)


def _breast_cancer() -> pm.Model:
    X, y, _ = load_breast_cancer()
    return logistic_regression(X, y)


def _normal(mean, sd) -> pm.Model:
    with pm.Model() as model:
        pm.Normal("x", np.asarray(mean, dtype=np.float64), np.asarray(sd, dtype=np.float64), shape=len(mean))
    return model


def _std_gauss_10() -> pm.Model:
    return _normal(np.zeros(10), np.ones(10))


def _diag_gauss_10() -> pm.Model:
    return _normal(np.zeros(10), np.logspace(-2, 2, 10))


def _corr_gauss_2() -> pm.Model:
    cov = np.array([[1.0, 0.99], [0.99, 1.0]])
    with pm.Model() as model:
        pm.MvNormal("x", mu=np.zeros(2), cov=cov, shape=2)
    return model


def stochastic_volatility(num_steps: int = 1000) -> pm.Model:
    """The JAX ``stochastic_volatility`` log density, term by term, as a Potential on a flat vector."""
    y, _ = simulate_stochastic_volatility(num_steps)
    nu, s2 = 10.0, 0.05
    with pm.Model() as model:
        params = pm.Flat("x", shape=num_steps + 3)
        x, log_beta, alpha, gamma = params[:num_steps], params[-3], params[-2], params[-1]
        phi, sigma = pt.tanh(alpha), pt.exp(gamma)
        # log(1 - phi^2) = 2 log sech(alpha), stable for large |alpha| (as in the JAX model)
        abs_alpha = pt.abs(alpha)
        log_one_minus_phi2 = 2.0 * (np.log(2.0) - abs_alpha - pt.log1p(pt.exp(-2.0 * abs_alpha)))
        one_minus_phi2 = pt.exp(log_one_minus_phi2)
        loglik = -pt.sum(log_beta + 0.5 * x) - 0.5 * pt.sum(y**2 * pt.exp(-2.0 * log_beta - x))
        log_x1 = -0.5 * x[0] ** 2 * one_minus_phi2 / sigma**2 - gamma + 0.5 * log_one_minus_phi2
        innovations = x[1:] - phi * x[:-1]
        log_ar = -0.5 * pt.sum(innovations**2) / sigma**2 - (num_steps - 1) * gamma
        log_sigma = -nu * gamma - 0.5 * nu * s2 * pt.exp(-2.0 * gamma)
        # u = (phi + 1) / 2 = sigmoid(2 alpha): log u = -softplus(-2 alpha), log(1 - u) = -softplus(2 alpha)
        log_u, log_1mu = -pt.softplus(-2.0 * alpha), -pt.softplus(2.0 * alpha)
        log_phi = 19.0 * log_u + 0.5 * log_1mu + log_one_minus_phi2
        pm.Potential("logp", loglik + log_x1 + log_ar + log_sigma + log_phi)
    return model


# name -> builder; the names are those of benchmarks.models.MODELS
PYMC_MODELS: dict[str, Callable[[], pm.Model]] = {
    "pima": _pima,
    "ripley": _ripley,
    "breast_cancer": _breast_cancer,
    "std_gauss_10": _std_gauss_10,
    "diag_gauss_10": _diag_gauss_10,
    "corr_gauss_2": _corr_gauss_2,
    "stochastic_volatility": stochastic_volatility,
}


def build(name: str) -> pm.Model:
    """The PyMC model registered as ``name`` (a benchmark model name)."""
    try:
        builder = PYMC_MODELS[name]
    except KeyError:
        known = ", ".join(PYMC_MODELS)
        raise NotImplementedError(f"no PyMC version of benchmark model {name!r}; known: {known}") from None
    return builder()


def logp_function(model: pm.Model, **compile_kwargs) -> Callable[[np.ndarray], float]:
    """``x (dim,) -> log density`` of a model built here (PyMC's compiled ``model.logp()``)."""
    logp = model.compile_logp(**compile_kwargs)
    return lambda x: float(logp({"x": np.asarray(x, dtype=np.float64)}))


def max_logp_discrepancy(name: str, points: np.ndarray, **compile_kwargs) -> dict[str, float]:
    """How far the PyMC and JAX log densities of model ``name`` are from differing by a constant.

    Returns ``{"logp": max |d_i - mean(d)| with d_i = logp_pymc(p_i) - logp_jax(p_i),
    "grad": max |grad_pymc - grad_jax|}`` over ``points`` (n, dim); both are zero
    up to rounding when the log densities agree.  Needs JAX (run in float64 inside
    ``jax.enable_x64``, leaving the process's setting alone).
    """
    import jax

    from .models import get_model

    jax_fn = jax.value_and_grad(get_model(name).logdensity_fn)
    model = build(name)
    logp_dlogp = model.compile_fn([model.logp(), model.dlogp()], **compile_kwargs)
    diffs, grad_err = [], 0.0
    for point in np.asarray(points, dtype=np.float64):
        value, grad = logp_dlogp({"x": point})
        with jax.enable_x64(True):
            jax_value, jax_grad = jax_fn(jax.numpy.asarray(point, dtype=np.float64))
        diffs.append(float(value) - float(jax_value))
        grad_err = max(grad_err, float(np.max(np.abs(np.asarray(grad) - np.asarray(jax_grad)))))
    diffs = np.asarray(diffs)
    return {"logp": float(np.max(np.abs(diffs - diffs.mean()))), "grad": grad_err}
