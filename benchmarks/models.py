"""Benchmark targets as JAX log densities over a flat parameter vector.

Every model is a :class:`Model`: ``logdensity_fn(x)`` takes a 1-D array of
length ``dim`` and returns a scalar (up to an additive constant).  Chains start
from :func:`initial_positions`, Stan's convention of ``init + Uniform(-2, 2)``
in every coordinate, drawn once per run and given to every sampler alike.

Models (paper = Wang, Mohamed & de Freitas, ICML 2013):

* ``pima``, ``ripley``, ``breast_cancer``: Bayesian logistic regression, paper
  section 5.1, eq. (1).  Features standardized (mean 0, population sd 1),
  parameters ``x = (beta_0, beta_1..beta_D)``, prior N(0, sigma^2 = 100) on
  every coefficient and the intercept (sd 10).  Data in ``benchmarks/data/``
  (see ATTRIBUTION.md there); nothing is downloaded.
* ``std_gauss_10``: 10-d standard normal.
* ``diag_gauss_10``: 10-d diagonal normal, sds log-spaced from 0.01 to 100.
* ``corr_gauss_2``: 2-d normal, unit variances, correlation 0.99.
* ``stochastic_volatility``: paper section 5.3, T = 1000 simulated (d = 1003).
* ``lgcp_16``, ``lgcp_64``: log-Gaussian Cox process, paper section 5.2, on a
  16 x 16 or 64 x 64 grid, whitened, data simulated once: lgcp_16 by a Cholesky
  factor (d = 256), lgcp_64 by a circulant embedding on a 128 x 128 torus applied
  with FFTs (d = 16384 white-noise coordinates for the 4096 cells; see :func:`lgcp`).
* ``eight_schools`` ... ``gauss_mix``: the nine posteriordb posteriors
  (``benchmarks/posteriordb.py``), scored against their reference means.

The Gaussians carry their exact mean and sd (``Model.mean``, ``Model.sd``), so
the benchmark also reports the largest |z| of the posterior means.
"""

from __future__ import annotations

import csv
from functools import lru_cache
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

DATA_DIR = Path(__file__).resolve().parent / "data"
PRIOR_VARIANCE = 100.0  # paper 5.1: N(0, sigma^2) with sigma^2 = 100

__all__ = [
    "DATA_DIR",
    "MODELS",
    "Model",
    "PRIOR_VARIANCE",
    "get_model",
    "initial_positions",
    "load_breast_cancer",
    "load_pima",
    "load_ripley",
    "standardize",
]


class Model(NamedTuple):
    """A benchmark target.

    name            registry key
    logdensity_fn   flat float array (dim,) -> scalar log density (unnormalized)
    dim             number of parameters
    init            (dim,) float64 centre of the initial positions
    description     one line for the report
    mean, sd        (dim,) exact posterior mean and sd when known, else None
    quick_draws     (num_warmup, num_samples) of the quick mode, None = the run's default
    full_draws      (num_warmup, num_samples) of the full mode, None = the run's default
    reference       posteriordb name whose reference moments score the draws, else None
    derived_fn      draws (chains, draws, dim) -> {name: (chains, draws, ...)}: the quantities the
                    reference (Stan names, constrained) or the truth describe, else None
    truth           known quantities of simulated data (LGCP: the latent field), else None
    """

    name: str
    logdensity_fn: Callable
    dim: int
    init: np.ndarray
    description: str
    mean: np.ndarray | None = None
    sd: np.ndarray | None = None
    quick_draws: tuple[int, int] | None = None
    full_draws: tuple[int, int] | None = None
    reference: str | None = None
    derived_fn: Callable | None = None
    truth: dict | None = None


# --------------------------------------------------------------------------- #
# Data
# --------------------------------------------------------------------------- #


def _read_csv(name: str) -> tuple[list[str], list[list[str]]]:
    with open(DATA_DIR / name, newline="") as handle:
        rows = list(csv.reader(handle))
    return rows[0], rows[1:]


@lru_cache(maxsize=None)
def load_pima() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Pima Indians diabetes, R's MASS ``Pima.tr`` (200 rows) then ``Pima.te`` (332).

    Returns ``(X, y, feature_names)``: X (532, 7) float64 raw features
    (npreg, glu, bp, skin, bmi, ped, age), y (532,) int 1 for ``type == "Yes"``.
    """
    header, rows = _read_csv("pima.csv")
    X = np.array([[float(v) for v in row[:-1]] for row in rows])
    y = np.array([1 if row[-1] == "Yes" else 0 for row in rows])
    return X, y, header[:-1]


@lru_cache(maxsize=None)
def load_ripley() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Ripley's synthetic two-class data, R's MASS ``synth.tr``: X (250, 2), y = ``yc`` (250,)."""
    header, rows = _read_csv("synth_tr.csv")
    X = np.array([[float(v) for v in row[:-1]] for row in rows])
    y = np.array([int(row[-1]) for row in rows])
    return X, y, header[:-1]


@lru_cache(maxsize=None)
def load_breast_cancer() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Breast cancer Wisconsin (diagnostic), as scikit-learn ships it: X (569, 30), y (569,).

    y follows scikit-learn: 0 = malignant, 1 = benign.
    """
    header, rows = _read_csv("breast_cancer.csv")
    X = np.array([[float(v) for v in row[:-1]] for row in rows])
    y = np.array([int(row[-1]) for row in rows])
    return X, y, header[:-1]


def standardize(X: np.ndarray) -> np.ndarray:
    """Centre every column and scale it to population sd 1 (``ddof=0``)."""
    return (X - X.mean(axis=0)) / X.std(axis=0)


# --------------------------------------------------------------------------- #
# Log densities
# --------------------------------------------------------------------------- #


def logistic_regression(name: str, X: np.ndarray, y: np.ndarray, description: str) -> Model:
    """Paper eq. (1) with labels in {0, 1}; ``x = (intercept, coefficients)``.

    log p(x | data) = sum_i [y_i log s(eta_i) + (1 - y_i) log s(-eta_i)] - |x|^2 / (2 sigma^2),
    eta = beta_0 + X beta, s the logistic function, sigma^2 = 100.
    """
    Xs = standardize(np.asarray(X, dtype=np.float64))
    labels = np.asarray(y, dtype=np.float64)
    dim = Xs.shape[1] + 1

    def logdensity_fn(x):
        return logistic_logdensity(Xs, labels, x)

    return Model(name, logdensity_fn, dim, np.zeros(dim), description)


def logistic_logdensity(X, y, x):
    """:func:`logistic_regression`'s log density of ``x`` on standardized rows ``X`` and labels ``y`` (the data
    first, so that ``jax.tree_util.Partial(logistic_logdensity, X, y)`` takes them as arguments)."""
    import jax
    import jax.numpy as jnp

    eta = x[0] + jnp.asarray(X, dtype=x.dtype) @ x[1:]
    loglik = jnp.sum(jnp.asarray(y, x.dtype) * eta - jax.nn.softplus(eta))
    return loglik - 0.5 * jnp.sum(x**2) / PRIOR_VARIANCE


def gaussian(name: str, mean, cov, description: str) -> Model:
    """Multivariate normal N(mean, cov) (diagonal when ``cov`` is 1-D: variances)."""
    import jax.numpy as jnp

    mean = np.asarray(mean, dtype=np.float64)
    cov = np.asarray(cov, dtype=np.float64)
    dim = mean.shape[0]
    if cov.ndim == 1:
        precision_diag = 1.0 / cov

        def logdensity_fn(x):
            r = x - jnp.asarray(mean, x.dtype)
            return -0.5 * jnp.sum(jnp.asarray(precision_diag, x.dtype) * r**2)

        sd = np.sqrt(cov)
    else:
        precision = np.linalg.inv(cov)

        def logdensity_fn(x):
            r = x - jnp.asarray(mean, x.dtype)
            return -0.5 * r @ (jnp.asarray(precision, x.dtype) @ r)

        sd = np.sqrt(np.diag(cov))
    return Model(name, logdensity_fn, dim, np.zeros(dim), description, mean=mean, sd=sd)


def _pima() -> Model:
    X, y, _ = load_pima()
    return logistic_regression("pima", X, y, "logistic regression, Pima (MASS Pima.tr+Pima.te), 532 x 7")


def _ripley() -> Model:
    X, y, _ = load_ripley()
    return logistic_regression("ripley", X, y, "logistic regression, Ripley (MASS synth.tr), 250 x 2")


def _breast_cancer() -> Model:
    X, y, _ = load_breast_cancer()
    return logistic_regression(
        "breast_cancer", X, y, "logistic regression, breast cancer (scikit-learn), 569 x 30"
    )


def _std_gauss_10() -> Model:
    return gaussian("std_gauss_10", np.zeros(10), np.ones(10), "10-d standard normal")


def _diag_gauss_10() -> Model:
    scales = np.logspace(-2, 2, 10)
    return gaussian(
        "diag_gauss_10", np.zeros(10), scales**2, "10-d diagonal normal, sd log-spaced 0.01..100"
    )


def _corr_gauss_2() -> Model:
    cov = np.array([[1.0, 0.99], [0.99, 1.0]])
    return gaussian("corr_gauss_2", np.zeros(2), cov, "2-d normal, unit variances, correlation 0.99")


def simulate_stochastic_volatility(num_steps=1000, beta=0.65, sigma=0.15, phi=0.98, seed=20130616):
    """Data of paper section 5.3: x_1 ~ N(0, sigma^2/(1-phi^2)), x_{t+1} = phi x_t + sigma eta,
    y_t = beta exp(x_t / 2) eps_t.  Returns (y, x) as float64 arrays."""
    rng = np.random.default_rng(seed)
    x = np.empty(num_steps)
    x[0] = rng.normal(0.0, sigma / np.sqrt(1.0 - phi**2))
    for t in range(1, num_steps):
        x[t] = phi * x[t - 1] + sigma * rng.normal()
    y = beta * np.exp(0.5 * x) * rng.normal(size=num_steps)
    return y, x


def stochastic_volatility(num_steps: int = 1000) -> Model:
    """Paper section 5.3 (Kim et al. 1998; Girolami & Calderhead 2011).

    Parameters ``(x_1..x_T, log beta, alpha, gamma)`` with ``phi = tanh(alpha)``
    and ``sigma = exp(gamma)``; priors ``p(beta) ∝ 1/beta`` (flat in log beta),
    ``(phi + 1)/2 ~ Beta(20, 1.5)``, ``sigma^2 ~ scaled-inv-chi^2(10, 0.05)``,
    with the Jacobians of the transformations.
    """
    import jax
    import jax.numpy as jnp

    y, _ = simulate_stochastic_volatility(num_steps)
    nu, s2 = 10.0, 0.05

    def logdensity_fn(params):
        x, log_beta, alpha, gamma = params[:num_steps], params[-3], params[-2], params[-1]
        data = jnp.asarray(y, params.dtype)
        phi, sigma = jnp.tanh(alpha), jnp.exp(gamma)
        # log(1 - phi^2) = 2 log sech(alpha), computed stably: the naive 1 - tanh(alpha)^2
        # rounds to 0 for |alpha| > ~19 (float64), and a chain thrown there by an early
        # trajectory from a far-off start stays stuck on the resulting plateaus.
        abs_alpha = jnp.abs(alpha)
        log_one_minus_phi2 = 2.0 * (jnp.log(2.0) - abs_alpha - jnp.log1p(jnp.exp(-2.0 * abs_alpha)))
        one_minus_phi2 = jnp.exp(log_one_minus_phi2)
        # y_t ~ N(0, beta exp(x_t / 2))
        loglik = -jnp.sum(log_beta + 0.5 * x) - 0.5 * jnp.sum(data**2 * jnp.exp(-2.0 * log_beta - x))
        # AR(1) prior on the log-volatility
        log_x1 = -0.5 * (x[0] ** 2) * one_minus_phi2 / sigma**2 - gamma + 0.5 * log_one_minus_phi2
        innovations = x[1:] - phi * x[:-1]
        log_ar = -0.5 * jnp.sum(innovations**2) / sigma**2 - (num_steps - 1) * gamma
        # priors and Jacobians: sigma^2 ~ scaled-inv-chi2 in gamma; (phi+1)/2 ~ Beta(20, 1.5) in alpha
        log_sigma = -nu * gamma - 0.5 * nu * s2 * jnp.exp(-2.0 * gamma)
        # u = (phi + 1) / 2 = sigmoid(2 alpha): log u = -softplus(-2 alpha), log(1 - u) = -softplus(2 alpha)
        log_u, log_1mu = -jax.nn.softplus(-2.0 * alpha), -jax.nn.softplus(2.0 * alpha)
        log_phi = 19.0 * log_u + 0.5 * log_1mu + log_one_minus_phi2
        return loglik + log_x1 + log_ar + log_sigma + log_phi

    init = np.concatenate([np.zeros(num_steps), [np.log(np.std(y)), np.arctanh(0.9), np.log(0.2)]])
    # No sampler, NUTS included, converges here in 1000 + 1000 (R-hat 1.05-1.3; min ESS 11-228 over
    # the samplers of one run, so their ratios were noise); at 2000 + 8000 NumPyro's NUTS reaches R-hat
    # 1.006-1.009 (BENCHMARKS.md@036b7d1, "Stochastic volatility").  The full mode runs every sampler that long.
    return Model(
        "stochastic_volatility", logdensity_fn, num_steps + 3, init,
        f"stochastic volatility (paper 5.3), T = {num_steps} simulated, beta 0.65, sigma 0.15, phi 0.98",
        full_draws=(2000, 8000),
    )


# Log-Gaussian Cox process, paper section 5.2 (Christensen, Roberts & Skold 2006 parameter values
# as used by Girolami & Calderhead 2011): variance, range (unit-square units) and mean of the field.
LGCP_VARIANCE = 1.91
LGCP_RANGE = 1.0 / 33.0
LGCP_MEAN = float(np.log(126.0) - LGCP_VARIANCE / 2.0)


def lgcp_covariance(grid: int, variance: float = LGCP_VARIANCE, length: float = LGCP_RANGE) -> np.ndarray:
    """Covariance of the latent field on a ``grid`` x ``grid`` lattice (cells in row-major order).

    Cov(x_ij, x_i'j') = variance * exp(-||(i, j) - (i', j')|| / (grid * length)): cell
    indices scaled to the unit square, so the correlation range is ``grid * length`` cells.
    """
    rows, cols = np.divmod(np.arange(grid * grid), grid)
    distance = np.hypot(rows[:, None] - rows[None, :], cols[:, None] - cols[None, :])
    return variance * np.exp(-distance / (grid * length))


def lgcp_torus_eigenvalues(grid: int, variance: float = LGCP_VARIANCE, length: float = LGCP_RANGE) -> np.ndarray:
    """Eigenvalues (n, n) of the field's covariance embedded in an n x n torus, n = 2 * grid.

    The torus covariance is the same kernel at the wrap-around distance
    min(|d|, n - |d|) per axis; within the ``grid`` x ``grid`` window that equals
    the plain distance, so the window block is exactly :func:`lgcp_covariance`.
    The covariance is circulant, so its eigenvalues are the 2-D DFT of its first
    row.  Raises ValueError if the embedding is not positive semi-definite
    (min < -1e-8 max), since then no exact square root exists; tiny negatives
    from rounding are set to 0.
    """
    size = 2 * grid
    offset = np.minimum(np.arange(size), size - np.arange(size))
    kernel = variance * np.exp(-np.hypot(offset[:, None], offset[None, :]) / (grid * length))
    eigenvalues = np.fft.fft2(kernel).real  # the kernel image is even, so the DFT is real
    if eigenvalues.min() < -1e-8 * eigenvalues.max():
        raise ValueError(
            f"the circulant embedding of the LGCP covariance (grid={grid}, length={length}) on a {size} x {size} "
            f"torus is not positive semi-definite (smallest eigenvalue {eigenvalues.min():.3g}); use a shorter "
            "length or the Cholesky parameterization (embedding=False)"
        )
    return np.maximum(eigenvalues, 0.0)


def lgcp_torus_field(white, grid: int, sqrt_eigenvalues, xp=np):
    """Window of C^{1/2} z on the torus: (..., n*n) white noise -> (..., grid*grid) zero-mean field.

    ``sqrt_eigenvalues`` is ``sqrt(lgcp_torus_eigenvalues(...))`` (n, n); ``xp`` is
    ``numpy`` or ``jax.numpy``.  C^{1/2} z = ifft2(sqrt(lambda) fft2(z)) is real for
    real z (lambda is real and even), so the half spectrum of rfft2 suffices.
    """
    size = sqrt_eigenvalues.shape[0]
    torus = white.reshape(*white.shape[:-1], size, size)
    half = sqrt_eigenvalues[:, : size // 2 + 1]
    field = xp.fft.irfft2(half * xp.fft.rfft2(torus), s=(size, size))
    return field[..., :grid, :grid].reshape(*white.shape[:-1], grid * grid)


def simulate_lgcp(grid: int, seed: int = 20130617, embedding: bool = False) -> dict[str, np.ndarray]:
    """Draw the latent field and the counts from the generative model.

    x ~ N(mu 1, Sigma) (Sigma from :func:`lgcp_covariance`, mu = log 126 - sigma^2 / 2),
    y_ij ~ Poisson(m exp(x_ij)) with m = 1 / grid^2 the cell area.  Returns the
    counts ``y``, the field ``x`` (both flat, row-major) and the cell area
    ``area``; with ``embedding=False`` the field is x = mu + L w (``chol`` = L,
    L L^T = Sigma, w white of length grid^2), with ``embedding=True`` it is the
    window of the circulant embedding (:func:`lgcp_torus_field`, ``sqrt_eigenvalues``
    returned, w white of length (2 grid)^2) -- the same distribution, other draws.
    """
    rng = np.random.default_rng([seed, grid])
    area = 1.0 / grid**2
    if embedding:
        root = np.sqrt(lgcp_torus_eigenvalues(grid))
        x = LGCP_MEAN + lgcp_torus_field(rng.standard_normal(root.size), grid, root)
        y = rng.poisson(area * np.exp(x)).astype(np.float64)
        return {"y": y, "x": x, "sqrt_eigenvalues": root, "area": area}
    chol = np.linalg.cholesky(lgcp_covariance(grid) + 1e-10 * np.eye(grid * grid))
    x = LGCP_MEAN + chol @ rng.standard_normal(grid * grid)
    y = rng.poisson(area * np.exp(x)).astype(np.float64)
    return {"y": y, "x": x, "chol": chol, "area": area}


def _in_chunks(fn, draws: np.ndarray, out_dim: int, chunk: int = 256) -> np.ndarray:
    """Apply ``fn`` (rows, dim) -> (rows, out_dim) to (..., dim) draws a chunk of rows at a time (bounded memory)."""
    flat = np.asarray(draws, dtype=np.float64).reshape(-1, draws.shape[-1])
    out = np.empty((flat.shape[0], out_dim))
    for start in range(0, flat.shape[0], chunk):
        out[start : start + chunk] = fn(flat[start : start + chunk])
    return out.reshape(*draws.shape[:-1], out_dim)


def lgcp(grid: int, embedding: bool = True, full_draws: tuple[int, int] | None = None) -> Model:
    """Log-Gaussian Cox process on a ``grid`` x ``grid`` lattice (paper 5.2), whitened.

    The sampler sees white noise z (prior N(0, I)) and the field is a linear map of it:

    * ``embedding=True`` (``lgcp_64``): z has (2 grid)^2 coordinates on a 2 grid x 2 grid
      torus and x = mu + window(C^{1/2} z), C the circulant embedding of Sigma
      (:func:`lgcp_torus_eigenvalues`), C^{1/2} applied by FFT: O(n^2 log n) per
      gradient instead of the dense grid^2 x grid^2 product.  The field has exactly
      the prior N(mu, Sigma); the extra torus coordinates are nuisance white noise.
    * ``embedding=False`` (``lgcp_16``): z has grid^2 coordinates and x = mu + L z,
      L L^T = Sigma (Cholesky).  lgcp_16 keeps it: its data and the committed
      results stay as they are, its dense 256 x 256 product is cheap, and its
      dimension stays 256 instead of 1024.

    log p(z | y) = sum_ij [y_ij x_ij - m exp(x_ij)] - |z|^2 / 2 + const.
    Hyperparameters (sigma^2, beta, mu) are fixed at their true values, as in
    Christensen et al. (2005) and Girolami & Calderhead (2011); the paper samples
    them too, in the original (non-whitened) coordinates.  ``derived_fn`` gives
    the field x, ``truth`` the simulated field and counts (Figure 4).
    """
    import jax.numpy as jnp

    data = simulate_lgcp(grid, embedding=embedding)
    y, area = data["y"], data["area"]
    if embedding:
        root = data["sqrt_eigenvalues"]
        dim = root.size

        def field(z):
            return LGCP_MEAN + lgcp_torus_field(z, grid, jnp.asarray(root, z.dtype), jnp)

        def field_np(z):
            return LGCP_MEAN + lgcp_torus_field(z, grid, root)

        how = f"circulant-embedded white noise on a {2 * grid} x {2 * grid} torus (d = {dim})"
    else:
        chol = data["chol"]
        dim = grid * grid

        def field(z):
            return LGCP_MEAN + jnp.asarray(chol, z.dtype) @ z

        def field_np(z):
            return LGCP_MEAN + z @ chol.T

        how = f"Cholesky-whitened field (d = {dim})"

    def logdensity_fn(z):
        x = field(z)
        return jnp.sum(jnp.asarray(y, z.dtype) * x - area * jnp.exp(x)) - 0.5 * jnp.sum(z**2)

    def derived_fn(draws):
        return {"x": _in_chunks(field_np, draws, grid * grid)}

    return Model(
        f"lgcp_{grid}", logdensity_fn, dim, np.zeros(dim),
        f"log-Gaussian Cox process (paper 5.2), {grid} x {grid} grid, {how}, {int(y.sum())} simulated points",
        derived_fn=derived_fn, truth={"x": data["x"], "y": y, "grid": grid}, full_draws=full_draws,
    )


def _posteriordb(name: str) -> Callable[[], Model]:
    def builder() -> Model:
        from .posteriordb import build_posterior

        logdensity_fn, dim, derived_fn, posterior = build_posterior(name)
        return Model(name, logdensity_fn, dim, np.zeros(dim), f"posteriordb {posterior}",
                     reference=posterior, derived_fn=derived_fn)

    return builder


POSTERIORDB_MODELS = ("eight_schools", "kidiq", "earnings", "sblrc", "arK", "garch", "gp_pois_regr", "diamonds",
                      "gauss_mix")
# The models with a PyMC version in benchmarks/pymc_models.py (the PyMC samplers skip the others).
PYMC_MODEL_NAMES = ("pima", "ripley", "breast_cancer", "std_gauss_10", "diag_gauss_10", "corr_gauss_2",
                    "stochastic_volatility")


# name -> builder (models are built lazily: JAX is imported only when needed)
MODELS: dict[str, Callable[[], Model]] = {
    "pima": _pima,
    "ripley": _ripley,
    "breast_cancer": _breast_cancer,
    "std_gauss_10": _std_gauss_10,
    "diag_gauss_10": _diag_gauss_10,
    "corr_gauss_2": _corr_gauss_2,
    "stochastic_volatility": stochastic_volatility,
    "lgcp_16": lambda: lgcp(16, embedding=False),
    # At 1000 + 1000 no sampler's R-hat was below 1.01 on the 64 x 64 grid in every run (BlackJAX's NUTS
    # 1.013, NumPyro's 1.010-1.012, AHMC 1.014-1.027): its 16384 coordinates make the largest of their
    # R-hats, driven by the ESS of the squares (~100-700 at 1000 draws), an extreme value.  With 4000
    # draws both AHMC adapters reached 1.004-1.006 (BENCHMARKS.md@036b7d1, "The 64 x 64 LGCP at 4000 draws").
    "lgcp_64": lambda: lgcp(64, embedding=True, full_draws=(1000, 4000)),
    **{name: _posteriordb(name) for name in POSTERIORDB_MODELS},
}


def get_model(name: str) -> Model:
    """Build the model registered as ``name``; a ValueError lists the known names."""
    try:
        builder = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
    return builder()


def initial_positions(model: Model, num_chains: int, seed: int) -> np.ndarray:
    """(num_chains, dim) float64 starting points: ``model.init + Uniform(-2, 2)`` (Stan's default).

    Drawn with NumPy from ``seed`` so every sampler starts from the same points.
    """
    rng = np.random.default_rng([seed, model.dim, num_chains])
    return model.init + rng.uniform(-2.0, 2.0, size=(num_chains, model.dim))
