"""The nine posteriordb posteriors as benchmark targets, with their reference moments.

Data and references are the copies in ``tests/posteriordb/`` (see the README
there for the models in math and the attribution); nothing is duplicated here.
Each posterior is a NumPyro model (five shared with the adapter tests,
``tests/adapters/numpyro_models.py``; the other four below).  NumPyro's
``initialize_model`` turns it into a potential over unconstrained sites, which
is flattened with ``jax.flatten_util.ravel_pytree`` into the benchmark's flat
``logdensity_fn``; its ``postprocess_fn`` maps flat draws back to the
constrained, Stan-named values the reference reports (``theta`` of eight
schools, ``f`` of the GP, ...).  The benchmark then scores each sampler's
posterior means against the reference with the z-score of
``tests/reference.py`` (``zscores_against_reference``: sample MCSE from bulk
ESS, combined with the reference's MCSE).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["POSTERIORS", "build_posterior", "load_data"]


def load_data(posterior: str) -> dict:
    from tests.reference import POSTERIORDB_DIR, _read_json

    return _read_json(POSTERIORDB_DIR / posterior / "data.json")


# --------------------------------------------------------------------------- #
# The four NumPyro models the adapter tests do not have
# --------------------------------------------------------------------------- #


def earnings_logearn_height(data):
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.distributions import constraints

    log_earn, height = jnp.log(jnp.asarray(data["earn"], float)), jnp.asarray(data["height"], float)

    def model():
        beta = numpyro.sample("beta", dist.ImproperUniform(constraints.real, (), (2,)))
        sigma = numpyro.sample("sigma", dist.ImproperUniform(constraints.positive, (), ()))
        numpyro.sample("log_earn", dist.Normal(beta[0] + beta[1] * height, sigma), obs=log_earn)

    return model


def ark(data):
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    y, order = np.asarray(data["y"], float), int(data["K"])
    # lags[t, k] = y_{t-k-1} for the targets y_K..y_{T-1} (0-based)
    lags = np.stack([y[order - k - 1 : len(y) - k - 1] for k in range(order)], axis=1)
    target = y[order:]

    def model():
        alpha = numpyro.sample("alpha", dist.Normal(0.0, 10.0))
        beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([order]))
        sigma = numpyro.sample("sigma", dist.HalfCauchy(2.5))
        numpyro.sample("y", dist.Normal(alpha + jnp.asarray(lags) @ beta, sigma), obs=jnp.asarray(target))

    return model


def diamonds(data):
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.distributions import constraints

    X = np.asarray(data["X"], float)[:, 1:]
    centred = X - X.mean(axis=0)  # brms centres every predictor; Intercept is for the centred design
    response = np.asarray(data["Y"], float)

    def model():
        b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([centred.shape[1]]))
        intercept = numpyro.sample("Intercept", dist.StudentT(3.0, 8.0, 10.0))
        sigma = numpyro.sample("sigma", dist.ImproperUniform(constraints.positive, (), ()))
        numpyro.factor("sigma_prior", dist.StudentT(3.0, 0.0, 10.0).log_prob(sigma))  # half-t up to a constant
        numpyro.sample("Y", dist.Normal(intercept + jnp.asarray(centred) @ b, sigma), obs=jnp.asarray(response))

    return model


def low_dim_gauss_mix(data):
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from jax.scipy.special import logsumexp
    from numpyro.distributions import constraints

    y = jnp.asarray(data["y"], float)

    def model():
        mu = numpyro.sample("mu", dist.ImproperUniform(constraints.ordered_vector, (), (2,)))
        numpyro.factor("mu_prior", dist.Normal(0.0, 2.0).log_prob(mu).sum())
        sigma = numpyro.sample("sigma", dist.HalfNormal(2.0).expand([2]))
        theta = numpyro.sample("theta", dist.Beta(5.0, 5.0))
        parts = jnp.stack([jnp.log(theta) + dist.Normal(mu[0], sigma[0]).log_prob(y),
                           jnp.log1p(-theta) + dist.Normal(mu[1], sigma[1]).log_prob(y)])
        numpyro.factor("y", logsumexp(parts, axis=0).sum())

    return model


def _shared(name: str) -> Callable:
    def builder(data):
        from tests.adapters import numpyro_models

        return numpyro_models.MODELS[name](data)

    return builder


# benchmark name -> (posteriordb name, NumPyro model builder taking the data dict)
POSTERIORS: dict[str, tuple[str, Callable]] = {
    "eight_schools": ("eight_schools-eight_schools_noncentered", _shared("eight_schools-eight_schools_noncentered")),
    "kidiq": ("kidiq-kidscore_momiq", _shared("kidiq-kidscore_momiq")),
    "earnings": ("earnings-logearn_height", earnings_logearn_height),
    "sblrc": ("sblrc-blr", _shared("sblrc-blr")),
    "arK": ("arK-arK", ark),
    "garch": ("garch-garch11", _shared("garch-garch11")),
    "gp_pois_regr": ("gp_pois_regr-gp_pois_regr", _shared("gp_pois_regr-gp_pois_regr")),
    "diamonds": ("diamonds-diamonds", diamonds),
    "gauss_mix": ("low_dim_gauss_mix-low_dim_gauss_mix", low_dim_gauss_mix),
}


def build_posterior(name: str):
    """``(logdensity_fn, dim, derived_fn, posteriordb name)`` of the benchmark posterior ``name``.

    ``logdensity_fn`` takes the flat unconstrained vector (NumPyro's
    ``potential_fn`` negated, Jacobians included); ``derived_fn`` maps draws
    (chains, draws, dim) to the constrained sites and deterministics keyed by
    their names, shape (chains, draws, ...), as ``zscores_against_reference`` wants.
    """
    import jax
    from jax.flatten_util import ravel_pytree
    from numpyro.infer.util import initialize_model

    posterior, builder = POSTERIORS[name]
    model = builder(load_data(posterior))
    info = initialize_model(jax.random.key(0), model, dynamic_args=False)
    flat, unravel = ravel_pytree(info.param_info.z)
    potential_fn, postprocess_fn = info.potential_fn, info.postprocess_fn

    def logdensity_fn(x):
        return -potential_fn(unravel(x))

    @jax.jit
    def _constrain(rows):
        return jax.vmap(lambda row: postprocess_fn(unravel(row)))(rows)

    def derived_fn(draws):
        draws = np.asarray(draws)
        chains, num_draws, dim = draws.shape
        values = _constrain(jax.numpy.asarray(draws.reshape(chains * num_draws, dim), dtype=flat.dtype))
        return {key: np.asarray(v).reshape(chains, num_draws, *np.shape(v)[1:]) for key, v in values.items()}

    return logdensity_fn, int(flat.shape[0]), derived_fn, posterior
