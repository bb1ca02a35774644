"""Check sampler draws against known moments and posteriordb reference posteriors.

Shared by the test suite and the benchmarks. Only NumPy and ArviZ are used, so
any sampler can be checked once its draws are NumPy arrays shaped
``(num_chains, num_draws, *event_shape)``.

The test is the one described in STYLE.md ("Statistical correctness"): for a
statistic ``g`` of the draws,

    z = (mean_t g(x_t) - E[g]) / MCSE,    MCSE = sd(g(x)) / sqrt(ESS_bulk(g(x))),

and a run passes when every ``|z| < max_abs_z`` (4.5 by default: a false-alarm
rate of about 7e-6 per coordinate), every ESS is at least ``min_ess`` and every
rank-normalized split R-hat is below ``max_rhat`` (raised where the ESS is low
enough for chance alone to exceed it: ``rhat_limit``). The ESS and R-hat conditions
keep a stuck or barely moving chain from passing on a huge MCSE. When the exact
value is itself estimated (posteriordb gives means with their MCSE), the two
errors are independent and add in quadrature.

ArviZ 1.x split into ``arviz_base``, ``arviz_stats`` and ``arviz_plots``;
``arviz.ess`` and ``arviz.rhat`` are re-exports of ``arviz_stats.ess`` and
``arviz_stats.rhat``. Both accept a plain ``numpy.ndarray`` with
``chain_axis=0, draw_axis=1`` (the defaults of these top-level functions) and
return an ndarray over the remaining axes. Anything that is not a list, tuple or
``numpy.ndarray`` (a JAX array, say) is silently converted to an xarray Dataset
instead, hence the ``np.asarray`` below.

Reference files live in ``tests/posteriordb/<name>/`` (posteriordb,
BSD-3-Clause, Stan Developers; see the README there). Parameter names follow
Stan: ``theta[1]`` is ``draws["theta"][:, :, 0]``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import numpy as np
from arviz_stats import ess as _arviz_ess
from arviz_stats import rhat as _arviz_rhat
from scipy.stats import chi2 as _chi2

__all__ = [
    "POSTERIORDB_DIR",
    "assert_moments_match",
    "assert_reference_match",
    "available_references",
    "bulk_ess",
    "load_reference",
    "parse_stan_name",
    "rhat_limit",
    "select_stan_name",
    "split_rhat",
    "zscores_against_reference",
]

POSTERIORDB_DIR = Path(__file__).resolve().parent / "posteriordb"

_STAN_NAME = re.compile(r"^(?P<base>[A-Za-z_][A-Za-z0-9_.]*)(?:\[(?P<index>[0-9,\s]+)\])?$")


# --------------------------------------------------------------------------- #
# Reference files
# --------------------------------------------------------------------------- #


def available_references() -> list[str]:
    """Names of the reference posteriors shipped in ``tests/posteriordb/``.

    Returns
    -------
    list of str
        Folder names such as ``"eight_schools-eight_schools_noncentered"``, sorted.
    """
    return sorted(
        path.name
        for path in POSTERIORDB_DIR.iterdir()
        if (path / "reference_mean_value.json").is_file()
    )


def _read_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as stream:
        return json.load(stream)


def load_reference(name: str) -> dict[str, Any]:
    """Load one posteriordb reference posterior and its data.

    Parameters
    ----------
    name : str
        A posterior name, e.g. ``"eight_schools-eight_schools_noncentered"``
        (see :func:`available_references`).

    Returns
    -------
    dict
        ``"name"``: the posterior name.
        ``"data"``: the model's data; JSON lists become ``numpy`` arrays (integer
        lists stay integer arrays, nested lists become matrices), scalars stay
        Python ``int``/``float``.
        ``"dimensions"``: ``{stan_variable: size}`` from ``posterior.json``.
        ``"names"``: the Stan parameter names (``"theta[1]"``, ``"mu"``) in file
        order.
        ``"mean"``, ``"mean_mcse"``: reference posterior means and their Monte
        Carlo standard errors, keyed by Stan name.
        ``"mean_squared"``, ``"mean_squared_mcse"``: the same for E[x^2].
        ``"sd"``: posterior standard deviations derived as
        ``sqrt(mean_squared - mean**2)``. The mean squares are stored with about
        7 significant digits, so this is only a few digits accurate when
        sd << |mean| (sblrc-blr's beta: about 2 digits). Use it for scales and
        benchmarks, not for tests.

    Raises
    ------
    FileNotFoundError
        If no reference of that name is shipped.
    ValueError
        If the mean and mean-square files list different parameters.

    Examples
    --------
    >>> ref = load_reference("eight_schools-eight_schools_noncentered")
    >>> ref["names"][:2], ref["data"]["J"]
    (['theta[1]', 'theta[2]'], 8)
    """
    folder = POSTERIORDB_DIR / name
    if not (folder / "reference_mean_value.json").is_file():
        raise FileNotFoundError(
            f"no reference posterior named {name!r} in {POSTERIORDB_DIR}; "
            f"available: {', '.join(available_references())}"
        )
    means = _read_json(folder / "reference_mean_value.json")
    squares = _read_json(folder / "reference_mean_squared_value.json")
    names = list(means["names"])
    if list(squares["names"]) != names:
        raise ValueError(
            f"{name}: reference_mean_value.json and reference_mean_squared_value.json "
            f"list different parameters: {names} vs {squares['names']}"
        )
    raw_data = _read_json(folder / "data.json")
    data = {key: np.asarray(value) if isinstance(value, list) else value for key, value in raw_data.items()}
    mean = dict(zip(names, map(float, means["mean_value"]), strict=True))
    mean_squared = dict(zip(names, map(float, squares["mean_squared_value"]), strict=True))
    return {
        "name": name,
        "data": data,
        "dimensions": dict(_read_json(folder / "posterior.json")["dimensions"]),
        "names": names,
        "mean": mean,
        "mean_mcse": dict(zip(names, map(float, means["mcse_mean"]), strict=True)),
        "mean_squared": mean_squared,
        "mean_squared_mcse": dict(zip(names, map(float, squares["mcse_mean"]), strict=True)),
        "sd": {key: float(np.sqrt(max(mean_squared[key] - mean[key] ** 2, 0.0))) for key in names},
    }


# --------------------------------------------------------------------------- #
# Stan names
# --------------------------------------------------------------------------- #


def parse_stan_name(stan_name: str) -> tuple[str, tuple[int, ...]]:
    """Split a Stan parameter name into a variable name and a 0-based index.

    Stan numbers elements from 1 and writes matrix elements as ``x[row,col]``;
    this maps them onto NumPy indexing of the event dimensions.

    Parameters
    ----------
    stan_name : str
        ``"mu"``, ``"theta[3]"`` or ``"Sigma[2,1]"``.

    Returns
    -------
    (str, tuple of int)
        The variable name and the 0-based index into its event shape
        (``()`` for a scalar).

    Raises
    ------
    ValueError
        If the name is not of that form or an index is below 1.

    Examples
    --------
    >>> parse_stan_name("theta[3]"), parse_stan_name("Sigma[2,1]"), parse_stan_name("mu")
    (('theta', (2,)), ('Sigma', (1, 0)), ('mu', ()))
    """
    match = _STAN_NAME.match(stan_name.strip())
    if match is None:
        raise ValueError(f"not a Stan parameter name: {stan_name!r} (expected 'x', 'x[i]' or 'x[i,j]')")
    if match["index"] is None:
        return match["base"], ()
    one_based = tuple(int(part) for part in match["index"].split(","))
    if min(one_based) < 1:
        raise ValueError(f"Stan indices start at 1, got {stan_name!r}")
    return match["base"], tuple(i - 1 for i in one_based)


def select_stan_name(draws: dict[str, Any], stan_name: str) -> np.ndarray:
    """The draws of one scalar Stan parameter.

    Parameters
    ----------
    draws : dict of str to array_like
        Draws keyed by variable name (``"theta"``, not ``"theta[1]"``), each of
        shape ``(num_chains, num_draws, *event_shape)``.
    stan_name : str
        A Stan name such as ``"theta[1]"``.

    Returns
    -------
    numpy.ndarray, shape (num_chains, num_draws), float64

    Raises
    ------
    KeyError
        If the variable is missing from ``draws``.
    ValueError
        If the index does not fit the variable's event shape. A scalar may also
        be stored with trailing size-1 axes, e.g. ``(chains, draws, 1)``.
    """
    base, index = parse_stan_name(stan_name)
    if base not in draws:
        raise KeyError(f"{stan_name!r} needs draws[{base!r}]; draws has {sorted(draws)}")
    values = np.asarray(draws[base], dtype=float)
    if values.ndim < 2:
        raise ValueError(f"draws[{base!r}] has shape {values.shape}; expected (chains, draws, ...)")
    event_shape = values.shape[2:]
    if not index and int(np.prod(event_shape)) == 1:
        return values.reshape(values.shape[:2])
    if len(index) != len(event_shape) or any(i >= n for i, n in zip(index, event_shape)):
        raise ValueError(
            f"{stan_name!r} does not fit draws[{base!r}] with event shape {event_shape} "
            f"(Stan indices are 1-based)"
        )
    return values[(slice(None), slice(None), *index)]


# --------------------------------------------------------------------------- #
# Diagnostics
# --------------------------------------------------------------------------- #


def _as_chain_draw_array(draws: Any) -> np.ndarray:
    values = np.asarray(draws, dtype=float)
    if values.ndim < 2:
        raise ValueError(f"draws must be shaped (chains, draws, ...), got shape {values.shape}")
    return values


def bulk_ess(draws: Any) -> np.ndarray:
    """Bulk effective sample size (rank-normalized, split chains) per coordinate.

    Parameters
    ----------
    draws : array_like, shape (num_chains, num_draws, *event_shape)

    Returns
    -------
    numpy.ndarray, shape event_shape, float64
        ``arviz_stats.ess(..., method="bulk")``. Caution: ArviZ returns the full
        draw count for draws that are constant across all chains; pair it with
        :func:`split_rhat` (NaN there).
    """
    values = _as_chain_draw_array(draws)
    return np.asarray(_arviz_ess(values, method="bulk", chain_axis=0, draw_axis=1), dtype=float)


def split_rhat(draws: Any) -> np.ndarray:
    """Rank-normalized split R-hat per coordinate (Vehtari et al. 2021).

    Parameters
    ----------
    draws : array_like, shape (num_chains, num_draws, *event_shape)
        At least 2 chains and 4 draws.

    Returns
    -------
    numpy.ndarray, shape event_shape, float64
        ``arviz_stats.rhat(..., method="rank")``: the larger of the bulk and the
        folded (tail) R-hat. NaN when a coordinate is constant across all chains.
    """
    values = _as_chain_draw_array(draws)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(_arviz_rhat(values, method="rank", chain_axis=0, draw_axis=1), dtype=float)


def _mean_and_mcse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sample mean, MCSE = sd / sqrt(bulk ESS), and the ESS, over axes (0, 1)."""
    mean = values.mean(axis=(0, 1))
    effective = bulk_ess(values)
    with np.errstate(divide="ignore", invalid="ignore"):
        mcse = values.std(axis=(0, 1), ddof=1) / np.sqrt(effective)
    return mean, mcse, effective


def _zscore(estimate: Any, expected: Any, error: Any) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.asarray(estimate) - np.asarray(expected)) / np.asarray(error)


# --------------------------------------------------------------------------- #
# Comparisons
# --------------------------------------------------------------------------- #


PIMA_LOGISTIC_REFERENCE = Path(__file__).resolve().parent / "adapters" / "data" / "pima_logistic_reference.json"


def load_pima_logistic_reference() -> dict[str, Any]:
    """The long NUTS run of the Pima logistic regression (``benchmarks.pima_reference``) in the form
    :func:`zscores_against_reference` takes: names ``x[1]`` (the intercept) to ``x[8]``, moments and MCSEs."""
    raw = _read_json(PIMA_LOGISTIC_REFERENCE)
    reference: dict[str, Any] = {"names": raw["names"]}
    for moment in ("mean", "mean_squared"):
        reference[moment] = dict(zip(raw["names"], raw[moment], strict=True))
        reference[f"{moment}_mcse"] = dict(zip(raw["names"], raw[f"{moment}_mcse"], strict=True))
    return reference


def zscores_against_reference(
    draws: dict[str, Any],
    reference: dict[str, Any] | str,
    *,
    moment: Literal["mean", "mean_squared"] = "mean",
) -> dict[str, float]:
    """z-scores of the sample moments against a posteriordb reference.

    For each reference parameter ``p`` with draws ``x`` (``g(x) = x`` for
    ``moment="mean"``, ``x**2`` for ``"mean_squared"``)::

        z_p = (mean(g(x)) - ref_p) / sqrt(mcse_sample**2 + mcse_ref**2),
        mcse_sample = sd(g(x)) / sqrt(ESS_bulk(g(x))).

    Parameters
    ----------
    draws : dict of str to array_like
        Draws keyed by variable name, shape ``(num_chains, num_draws, *event)``;
        every variable the reference names must be present (on the constrained
        scale, e.g. eight_schools' ``theta``, not ``theta_trans``).
    reference : dict or str
        The result of :func:`load_reference`, or a posterior name.
    moment : {"mean", "mean_squared"}
        Which reference moment to compare with.

    Returns
    -------
    dict of str to float
        z per Stan name, in reference order. NaN or inf means the sample MCSE
        is zero (constant draws).
    """
    if isinstance(reference, str):
        reference = load_reference(reference)
    if moment not in ("mean", "mean_squared"):
        raise ValueError(f"moment must be 'mean' or 'mean_squared', got {moment!r}")
    power = 1 if moment == "mean" else 2
    zscores = {}
    for name in reference["names"]:
        values = select_stan_name(draws, name) ** power
        estimate, mcse, _ = _mean_and_mcse(values)
        error = np.hypot(mcse, reference[f"{moment}_mcse"][name])
        zscores[name] = float(_zscore(estimate, reference[moment][name], error))
    return zscores


def _format_failures(header: str, failures: list[str]) -> str:
    return header + "\n  " + "\n  ".join(failures)


def _convergence_failures(
    labels: list[str],
    effective: dict[str, np.ndarray],
    rhat_values: np.ndarray,
    *,
    min_ess: float,
    max_rhat: float,
    num_chains: int,
) -> list[str]:
    failures = []
    for position, label in enumerate(labels):
        low = {what: float(values[position]) for what, values in effective.items()}
        if not all(value >= min_ess for value in low.values()):
            shown = ", ".join(f"{value:.1f} for {what}" for what, value in low.items())
            failures.append(f"ESS {label}: bulk ESS {shown}; need >= {min_ess}")
    for position, label in enumerate(labels):
        value = float(rhat_values[position])
        # Below min_ess the run fails anyway; the floor keeps a stuck chain's R-hat reported too.
        fewest = max(min_ess, min(float(values[position]) for values in effective.values()))
        limit = rhat_limit(max_rhat, fewest, num_chains)
        if not value < limit:
            note = " (NaN: constant draws)" if np.isnan(value) else ""
            failures.append(f"R-hat {label}: {value:.4f}{note}; need < {limit:.4f} (ESS {fewest:.0f})")
    return failures


def rhat_limit(max_rhat: float, ess: float, num_chains: int, false_alarm: float = 1e-4) -> float:
    """``max_rhat``, raised where the ESS is so low that a correct sampler's R-hat exceeds it by chance.

    Split R-hat compares ``m = 2 * num_chains`` half-chain means. For well-mixing
    chains each half mean has variance ``sigma^2 m / ESS``, so ``R-hat^2 - 1`` is
    about ``(m / ESS) chi2_{m-1} / (m - 1)``. Its ``1 - false_alarm`` quantile
    gives the limit: at ESS 900 with 4 chains, 1 + 17 / 900 = 1.019, where the
    usual 1.01 fails about one run in ten (measured on a 5-d Gaussian). A chain
    stuck elsewhere still fails: its ESS is below ``min_ess`` or its R-hat far
    above this (at ESS 200, the limit is 1.082).
    """
    halves = 2 * num_chains
    quantile = float(_chi2.ppf(1.0 - false_alarm, halves - 1)) / (halves - 1)
    if not ess > 0:
        return max_rhat
    return max(max_rhat, float(np.sqrt(1.0 + halves * quantile / ess)))


def _require_chains(values: np.ndarray) -> None:
    if values.shape[0] < 2 or values.shape[1] < 4:
        raise ValueError(
            f"need at least 2 chains of 4 draws for split R-hat, got draws of shape {values.shape}"
        )


def _check_nonfinite(values: np.ndarray, labels: list[str]) -> None:
    finite = np.isfinite(values).all(axis=(0, 1))
    if not finite.all():
        bad = [label for label, is_finite in zip(labels, finite) if not is_finite]
        raise AssertionError(f"non-finite draws (NaN or inf) in {', '.join(bad)}")


def assert_moments_match(
    draws: Any,
    mean: Any,
    sd: Any,
    *,
    max_abs_z: float = 4.5,
    min_ess: float = 200,
    max_rhat: float = 1.01,
) -> None:
    """Assert that MCMC draws have the given mean and standard deviation.

    For each coordinate ``i`` with true mean ``mu_i`` and sd ``sigma_i``:

    - mean: ``z = (mean(x) - mu) / (sd(x) / sqrt(ESS(x)))``;
    - second central moment: with ``y = (x - mu)**2``, whose expectation is
      ``sigma**2``, ``z = (mean(y) - sigma**2) / (sd(y) / sqrt(ESS(y)))``, where
      ``sd(y)`` and ``ESS(y)`` are computed from ``y`` itself;
    - both bulk ESS values must be at least ``min_ess`` and the rank-normalized
      split R-hat of ``x`` below ``max_rhat`` (so a stuck chain cannot pass
      vacuously; NaN fails).

    Parameters
    ----------
    draws : array_like, shape (num_chains, num_draws, dim) or (num_chains, num_draws)
        At least 2 chains.
    mean, sd : array_like, shape (dim,) or scalar
        The exact mean and standard deviation of the target.
    max_abs_z : float
        Fail when ``|z| >= max_abs_z`` (4.5: false-alarm rate about 7e-6 each).
    min_ess : float
        Minimum bulk ESS per coordinate.
    max_rhat : float
        Upper bound on split R-hat per coordinate.

    Raises
    ------
    AssertionError
        Listing every failing coordinate with its z, estimate, expected value
        and MCSE, or its ESS / R-hat.
    ValueError
        On shapes that do not fit, or fewer than 2 chains.
    """
    values = _as_chain_draw_array(draws)
    if values.ndim == 2:
        values = values[..., None]
    if values.ndim != 3:
        raise ValueError(f"draws must be (chains, draws, dim), got shape {values.shape}")
    _require_chains(values)
    num_chains, num_draws, dim = values.shape
    mean = np.broadcast_to(np.asarray(mean, dtype=float), (dim,))
    sd = np.broadcast_to(np.asarray(sd, dtype=float), (dim,))
    labels = [f"coordinate {i}" for i in range(dim)]
    _check_nonfinite(values, labels)

    sample_mean, mean_mcse, mean_ess = _mean_and_mcse(values)
    squared_deviation = (values - mean) ** 2
    sample_variance, variance_mcse, variance_ess = _mean_and_mcse(squared_deviation)
    z_mean = _zscore(sample_mean, mean, mean_mcse)
    z_variance = _zscore(sample_variance, sd**2, variance_mcse)

    failures = []
    for i, label in enumerate(labels):
        if not abs(z_mean[i]) < max_abs_z:
            failures.append(
                f"mean {label}: z={z_mean[i]:+.2f} (sample {sample_mean[i]:.6g}, "
                f"expected {mean[i]:.6g}, MCSE {mean_mcse[i]:.3g})"
            )
    for i, label in enumerate(labels):
        if not abs(z_variance[i]) < max_abs_z:
            failures.append(
                f"variance {label}: z={z_variance[i]:+.2f} (sample E(x-mean)^2 "
                f"{sample_variance[i]:.6g}, expected sd^2 {sd[i] ** 2:.6g}, MCSE {variance_mcse[i]:.3g})"
            )
    failures += _convergence_failures(
        labels,
        {"x": mean_ess, "(x-mean)^2": variance_ess},
        split_rhat(values),
        min_ess=min_ess,
        max_rhat=max_rhat,
        num_chains=num_chains,
    )
    if failures:
        raise AssertionError(
            _format_failures(
                f"draws ({num_chains} chains x {num_draws} draws) do not match the target "
                f"(max |z| {max_abs_z}, min ESS {min_ess}, max R-hat {max_rhat}):",
                failures,
            )
        )


def assert_reference_match(
    draws: dict[str, Any],
    name: str,
    *,
    max_abs_z: float = 4.5,
    min_ess: float = 200,
    max_rhat: float = 1.01,
) -> None:
    """Assert that MCMC draws agree with a posteriordb reference posterior.

    Checks, for every parameter the reference lists: the z-scores of the mean
    and of the mean square (:func:`zscores_against_reference`, sample and
    reference MCSE combined), bulk ESS of ``x`` and ``x**2`` at least
    ``min_ess``, and rank-normalized split R-hat of ``x`` below ``max_rhat``.

    Parameters
    ----------
    draws : dict of str to array_like
        Draws keyed by Stan variable name, each ``(num_chains, num_draws, *event)``,
        on the constrained scale.
    name : str
        The reference posterior, e.g. ``"kidiq-kidscore_momiq"``.
    max_abs_z, min_ess, max_rhat : float
        As in :func:`assert_moments_match`.

    Raises
    ------
    AssertionError
        Listing every failing parameter (Stan name) with its z, estimate,
        reference value, or its ESS / R-hat.
    KeyError, ValueError
        If a reference parameter is missing from ``draws`` or does not fit.
    """
    reference = load_reference(name)
    labels = reference["names"]
    columns = np.stack([select_stan_name(draws, label) for label in labels], axis=-1)
    _require_chains(columns)
    _check_nonfinite(columns, labels)
    failures = []
    for moment, power in (("mean", 1), ("mean_squared", 2)):
        zscores = zscores_against_reference(draws, reference, moment=moment)
        estimates = (columns**power).mean(axis=(0, 1))
        for position, label in enumerate(labels):
            z = zscores[label]
            if not abs(z) < max_abs_z:
                failures.append(
                    f"{moment} {label}: z={z:+.2f} (sample {estimates[position]:.6g}, "
                    f"reference {reference[moment][label]:.6g} +- {reference[f'{moment}_mcse'][label]:.2g})"
                )
    failures += _convergence_failures(
        labels,
        {"x": bulk_ess(columns), "x^2": bulk_ess(columns**2)},
        split_rhat(columns),
        min_ess=min_ess,
        max_rhat=max_rhat,
        num_chains=columns.shape[0],
    )
    if failures:
        num_chains, num_draws = columns.shape[:2]
        raise AssertionError(
            _format_failures(
                f"draws ({num_chains} chains x {num_draws} draws) do not match reference {name} "
                f"(max |z| {max_abs_z}, min ESS {min_ess}, max R-hat {max_rhat}):",
                failures,
            )
        )


def time_major(info):
    """``run_chains``' info (fields ``(chains, iterations)``, as its samples) with the iterations first, as a
    scan of a step gives it: the layout the engine's own tests index."""
    return type(info)(*(np.swapaxes(np.asarray(x), 0, 1) if np.ndim(x) >= 2 else x for x in info))
