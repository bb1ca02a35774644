"""NumPyro versions of the posteriordb models used in the tests and benchmarks."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints


def eight_schools_noncentered(data):
    y, sigma = jnp.asarray(data["y"], float), jnp.asarray(data["sigma"], float)

    def model():
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        theta_trans = numpyro.sample("theta_trans", dist.Normal(0.0, 1.0).expand([data["J"]]))
        theta = numpyro.deterministic("theta", mu + tau * theta_trans)
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)

    return model


def kidiq_kidscore_momiq(data):
    score, iq = jnp.asarray(data["kid_score"], float), jnp.asarray(data["mom_iq"], float)

    def model():
        beta = numpyro.sample("beta", dist.ImproperUniform(constraints.real, (), (2,)))
        sigma = numpyro.sample("sigma", dist.HalfCauchy(2.5))
        numpyro.sample("kid_score", dist.Normal(beta[0] + beta[1] * iq, sigma), obs=score)

    return model


def sblrc_blr(data):
    x, y = jnp.asarray(data["X"], float), jnp.asarray(data["y"], float)

    def model():
        beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([data["D"]]))
        sigma = numpyro.sample("sigma", dist.HalfNormal(10.0))
        numpyro.sample("y", dist.Normal(x @ beta, sigma), obs=y)

    return model


def garch_garch11(data):
    y = jnp.asarray(data["y"], float)
    sigma1 = float(data["sigma1"])

    def model():
        mu = numpyro.sample("mu", dist.ImproperUniform(constraints.real, (), ()))
        alpha0 = numpyro.sample("alpha0", dist.ImproperUniform(constraints.positive, (), ()))
        alpha1 = numpyro.sample("alpha1", dist.Uniform(0.0, 1.0))
        # Stan's flat density on 0 < beta1 < 1 - alpha1: beta1 = (1 - alpha1) * u, u ~ U(0, 1),
        # and the factor (1 - alpha1) cancels Uniform's normalisation 1 / (1 - alpha1).
        unit = numpyro.sample("beta1_unit", dist.Uniform(0.0, 1.0))
        beta1 = numpyro.deterministic("beta1", (1.0 - alpha1) * unit)
        numpyro.factor("beta1_flat", jnp.log1p(-alpha1))

        def recursion(sigma_prev, y_prev):
            sigma = jnp.sqrt(alpha0 + alpha1 * (y_prev - mu) ** 2 + beta1 * sigma_prev**2)
            return sigma, sigma

        _, sigmas = jax.lax.scan(recursion, jnp.asarray(sigma1, y.dtype), y[:-1])
        sigma = jnp.concatenate([jnp.asarray([sigma1], y.dtype), sigmas])
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)

    return model


def gp_pois_regr(data):
    x = jnp.asarray(data["x"], float)
    counts = jnp.asarray(data["k"])

    def model():
        rho = numpyro.sample("rho", dist.Gamma(25.0, 4.0))
        alpha = numpyro.sample("alpha", dist.HalfNormal(2.0))
        f_tilde = numpyro.sample("f_tilde", dist.Normal(0.0, 1.0).expand([data["N"]]))
        cov = alpha**2 * jnp.exp(-((x[:, None] - x[None, :]) ** 2) / (2 * rho**2)) + 1e-10 * jnp.eye(data["N"])
        f = numpyro.deterministic("f", jnp.linalg.cholesky(cov) @ f_tilde)
        numpyro.sample("k", dist.Poisson(jnp.exp(f)), obs=counts)

    return model


MODELS = {
    "eight_schools-eight_schools_noncentered": eight_schools_noncentered,
    "kidiq-kidscore_momiq": kidiq_kidscore_momiq,
    "sblrc-blr": sblrc_blr,
    "garch-garch11": garch_garch11,
    "gp_pois_regr-gp_pois_regr": gp_pois_regr,
}


def as_numpy(samples):
    return {name: np.asarray(value) for name, value in samples.items()}
