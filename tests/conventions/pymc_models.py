"""PyMC versions of every posteriordb model in tests/posteriordb (the Stan programs' priors and constraints)."""

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt

from tests.reference import load_reference


def eight_schools_noncentered(data):
    theta_trans = pm.Normal("theta_trans", 0, 1, shape=data["J"])
    mu = pm.Normal("mu", 0, 5)
    tau = pm.HalfCauchy("tau", 5)
    pm.Deterministic("theta", theta_trans * tau + mu)
    pm.Normal("y", theta_trans * tau + mu, data["sigma"], observed=data["y"])


def kidiq_kidscore_momiq(data):
    beta = pm.Flat("beta", shape=2)
    sigma = pm.HalfCauchy("sigma", 2.5)
    pm.Normal("kid_score", beta[0] + beta[1] * data["mom_iq"], sigma, observed=data["kid_score"])


def sblrc_blr(data):
    beta = pm.Normal("beta", 0, 10, shape=data["D"])
    sigma = pm.HalfNormal("sigma", 10)
    pm.Normal("y", pm.math.dot(np.asarray(data["X"], dtype=float), beta), sigma, observed=data["y"])


def low_dim_gauss_mix(data):
    mu = pm.Normal("mu", 0, 2, shape=2, transform=pm.distributions.transforms.ordered, initval=np.array([-1.0, 1.0]))
    sigma = pm.HalfNormal("sigma", 2, shape=2)
    theta = pm.Beta("theta", 5, 5)
    pm.NormalMixture("y", w=pm.math.stack([theta, 1 - theta]), mu=mu, sigma=sigma, observed=data["y"])


def ar_k(data):
    y, order = np.asarray(data["y"], float), int(data["K"])
    alpha = pm.Normal("alpha", 0, 10)
    beta = pm.Normal("beta", 0, 10, shape=order)
    sigma = pm.HalfCauchy("sigma", 2.5)
    lags = np.stack([y[order - k - 1:len(y) - k - 1] for k in range(order)], axis=1)  # column k: y_{t-k-1}
    pm.Normal("y", alpha + pm.math.dot(lags, beta), sigma, observed=y[order:])


def earnings_logearn_height(data):
    beta = pm.Flat("beta", shape=2)
    sigma = pm.HalfFlat("sigma")
    pm.Normal("log_earn", beta[0] + beta[1] * np.asarray(data["height"], float), sigma,
              observed=np.log(np.asarray(data["earn"], float)))


def garch11(data):
    y, sigma1 = np.asarray(data["y"], float), float(data["sigma1"])
    mu = pm.Flat("mu")
    alpha0 = pm.HalfFlat("alpha0")
    alpha1 = pm.Uniform("alpha1", 0, 1)
    unit = pm.Uniform("beta1_unit", 0, 1)  # beta1 = (1 - alpha1) u: flat on 0 < beta1 < 1 - alpha1
    beta1 = pm.Deterministic("beta1", (1 - alpha1) * unit)
    pm.Potential("beta1_flat", pt.log1p(-alpha1))

    def recursion(y_prev, sigma_prev, mu, alpha0, alpha1, beta1):
        return pt.sqrt(alpha0 + alpha1 * (y_prev - mu) ** 2 + beta1 * sigma_prev**2)

    # The parameters go in as non_sequences (PyMC replaces them by their values only in explicit inputs);
    # float64 start: a Python float would start the scan in float32.
    start = pt.as_tensor(np.float64(sigma1))
    sigmas = pytensor.scan(recursion, sequences=[pt.as_tensor(y[:-1])], outputs_info=[start],
                           non_sequences=[mu, alpha0, alpha1, beta1], return_updates=False)
    sigma = pt.concatenate([pt.as_tensor(np.array([sigma1])), sigmas])
    pm.Normal("y", mu, sigma, observed=y)


def gp_pois_regr(data):
    x = np.asarray(data["x"], float)
    rho = pm.Gamma("rho", 25, 4)
    alpha = pm.HalfNormal("alpha", 2)
    f_tilde = pm.Normal("f_tilde", 0, 1, shape=data["N"])
    cov = alpha**2 * pt.exp(-((x[:, None] - x[None, :]) ** 2) / (2 * rho**2)) + 1e-10 * np.eye(data["N"])
    f = pm.Deterministic("f", pt.linalg.cholesky(cov) @ f_tilde)
    pm.Poisson("k", pt.exp(f), observed=np.asarray(data["k"]))


def diamonds(data):
    X = np.asarray(data["X"], float)[:, 1:]
    centred = X - X.mean(axis=0)
    b = pm.Normal("b", 0, 1, shape=centred.shape[1])
    intercept = pm.StudentT("Intercept", nu=3, mu=8, sigma=10)
    sigma = pm.HalfStudentT("sigma", nu=3, sigma=10)
    pm.Normal("Y", intercept + pm.math.dot(centred, b), sigma, observed=np.asarray(data["Y"], float))


BUILDERS = {
    "eight_schools-eight_schools_noncentered": eight_schools_noncentered,
    "kidiq-kidscore_momiq": kidiq_kidscore_momiq,
    "sblrc-blr": sblrc_blr,
    "low_dim_gauss_mix-low_dim_gauss_mix": low_dim_gauss_mix,
    "arK-arK": ar_k,
    "earnings-logearn_height": earnings_logearn_height,
    "garch-garch11": garch11,
    "gp_pois_regr-gp_pois_regr": gp_pois_regr,
    "diamonds-diamonds": diamonds,
}


def posteriordb_model(name) -> pm.Model:
    data = load_reference(name)["data"]
    with pm.Model() as model:
        BUILDERS[name](data)
    return model
