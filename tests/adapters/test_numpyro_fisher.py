"""The model's expected Fisher information as an RMHMC metric (``metric="fisher"``, NumPyro models).

Checks: the metric reproduces the hand-written metrics it generalizes (the paper's logistic
regression, the funnel's), each family's weights equal Monte Carlo averages of the quantities they
stand for (squared scores, expected curvatures), unsupported sites raise, and the NumPyro kernel
samples a hierarchical model with it within Monte Carlo error (STYLE.md: |z| < 4.5, ESS >= 200).
"""

import math

import numpy as np
import pytest

pytest.importorskip("numpyro")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

from ahmc.adapters._jax_metrics import fisher_logistic_metric, riemannian_from_diagonal  # noqa: E402
from ahmc.adapters.numpyro import AdaptiveRMHMC, model_fisher_metric  # noqa: E402

from ..reference import assert_moments_match  # noqa: E402


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def funnel_model(dim=10):
    v = numpyro.sample("v", dist.Normal(0.0, 3.0))
    numpyro.sample("x", dist.Normal(0.0, jnp.exp(v / 2.0)).expand([dim - 1]))


def test_funnel_metric_is_the_hand_written_fisher_metric_with_its_derivatives():
    """diag(1/9 + 9/2, exp(-v), ...): the metric of Girolami & Calderhead / Betancourt & Girolami."""
    def by_hand(x):
        return jnp.concatenate([jnp.full((1,), 1.0 / 9.0 + 4.5), jnp.exp(-x[0]) * jnp.ones(9)])

    diagonal = model_fisher_metric(funnel_model, diagonal=True)
    dense = model_fisher_metric(funnel_model)
    x = jnp.asarray(np.random.default_rng(0).normal(size=10))
    np.testing.assert_allclose(diagonal(x), by_hand(x), rtol=1e-12)
    np.testing.assert_allclose(jax.jacfwd(diagonal)(x), jax.jacfwd(by_hand)(x), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dense(x), jnp.diag(by_hand(x)), rtol=1e-12, atol=1e-14)
    fast, plain = diagonal.riemannian().at(x), riemannian_from_diagonal(by_hand).at(x)  # reverse vs forward mode
    for key in ("g", "dg", "trace"):
        np.testing.assert_allclose(fast[key], plain[key], rtol=1e-12, atol=1e-14)


def test_logistic_regression_metric_is_the_papers():
    """X^T diag(s (1 - s)) X + I / 100 (``fisher_logistic_metric``), value and derivative tensor."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 3))
    y = (rng.uniform(size=40) < 0.5).astype(float)

    def model(X, y):
        beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([3]))
        with numpyro.plate("n", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)

    metric = model_fisher_metric(model, (X, y))
    expected = fisher_logistic_metric(X, prior_variance=100.0)
    beta = jnp.asarray(rng.normal(size=3))
    np.testing.assert_allclose(metric(beta), expected(beta), rtol=1e-12)
    np.testing.assert_allclose(jax.jacfwd(metric)(beta), jax.jacfwd(expected)(beta), rtol=1e-10, atol=1e-12)


THETA = 0.3  # the parent's unconstrained value where the weights are checked
COVARIANCE_2 = np.array([[1.0, 0.6], [0.6, 2.0]])
# family(theta) for a child whose parameter depends on a standard normal parent theta.
LATENT_FAMILIES = {
    "Normal(loc)": lambda t: dist.Normal(t, 1.5),
    "Normal(scale)": lambda t: dist.Normal(0.2, jnp.exp(t)),
    "Cauchy(loc)": lambda t: dist.Cauchy(t, 0.7),
    "Cauchy(scale)": lambda t: dist.Cauchy(0.0, jnp.exp(t)),
    "StudentT(loc)": lambda t: dist.StudentT(4.0, t, 2.0),
    "StudentT(scale)": lambda t: dist.StudentT(4.0, 0.0, jnp.exp(t)),
    "HalfNormal": lambda t: dist.HalfNormal(jnp.exp(t)),
    "HalfCauchy": lambda t: dist.HalfCauchy(jnp.exp(t)),
    "Exponential": lambda t: dist.Exponential(jnp.exp(t)),
    "LogNormal(loc)": lambda t: dist.LogNormal(t, 0.8),
    "LogNormal(scale)": lambda t: dist.LogNormal(0.1, jnp.exp(t)),
    "Gamma(concentration)": lambda t: dist.Gamma(jnp.exp(t), 2.0),
    "Gamma(rate)": lambda t: dist.Gamma(3.0, jnp.exp(t)),
    "Gamma(both)": lambda t: dist.Gamma(jnp.exp(t), jnp.exp(0.5 * t)),  # the block's cross term
    "Laplace(loc)": lambda t: dist.Laplace(t, 0.7),
    "Laplace(scale)": lambda t: dist.Laplace(0.2, jnp.exp(t)),
    "InverseGamma(concentration)": lambda t: dist.InverseGamma(jnp.exp(t), 2.0),
    "InverseGamma(both)": lambda t: dist.InverseGamma(3.0 * jnp.exp(t), jnp.exp(0.5 * t)),
    "Beta(concentration1)": lambda t: dist.Beta(2.0 * jnp.exp(t), 3.0),
    "Beta(both)": lambda t: dist.Beta(jnp.exp(t), 2.0 * jnp.exp(-0.5 * t)),
    "Uniform": lambda t: dist.Uniform(-1.0, 2.0),  # fixed bounds: only the own term
}
# Laplace's log density has a kink: autodiff sees a zero second derivative, so its expected curvature and
# cross terms are checked through the information identity, E[-d^2 log p] = E[(d log p)^2].
KINKED = ("Laplace(loc)", "Laplace(scale)")
OBSERVED_FAMILIES = {
    "BernoulliLogits": lambda t: dist.Bernoulli(logits=t),
    "BernoulliProbs": lambda t: dist.Bernoulli(probs=jax.nn.sigmoid(t)),
    "BinomialLogits": lambda t: dist.Binomial(7, logits=t),
    "BinomialProbs": lambda t: dist.Binomial(7, probs=jax.nn.sigmoid(t)),
    "Poisson": lambda t: dist.Poisson(jnp.exp(t)),
    "LogNormal": lambda t: dist.LogNormal(t, jnp.exp(0.5 * t)),
    "Gamma": lambda t: dist.Gamma(jnp.exp(t), jnp.exp(0.5 * t)),
    "InverseGamma": lambda t: dist.InverseGamma(3.0 * jnp.exp(t), jnp.exp(0.5 * t)),
    "Beta": lambda t: dist.Beta(jnp.exp(t), 2.0 * jnp.exp(-0.5 * t)),
    "Laplace": lambda t: dist.Laplace(t, jnp.exp(0.5 * t)),
    "CategoricalLogits": lambda t: dist.Categorical(logits=jnp.array([1.0, 0.5, -1.0]) * t + jnp.array([0.2, 0, -0.3])),
    "CategoricalProbs": lambda t: dist.Categorical(probs=jax.nn.softmax(jnp.array([1.0, -0.5, 0.3, 0.0]) * t)),
    "MultinomialLogits": lambda t: dist.Multinomial(5, logits=jnp.array([1.0, 0.5, -1.0]) * t),
    "MultinomialProbs": lambda t: dist.Multinomial(5, probs=jax.nn.softmax(jnp.array([0.4, -1.0, 0.0]) * t + 0.1)),
    "MultivariateNormal(loc)": lambda t: dist.MultivariateNormal(jnp.array([1.0, -2.0]) * t, jnp.array(COVARIANCE_2)),
    "MultivariateNormal(covariance)": lambda t: dist.MultivariateNormal(
        jnp.zeros(2), jnp.array([[1.0 + t**2, 0.5 * t], [0.5 * t, jnp.exp(t)]])),
}


def monte_carlo(family, num=200_000):
    """Draws of the child at THETA, and in the sampler's coordinate u (log for positive support, logit
    of the position in an interval), with the map from u to the value."""
    child = family(THETA)
    draws = child.sample(jax.random.key(7), (num,))
    if child.support.is_discrete:  # an observed child only: no sampler coordinate
        return draws, None, None
    transform = dist.transforms.biject_to(child.support)
    return draws, transform.inv(draws), transform


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name == "Beta(both)" else name
                                  for name in sorted(LATENT_FAMILIES)])  # Beta(both): 20 s, Beta(concentration1) stays
def test_latent_family_weights_equal_monte_carlo_averages(name):
    """G[theta, theta] - 1 = E[(d log p / d theta)^2] (Fisher information of the parent),
    G[u, u] = E[-d^2 log p_u / du^2] (the child's own curvature, Jacobian included), and for a
    location-scale family G[theta, u] = E[-d^2 log p_u / d theta du] (exact expected Hessian)."""
    family = LATENT_FAMILIES[name]

    def model():
        theta = numpyro.sample("a_theta", dist.Normal(0.0, 1.0))
        numpyro.sample("b_child", family(theta))

    draws, u, transform = monte_carlo(family)
    metric = model_fisher_metric(model)

    def log_p(theta, u):  # the child's log density in the sampler's coordinate, Jacobian included
        value = transform(u)
        return family(theta).log_prob(value) + transform.log_abs_det_jacobian(u, value)

    score = jax.vmap(jax.grad(log_p, argnums=(0, 1)), (None, 0))(THETA, u)
    hessian = jax.vmap(jax.hessian(log_p, argnums=(0, 1)), (None, 0))(THETA, u)
    if name in KINKED:
        hessian = [[-score[i] * score[j] for j in range(2)] for i in range(2)]
    g = np.asarray(metric(jnp.array([THETA, float(np.median(u))])))  # the weights do not depend on u
    # Draws of the child at the metric's u would do; the metric itself depends on theta only.
    np.testing.assert_allclose(g[0, 0] - 1.0, np.mean(score[0]**2), rtol=0.02, atol=1e-12)
    np.testing.assert_allclose(g[1, 1], -np.mean(hessian[1][1]), rtol=0.02)
    if transform is dist.transforms.biject_to(dist.constraints.real):  # location-scale: the exact Hessian
        np.testing.assert_allclose(g[0, 1], -np.mean(hessian[0][1]), rtol=0.02, atol=0.01)
    assert np.all(np.linalg.eigvalsh(g) > 0)


@pytest.mark.parametrize("name", sorted(OBSERVED_FAMILIES))
def test_observed_family_weights_equal_monte_carlo_fisher_information(name):
    family = OBSERVED_FAMILIES[name]

    def model(y):
        theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
        numpyro.sample("y", family(theta), obs=y)

    draws, _, _ = monte_carlo(family)
    score = jax.vmap(jax.grad(lambda t, y: family(t).log_prob(y)), (None, 0))(THETA, draws)
    metric = model_fisher_metric(model, (draws[0],))
    np.testing.assert_allclose(metric(jnp.array([THETA]))[0, 0] - 1.0, np.mean(score**2), rtol=0.02)


COVARIANCE = np.array([[1.0, 0.6, -0.2], [0.6, 2.0, 0.3], [-0.2, 0.3, 0.5]])


@pytest.mark.slow  # 2026-12-05: the default suite took 18-22 min on this host; a default test covers most of it
def test_multivariate_normal_gives_its_precision_over_the_residual_and_its_covariance_information():
    """theta ~ N(0, 1), x ~ MVN(theta a, S) with y ~ MVN(B x, S) observed: the exact expected Hessian,
    [[1 + a^T P a, -(P a)^T], [-P a, P + B^T P B]] with P = S^-1, constant (zero derivative).  With
    s ~ LogNormal(0, 1) and x ~ MVN(0, s^2 S), u = log s: 1 + 1/2 tr(P dS/du P dS/du) = 1 + 2 k for u,
    and P / s^2 for x."""
    a, B = np.array([1.0, -0.5, 2.0]), np.array([[1.0, 0.0, 0.5], [0.0, 2.0, 0.0], [0.3, 0.0, 1.0]])
    P = np.linalg.inv(COVARIANCE)

    def model():
        theta = numpyro.sample("a_theta", dist.Normal(0.0, 1.0))
        x = numpyro.sample("b_x", dist.MultivariateNormal(theta * a, COVARIANCE))
        numpyro.sample("y", dist.MultivariateNormal(jnp.asarray(B) @ x, COVARIANCE), obs=jnp.zeros(3))

    expected = np.block([[1.0 + a @ P @ a, -(P @ a)[None, :]], [-(P @ a)[:, None], P + B.T @ P @ B]])
    metric = model_fisher_metric(model)
    position = jnp.array([0.3, 0.1, -0.4, 0.8])
    np.testing.assert_allclose(metric(position), expected, rtol=1e-10)
    np.testing.assert_allclose(jax.jacfwd(metric)(position), 0.0, atol=1e-10)
    np.testing.assert_allclose(model_fisher_metric(model, diagonal=True)(position), np.diag(expected), rtol=1e-10)

    def scaled():
        s = numpyro.sample("s", dist.LogNormal(0.0, 1.0))
        numpyro.sample("x", dist.MultivariateNormal(jnp.zeros(3), s**2 * jnp.asarray(COVARIANCE)))

    u = 0.4
    expected = np.block([[np.array([[7.0]]), np.zeros((1, 3))], [np.zeros((3, 1)), P / math.exp(2 * u)]])
    for diagonal in (False, True):
        got = model_fisher_metric(scaled, diagonal=diagonal)(jnp.array([u, 0.5, -1.0, 0.2]))
        np.testing.assert_allclose(got, np.diag(expected) if diagonal else expected, rtol=1e-10)
    # A scale of 3 on every site triples every term, the covariance's included (entered once): 3 (1 + 6) for u.
    triple = model_fisher_metric(numpyro.handlers.scale(scaled, scale=3.0))(jnp.array([u, 0.5, -1.0, 0.2]))
    np.testing.assert_allclose(triple, np.block([[np.array([[21.0]]), np.zeros((1, 3))],
                                                 [np.zeros((3, 1)), 3.0 * P / math.exp(2 * u)]]), rtol=1e-10)


def test_mask_and_plate_scale_weight_the_terms():
    """A masked-out observation adds nothing; a subsampling plate scales the data's information."""
    X = jnp.asarray(np.random.default_rng(2).normal(size=(6, 2)))

    def model(mask=None, scale=None):
        beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([2]))
        with numpyro.handlers.scale(scale=scale if scale is not None else 1.0):
            numpyro.sample("y", dist.Bernoulli(logits=X @ beta).mask(mask if mask is not None else True),
                           obs=jnp.ones(6))

    beta = jnp.array([0.2, -0.4])
    full = model_fisher_metric(model)(beta)
    prior = jnp.eye(2)
    mask = jnp.array([True, True, True, False, False, False])
    masked = model_fisher_metric(model, model_kwargs={"mask": mask})(beta)
    s = jax.nn.sigmoid(X @ beta)
    np.testing.assert_allclose(masked - prior, (X[:3].T * (s[:3] * (1 - s[:3]))) @ X[:3], rtol=1e-12)
    scaled = model_fisher_metric(model, model_kwargs={"scale": 3.0})(beta)
    np.testing.assert_allclose(scaled - prior, 3.0 * (full - prior), rtol=1e-12)


def test_unsupported_sites_and_potential_fn_raise():
    def beta_prior():
        numpyro.sample("rate", dist.Weibull(2.0, 1.0))

    with pytest.raises(ValueError, match="latent site 'rate' \\(Weibull\\).*softabs"):
        model_fisher_metric(beta_prior)(jnp.zeros(1))

    def moving_bounds():
        top = numpyro.sample("top", dist.Exponential(1.0))
        numpyro.sample("x", dist.Uniform(0.0, top))

    with pytest.raises(ValueError, match="bounds of the Uniform site 'x' fixed"):
        model_fisher_metric(moving_bounds)(jnp.zeros(2))

    def observed_uniform():
        top = numpyro.sample("top", dist.Exponential(1.0))
        numpyro.sample("y", dist.Uniform(0.0, top), obs=jnp.array(0.5))

    with pytest.raises(ValueError, match="observed site 'y' \\(Uniform\\).*latent-only for Uniform"):
        model_fisher_metric(observed_uniform)(jnp.zeros(1))

    def with_factor():
        x = numpyro.sample("x", dist.Normal(0.0, 1.0))
        numpyro.factor("penalty", -x**4)

    with pytest.raises(ValueError, match="'penalty' is a numpyro.factor"):
        model_fisher_metric(with_factor)(jnp.zeros(1))
    with pytest.raises(ValueError, match="needs `model`"):
        AdaptiveRMHMC(potential_fn=lambda z: jnp.sum(z**2), metric="fisher")
    with pytest.raises(ValueError, match="latent site 'rate'"):
        MCMC(AdaptiveRMHMC(beta_prior, metric="fisher"), num_warmup=5, num_samples=5,
             progress_bar=False).run(jax.random.key(0))


def hierarchical():
    """s ~ HalfNormal(1), mu ~ N(0, 1), x_i | mu, s ~ N(mu, s) (a small funnel): the metric has a scale
    term for s (from x), residual terms tying x to mu, and every site's own term."""
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    numpyro.sample("x", dist.Normal(mu, s).expand([3]))


@pytest.mark.parametrize("metric, num_samples", [("fisher", 1500), pytest.param("diagonal_fisher", 4000,
                                                                                   marks=pytest.mark.slow)])
def test_numpyro_kernel_samples_a_hierarchical_model(metric, num_samples):
    """Exact marginals: s ~ HalfNormal(1) (log s checked: mean -(gamma + log 2)/2, sd pi/sqrt(8)),
    mu ~ N(0, 1), x_i ~ N(0, sd sqrt(2)). The diagonal metric's bulk ESS of log s over 1500 draws ranged
    46-884 by seed (2026-12-07, before and after the step-size search moved into the warm-up): 4000 draws."""
    mcmc = MCMC(AdaptiveRMHMC(hierarchical, metric=metric), num_warmup=500, num_samples=num_samples, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(3), extra_fields=("fixed_point_converged",))
    draws = mcmc.get_samples(group_by_chain=True)
    log_s_mean, log_s_sd = -(np.euler_gamma + math.log(2.0)) / 2.0, math.pi / math.sqrt(8.0)
    assert_moments_match(np.log(np.asarray(draws["s"])), log_s_mean, log_s_sd)
    assert_moments_match(np.asarray(draws["mu"]), 0.0, 1.0)
    assert_moments_match(np.asarray(draws["x"]), np.zeros(3), np.full(3, math.sqrt(2.0)))
    assert np.mean(mcmc.get_extra_fields()["fixed_point_converged"]) > 0.9


Y_INVERSE_GAMMA = np.array([0.8, -1.5, 0.3, 2.1, -0.6])


def conjugate():
    """Independent pieces with known posteriors: p ~ Beta(2, 3) with 4 of 10 successes (Beta(6, 9)),
    v ~ InverseGamma(3, 2) with five N(0, v) observations (InverseGamma(5.5, 2 + sum y^2 / 2)), and the
    priors u ~ Uniform(-1, 2), l ~ Laplace(1, 0.5), and s ~ LogNormal(0, 0.5) with x ~ MVN(0, s^2 S) (a small
    funnel through a moving covariance: log s ~ N(0, 0.5), x_i with variance exp(0.5) S_ii)."""
    p = numpyro.sample("p", dist.Beta(2.0, 3.0))
    numpyro.sample("k", dist.Binomial(10, probs=p), obs=jnp.array(4.0))
    v = numpyro.sample("v", dist.InverseGamma(3.0, 2.0))
    numpyro.sample("y", dist.Normal(0.0, jnp.sqrt(v)).expand([5]), obs=jnp.asarray(Y_INVERSE_GAMMA))
    numpyro.sample("u", dist.Uniform(-1.0, 2.0))
    numpyro.sample("l", dist.Laplace(1.0, 0.5))
    s = numpyro.sample("s", dist.LogNormal(0.0, 0.5))
    numpyro.sample("x", dist.MultivariateNormal(jnp.zeros(3), s**2 * jnp.asarray(COVARIANCE)))


@pytest.mark.slow  # 56 s; the families' weights are checked by Monte Carlo above, in the default suite
def test_numpyro_kernel_samples_beta_inverse_gamma_uniform_laplace_and_multivariate_normal_sites():
    mcmc = MCMC(AdaptiveRMHMC(conjugate, metric="fisher"), num_warmup=500, num_samples=1500, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(4))
    draws = mcmc.get_samples(group_by_chain=True)
    a, b = 6.0, 9.0
    assert_moments_match(np.asarray(draws["p"]), a / (a + b), math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1.0))))
    shape, rate = 5.5, 2.0 + float(np.sum(Y_INVERSE_GAMMA**2)) / 2.0
    assert_moments_match(np.asarray(draws["v"]), rate / (shape - 1.0),
                         rate / ((shape - 1.0) * math.sqrt(shape - 2.0)))
    assert_moments_match(np.asarray(draws["u"]), 0.5, 3.0 / math.sqrt(12.0))
    assert_moments_match(np.asarray(draws["l"]), 1.0, 0.5 * math.sqrt(2.0))
    assert_moments_match(np.log(np.asarray(draws["s"])), 0.0, 0.5)
    assert_moments_match(np.asarray(draws["x"]), np.zeros(3), np.sqrt(math.exp(0.5) * np.diag(COVARIANCE)))


def test_affine_quantities_take_a_constant_jacobian_and_give_the_same_metric(monkeypatch):
    """Quantities affine in the position (residuals such as y_j - theta_j, logits X beta) skip autodiff at
    run time; the metric and its derivative are those of the all-autodiff route."""
    from ahmc.adapters import _numpyro_fisher

    kinds = _numpyro_fisher._affine_outputs(
        lambda x: [2.0 * x[:2] - 1.0, jnp.exp(x[0]), x[0] * x[1], x[1:] / 3.0, jnp.split(x, 3)[0] @ jnp.ones(1)],
        jnp.zeros(3))
    assert kinds == [True, False, False, True, True]

    def centered(y=np.array([28.0, 8.0, -3.0]), sigma=np.array([15.0, 10.0, 16.0])):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        theta = numpyro.sample("theta", dist.Normal(mu, tau).expand([3]))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)

    x = jnp.asarray(np.random.default_rng(3).normal(size=5))
    fast = {d: model_fisher_metric(centered, diagonal=d) for d in (True, False)}
    monkeypatch.setattr(_numpyro_fisher, "_output_kinds", lambda fn, flat: ["nonlinear"] * len(fn(flat)))
    plain = {d: model_fisher_metric(centered, diagonal=d) for d in (True, False)}
    assert fast[True]._route(x)[1] != plain[True]._route(x)[1]  # the residuals took the constant route
    for d in (True, False):
        np.testing.assert_allclose(fast[d](x), plain[d](x), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(jax.jacfwd(fast[d])(x), jax.jacfwd(plain[d])(x), rtol=1e-10, atol=1e-12)
