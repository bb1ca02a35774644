"""PyMC's ``AdaptiveRMHMC(metric="fisher" | "diagonal_fisher")``: the model's expected Fisher information.

The metric equals the hand-written ones it generalizes (the funnel's, the paper's logistic
regression), its derivative equals finite differences, unsupported variables raise before sampling,
and ``pm.sample`` draws a small hierarchical model within Monte Carlo error (STYLE.md).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pm = pytest.importorskip("pymc")
import pytensor.tensor as pt  # noqa: E402

from ahmc.adapters.pymc import AdaptiveRMHMC  # noqa: E402
from tests.reference import assert_moments_match  # noqa: E402

SAMPLING_TESTS = {"test_hierarchical_model_moments", "test_beta_inverse_gamma_uniform_and_laplace_variables_sample_their_posteriors"}


@pytest.fixture(autouse=True)
def fast_compile(request):
    """Tests that only evaluate the metric once compile it in PyTensor's FAST_COMPILE mode (Python
    implementations, few rewrites): a Numba compile of a Fisher metric's derivative took 50-80 s with a
    cold cache (a new machine) and bought nothing for one evaluation. The sampling tests keep the default."""
    if request.node.originalname in SAMPLING_TESTS:
        yield
        return
    import pytensor

    with pytensor.config.change_flags(mode="FAST_COMPILE"):
        yield

QUIET = dict(progressbar=False, compute_convergence_checks=False)


def funnel():
    with pm.Model() as model:
        v = pm.Normal("v", 0.0, 3.0)
        pm.Normal("x", 0.0, pt.exp(v / 2), shape=9)
    return model


@pytest.mark.parametrize("metric", ["fisher", "diagonal_fisher"])
def test_funnel_metric_and_its_derivative(metric):
    """diag(1/9 + 9/2, exp(-v), ...) with dG/dv = -exp(-v) on the x entries (finite differences)."""
    with funnel():
        step = AdaptiveRMHMC(metric=metric)
    x = np.r_[0.7, np.random.default_rng(0).normal(size=9)]
    _, _, matrix, derivative = step._geometry_function(x)
    np.testing.assert_allclose(matrix, np.diag(np.r_[1 / 9 + 4.5, np.full(9, np.exp(-0.7))]), rtol=1e-8, atol=1e-12)
    h = 1e-6
    for k in (0, 3):
        e = np.eye(10)[k]
        numeric = (step._geometry_function(x + h * e)[2] - step._geometry_function(x - h * e)[2]) / (2 * h)
        np.testing.assert_allclose(derivative[k], numeric, atol=1e-8)


def test_logistic_regression_metric_is_the_papers_and_stays_finite_at_saturated_logits():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 3))
    y = (rng.uniform(size=40) < 0.5).astype(float)
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 10.0, shape=3)
        pm.Bernoulli("y", logit_p=pt.as_tensor_variable(X) @ beta, observed=y)
        step = AdaptiveRMHMC(metric="fisher")
    for beta_value in (rng.normal(size=3), np.array([80.0, -60.0, 40.0])):  # the second saturates sigmoid
        s = 1.0 / (1.0 + np.exp(-X @ beta_value))
        expected = (X.T * (s * (1.0 - s))) @ X + np.eye(3) / 100.0
        np.testing.assert_allclose(step._geometry_function(beta_value)[2], expected, rtol=1e-8, atol=1e-12)


def test_a_childs_residual_ties_it_to_its_parents_location():
    """mu ~ N(0, 1), x_i ~ N(mu, 0.5): the exact expected Hessian, here the posterior precision,
    [[1 + 2 * 4, -4, -4], [-4, 4, 0], [-4, 0, 4]] (constant, so the derivative is zero)."""
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 1.0)
        pm.Normal("x", mu, 0.5, shape=2)
        step = AdaptiveRMHMC(metric="fisher")
    _, _, matrix, derivative = step._geometry_function(np.array([0.3, -1.0, 2.0]))
    np.testing.assert_allclose(matrix, [[9.0, -4.0, -4.0], [-4.0, 4.0, 0.0], [-4.0, 0.0, 4.0]], atol=1e-12)
    np.testing.assert_allclose(derivative, 0.0, atol=1e-12)


def test_unsupported_variables_raise_before_sampling():
    with pm.Model():
        pm.Weibull("rate", 2.0, 1.0)
        with pytest.raises(ValueError, match="free variable 'rate' \\(WeibullBetaRV, distribution\\)"):
            AdaptiveRMHMC(metric="fisher")
    with pm.Model():
        top = pm.Exponential("top", 1.0)
        pm.Uniform("x", 0.0, top)
        with pytest.raises(ValueError, match="bounds of the Uniform variable 'x' fixed"):
            AdaptiveRMHMC(metric="fisher")
    with pm.Model():
        pm.Uniform("y", 0.0, 2.0, observed=[0.5])
        pm.Normal("x", 0.0, 1.0)
        with pytest.raises(ValueError, match="observed variable 'y' \\(UniformRV, distribution\\)"):
            AdaptiveRMHMC(metric="fisher")
    with pm.Model():
        pm.HalfNormal("scale", 1.0, default_transform=None)
        with pytest.raises(ValueError, match="'scale' \\(HalfNormalRV, transform NoneType\\)"):
            AdaptiveRMHMC(metric="diagonal_fisher")
    with pm.Model():
        pm.Normal("x", 0.0, 1.0)
        with pytest.raises(ValueError, match="\"fisher\""):
            AdaptiveRMHMC(metric="fischer")


@pytest.mark.slow  # 2026-12-05: the default suite took 18-22 min on this host; a default test covers most of it
def test_hierarchical_model_moments():
    """s ~ HalfNormal(1), mu ~ N(0, 1), x_i | mu, s ~ N(mu, s), i = 1..3 (a small funnel): log s has mean
    -(gamma + log 2)/2 and sd pi/sqrt(8), mu ~ N(0, 1), x_i ~ N(0, sd sqrt(2))."""
    with pm.Model():
        s = pm.HalfNormal("s", 1.0)
        mu = pm.Normal("mu", 0.0, 1.0)
        pm.Normal("x", mu, s, shape=3)
        idata = pm.sample(step=AdaptiveRMHMC(metric="fisher"), tune=500, draws=1500, chains=4, cores=1,
                          random_seed=5, **QUIET)
    post = idata.posterior
    assert_moments_match(np.log(post["s"].values), -(np.euler_gamma + math.log(2.0)) / 2.0, math.pi / math.sqrt(8.0))
    assert_moments_match(post["mu"].values, 0.0, 1.0)
    assert_moments_match(post["x"].values, np.zeros(3), np.full(3, math.sqrt(2.0)))
    assert idata.sample_stats["fixed_point_converged"].values.mean() > 0.9


@pytest.mark.slow  # about a minute; the metric itself is checked family by family below
def test_beta_inverse_gamma_uniform_and_laplace_variables_sample_their_posteriors():
    """The conjugate model of tests/adapters/test_numpyro_fisher.py in PyMC: p ~ Beta(2, 3) with 4 of 10
    successes, v ~ InverseGamma(3, 2) with five N(0, v) observations, u ~ Uniform(-1, 2), l ~ Laplace(1, 0.5),
    s ~ LogNormal(0, 0.5) with x ~ MvNormal(0, s^2 S)."""
    y = np.array([0.8, -1.5, 0.3, 2.1, -0.6])
    with pm.Model():
        p = pm.Beta("p", 2.0, 3.0)
        pm.Binomial("k", n=10, p=p, observed=4)
        v = pm.InverseGamma("v", 3.0, 2.0)
        pm.Normal("y", 0.0, pm.math.sqrt(v), observed=y)
        pm.Uniform("u", -1.0, 2.0)
        pm.Laplace("l", 1.0, 0.5)
        s = pm.LogNormal("s", 0.0, 0.5)
        pm.MvNormal("x", np.zeros(3), cov=s**2 * COVARIANCE)
        idata = pm.sample(step=AdaptiveRMHMC(metric="fisher"), tune=500, draws=1500, chains=4, cores=1,
                          random_seed=4, **QUIET)
    post = idata.posterior
    a, b = 6.0, 9.0
    assert_moments_match(post["p"].values, a / (a + b), math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1.0))))
    shape, rate = 5.5, 2.0 + float(np.sum(y**2)) / 2.0
    assert_moments_match(post["v"].values, rate / (shape - 1.0), rate / ((shape - 1.0) * math.sqrt(shape - 2.0)))
    assert_moments_match(post["u"].values, 0.5, 3.0 / math.sqrt(12.0))
    assert_moments_match(post["l"].values, 1.0, 0.5 * math.sqrt(2.0))
    assert_moments_match(np.log(post["s"].values), 0.0, 0.5)
    assert_moments_match(post["x"].values, np.zeros(3), np.sqrt(math.exp(0.5) * np.diag(COVARIANCE)))
    assert idata.sample_stats["fixed_point_converged"].values.mean() > 0.9


COVARIANCE = np.array([[1.0, 0.6, -0.2], [0.6, 2.0, 0.3], [-0.2, 0.3, 0.5]])


def _moving_covariance(xp, t):
    """A 2 x 2 covariance that moves with t, in PyTensor (``xp = pt``) or JAX (``xp = "jax"``)."""
    if xp == "jax":
        import jax.numpy as xp
    return xp.stack([xp.stack([1.0 + t**2, 0.5 * t]), xp.stack([0.5 * t, xp.exp(t)])])


# Each family as a child of a standard normal parent theta, in PyMC and in NumPyro (whose weights
# tests/adapters/test_numpyro_fisher.py checks against Monte Carlo averages).
FAMILIES = {
    "Normal": (lambda t: pm.Normal("b_child", t, pt.exp(0.5 * t)),
               lambda d, t: d.Normal(t, np.exp(0.5) ** t)),
    "Cauchy": (lambda t: pm.Cauchy("b_child", t, pt.exp(t)), lambda d, t: d.Cauchy(t, np.e ** t)),
    "StudentT": (lambda t: pm.StudentT("b_child", nu=4.0, mu=0.3 * t, sigma=pt.exp(t)),
                 lambda d, t: d.StudentT(4.0, 0.3 * t, np.e ** t)),
    "HalfNormal": (lambda t: pm.HalfNormal("b_child", pt.exp(t)), lambda d, t: d.HalfNormal(np.e ** t)),
    "HalfCauchy": (lambda t: pm.HalfCauchy("b_child", pt.exp(t)), lambda d, t: d.HalfCauchy(np.e ** t)),
    "Exponential": (lambda t: pm.Exponential("b_child", pt.exp(t)), lambda d, t: d.Exponential(np.e ** t)),
    "LogNormal": (lambda t: pm.LogNormal("b_child", t, pt.exp(0.5 * t)),
                  lambda d, t: d.LogNormal(t, np.exp(0.5) ** t)),
    "Gamma": (lambda t: pm.Gamma("b_child", pt.exp(t), pt.exp(0.5 * t)),
              lambda d, t: d.Gamma(np.e ** t, np.exp(0.5) ** t)),
    "Gamma(observed)": (lambda t: pm.Gamma("b_child", pt.exp(t), pt.exp(0.5 * t), observed=[0.7, 2.0]),
                        lambda d, t: d.Gamma(np.e ** t * np.ones(2), np.exp(0.5) ** t)),
    "Laplace": (lambda t: pm.Laplace("b_child", t, pt.exp(0.5 * t)), lambda d, t: d.Laplace(t, np.exp(0.5) ** t)),
    "InverseGamma": (lambda t: pm.InverseGamma("b_child", pt.exp(t), pt.exp(0.5 * t)),
                     lambda d, t: d.InverseGamma(np.e ** t, np.exp(0.5) ** t)),
    "InverseGamma(observed)": (lambda t: pm.InverseGamma("b_child", pt.exp(t), pt.exp(0.5 * t), observed=[0.7, 2.0]),
                               lambda d, t: d.InverseGamma(np.e ** t * np.ones(2), np.exp(0.5) ** t)),
    "Beta": (lambda t: pm.Beta("b_child", pt.exp(t), 2.0 * pt.exp(-0.5 * t)),
             lambda d, t: d.Beta(np.e ** t, 2.0 * np.exp(-0.5) ** t)),
    "Beta(observed)": (lambda t: pm.Beta("b_child", pt.exp(t), 2.0 * pt.exp(-0.5 * t), observed=[0.3, 0.8]),
                       lambda d, t: d.Beta(np.e ** t * np.ones(2), 2.0 * np.exp(-0.5) ** t)),
    "Uniform": (lambda t: pm.Uniform("b_child", -1.0, 2.0), lambda d, t: d.Uniform(-1.0, 2.0)),
    "MvNormal": (lambda t: pm.MvNormal("b_child", t * np.array([1.0, -0.5]), cov=[[1.0, 0.6], [0.6, 2.0]]),
                 lambda d, t: d.MultivariateNormal(t * np.array([1.0, -0.5]), np.array([[1.0, 0.6], [0.6, 2.0]]))),
    "MvNormal(observed)": (lambda t: pm.MvNormal("b_child", t * np.array([1.0, -0.5]), cov=[[1.0, 0.6], [0.6, 2.0]],
                                                 observed=[0.3, 1.0]),
                           lambda d, t: d.MultivariateNormal(t * np.array([1.0, -0.5]),
                                                             np.array([[1.0, 0.6], [0.6, 2.0]]))),
    "Bernoulli": (lambda t: pm.Bernoulli("b_child", logit_p=t, observed=[0.0, 1.0]),
                  lambda d, t: d.Bernoulli(logits=t * np.ones(2))),
    "Binomial": (lambda t: pm.Binomial("b_child", n=7, p=pm.math.sigmoid(t), observed=[3.0, 5.0]),
                 lambda d, t: d.Binomial(7, probs=1.0 / (1.0 + np.e ** -t) * np.ones(2))),
    "MvNormal(covariance)": (lambda t: pm.MvNormal("b_child", np.zeros(2), cov=_moving_covariance(pt, t)),
                             lambda d, t: d.MultivariateNormal(np.zeros(2), _moving_covariance("jax", t))),
    "MvNormal(covariance, observed)": (
        lambda t: pm.MvNormal("b_child", np.zeros(2), cov=_moving_covariance(pt, t), observed=[[0.3, 1.0], [-1, 2]]),
        lambda d, t: d.MultivariateNormal(np.zeros(2), _moving_covariance("jax", t))),
    "Categorical": (lambda t: pm.Categorical("b_child", logit_p=pt.as_tensor([1.0, 0.5, -1.0]) * t, observed=[0, 2]),
                    lambda d, t: d.Categorical(logits=np.array([[1.0, 0.5, -1.0]] * 2) * t)),
    # p not written as a softmax in the graph: its logits are taken as log p
    "Categorical(p)": (lambda t: pm.Categorical("b_child", p=1.0 * pm.math.softmax(pt.as_tensor([0.4, -1.0, 0.0]) * t),
                                                observed=[1, 0]),
                       lambda d, t: d.Categorical(logits=np.ones((2, 1)) * np.array([0.4, -1.0, 0.0]) * t)),
    "Multinomial": (lambda t: pm.Multinomial("b_child", n=5, p=pm.math.softmax(pt.as_tensor([1.0, 0.5, -1.0]) * t),
                                             observed=[[2, 2, 1], [0, 1, 4]]),
                    lambda d, t: d.Multinomial(5, logits=np.ones((2, 1)) * np.array([1.0, 0.5, -1.0]) * t)),
    "Poisson": (lambda t: pm.Poisson("b_child", pt.exp(t), observed=[2.0, 0.0]),
                lambda d, t: d.Poisson(np.e ** t * np.ones(2))),
}


# Their special functions (digamma, trigamma) take PyTensor 10-25 s to compile: Beta and Gamma stay in the
# default suite, their observed and inverse variants run with the slow tests; so does the observed MvNormal
# with a covariance (17 s; the observed MvNormal and the latent one with a covariance stay).
SLOW_FAMILIES = {"Beta(observed)", "Gamma(observed)", "InverseGamma", "InverseGamma(observed)",
                 "MvNormal(covariance, observed)"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_FAMILIES else name
                                  for name in sorted(FAMILIES)])
def test_each_family_matches_the_numpyro_metric(name):
    numpyro = pytest.importorskip("numpyro")
    import jax
    import numpyro.distributions as dist

    from ahmc.adapters.numpyro import model_fisher_metric

    pymc_child, numpyro_child = FAMILIES[name]
    observed = name.startswith(("Bernoulli", "Binomial", "Poisson", "Categorical", "Multinomial")) or "observed" in name
    with pm.Model():
        theta = pm.Normal("a_theta", 0.0, 1.0)
        pymc_child(theta)
        step = AdaptiveRMHMC(metric="fisher")
    position = np.array([0.4]) if observed else np.array([0.4, -0.3, 0.2] if name.startswith("MvNormal")
                                                         else [0.4, -0.3])
    data = {"Bernoulli": [0.0, 1.0], "Binomial": [3.0, 5.0], "Poisson": [2.0, 0.0],
            "Gamma(observed)": [0.7, 2.0], "InverseGamma(observed)": [0.7, 2.0],
            "Beta(observed)": [0.3, 0.8], "Categorical": [0, 2], "Categorical(p)": [1, 0],
            "Multinomial": [[2, 2, 1], [0, 1, 4]], "MvNormal(observed)": [0.3, 1.0],
            "MvNormal(covariance, observed)": [[0.3, 1.0], [-1, 2]]}.get(name)

    def model():
        t = numpyro.sample("a_theta", dist.Normal(0.0, 1.0))
        numpyro.sample("b_child", numpyro_child(dist, t), obs=None if data is None else jax.numpy.asarray(data))

    with jax.enable_x64(True):
        expected = np.asarray(model_fisher_metric(model)(jax.numpy.asarray(position)))
    np.testing.assert_allclose(step._geometry_function(position)[2], expected, rtol=1e-8)
