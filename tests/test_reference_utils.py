"""Tests of the reference-posterior checks in tests/reference.py.

The checks must pass exact iid draws and fail draws with a wrong mean, a wrong
scale, a stuck or slowly mixing chain, or non-finite values; Stan's 1-based
names must land on the right array elements.
"""

import numpy as np
import pytest

from tests.reference import (
    assert_moments_match,
    assert_reference_match,
    available_references,
    bulk_ess,
    load_reference,
    parse_stan_name,
    rhat_limit,
    select_stan_name,
    split_rhat,
    zscores_against_reference,
)

EIGHT_SCHOOLS = "eight_schools-eight_schools_noncentered"
SHIPPED = [
    "arK-arK",
    "diamonds-diamonds",
    "earnings-logearn_height",
    EIGHT_SCHOOLS,
    "garch-garch11",
    "gp_pois_regr-gp_pois_regr",
    "kidiq-kidscore_momiq",
    "low_dim_gauss_mix-low_dim_gauss_mix",
    "sblrc-blr",
]
MEAN = np.array([0.0, 1.0, -3.0, 10.0, 0.5])
SD = np.array([1.0, 0.1, 5.0, 100.0, 2.0])  # ill-conditioned on purpose


def iid_draws(seed, num_chains=4, num_draws=1000):
    rng = np.random.default_rng(seed)
    return MEAN + SD * rng.normal(size=(num_chains, num_draws, MEAN.size))


def ar1_draws(seed, phi, shape):
    """Stationary AR(1) chains with N(0, 1) marginals: correct but slowly mixing."""
    rng = np.random.default_rng(seed)
    noise = rng.normal(size=shape)
    draws = np.empty(shape)
    draws[:, 0] = noise[:, 0]
    for t in range(1, shape[1]):
        draws[:, t] = phi * draws[:, t - 1] + np.sqrt(1 - phi**2) * noise[:, t]
    return draws


def gaussian_like_reference(reference, seed, num_chains=4, num_draws=1000):
    """iid normal draws with the reference means and sds, keyed by variable name."""
    rng = np.random.default_rng(seed)
    shapes = {}
    for name in reference["names"]:
        base, index = parse_stan_name(name)
        shapes[base] = tuple(max(old, i + 1) for old, i in zip(shapes.get(base, index), index))
    draws = {base: np.zeros((num_chains, num_draws, *shape)) for base, shape in shapes.items()}
    for name in reference["names"]:
        base, index = parse_stan_name(name)
        noise = rng.normal(size=(num_chains, num_draws))
        draws[base][(slice(None), slice(None), *index)] = reference["mean"][name] + reference["sd"][name] * noise
    return draws


# --------------------------------------------------------------------------- #
# assert_moments_match
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_iid_normal_draws_pass(seed):
    assert_moments_match(iid_draws(seed), MEAN, SD)


def test_two_dimensional_draws_are_one_coordinate():
    assert_moments_match(iid_draws(3)[..., 2], MEAN[2], SD[2])


def test_shifted_mean_fails_and_names_the_coordinate():
    draws = iid_draws(4)
    draws[..., 2] += 0.25 * SD[2]
    with pytest.raises(AssertionError, match="mean coordinate 2") as failure:
        assert_moments_match(draws, MEAN, SD)
    assert "coordinate 0" not in str(failure.value)


def test_wrong_scale_fails_on_the_second_moment():
    draws = MEAN + 1.15 * (iid_draws(5) - MEAN)
    with pytest.raises(AssertionError, match="variance coordinate"):
        assert_moments_match(draws, MEAN, SD)


def test_stuck_chain_fails_on_rhat():
    draws = iid_draws(6)
    draws[1] = draws[1, 0]  # chain 1 never moves from its first draw
    with pytest.raises(AssertionError, match="R-hat coordinate"):
        assert_moments_match(draws, MEAN, SD)


def test_rhat_limit_is_calibrated_on_correlated_chains():
    """A correct but autocorrelated sampler (AR(1), rho 0.9, ESS ~ 200) exceeds the limit as rarely as promised.

    At the 5% level, 400 runs should exceed it about 20 times (sd 4.4); 1.01 would fail almost every run.
    """
    rng = np.random.default_rng(20)
    rho, chains, draws, runs = 0.9, 4, 1000, 400
    noise = rng.normal(size=(runs, chains, draws)) * np.sqrt(1 - rho**2)
    x = np.empty_like(noise)
    x[..., 0] = rng.normal(size=(runs, chains))
    for t in range(1, draws):
        x[..., t] = rho * x[..., t - 1] + noise[..., t]
    values = np.moveaxis(x, 0, -1)  # (chains, draws, runs): one "coordinate" per run
    rhat, ess = split_rhat(values), np.minimum(bulk_ess(values), bulk_ess(values**2))
    limits = np.array([rhat_limit(1.01, e, chains, false_alarm=0.05) for e in ess])
    assert np.mean(rhat >= 1.01) > 0.5  # the plain threshold is not calibrated at this ESS
    assert 5 <= np.sum(rhat >= limits) <= 40


def test_constant_draws_fail_although_arviz_reports_full_ess():
    draws = np.broadcast_to(MEAN, (4, 1000, MEAN.size))
    assert np.all(bulk_ess(draws) == 4000)  # ArviZ's convention for constant input
    assert np.all(np.isnan(split_rhat(draws)))
    with pytest.raises(AssertionError, match="NaN: constant draws"):
        assert_moments_match(draws, MEAN, SD)


def test_slowly_mixing_chains_fail_on_ess():
    draws = ar1_draws(7, phi=0.99, shape=(4, 1000, 3))
    with pytest.raises(AssertionError, match="ESS coordinate"):
        assert_moments_match(draws, 0.0, 1.0)
    # With enough ESS the same kind of chain passes.
    assert_moments_match(ar1_draws(8, phi=0.5, shape=(4, 1000, 3)), 0.0, 1.0)


def test_non_finite_draws_fail():
    draws = iid_draws(9)
    draws[0, 10, 3] = np.nan
    with pytest.raises(AssertionError, match="non-finite draws .* coordinate 3"):
        assert_moments_match(draws, MEAN, SD)


def test_single_chain_is_rejected():
    with pytest.raises(ValueError, match="at least 2 chains"):
        assert_moments_match(iid_draws(10, num_chains=1), MEAN, SD)


# --------------------------------------------------------------------------- #
# Stan names
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("stan_name", "expected"),
    [("mu", ("mu", ())), ("theta[1]", ("theta", (0,))), ("b[24]", ("b", (23,))), ("Sigma[2,3]", ("Sigma", (1, 2)))],
)
def test_parse_stan_name(stan_name, expected):
    assert parse_stan_name(stan_name) == expected


@pytest.mark.parametrize("bad", ["theta[0]", "theta[]", "theta[1", "1theta", "theta[-1]"])
def test_parse_stan_name_rejects_malformed_names(bad):
    with pytest.raises(ValueError):
        parse_stan_name(bad)


def test_select_stan_name_indexes_event_dimensions():
    values = np.arange(2 * 3 * 4 * 5, dtype=float).reshape(2, 3, 4, 5)
    draws = {"Sigma": values, "mu": values[..., 0, 0], "tau": values[..., :1, 0]}
    np.testing.assert_array_equal(select_stan_name(draws, "Sigma[2,3]"), values[:, :, 1, 2])
    np.testing.assert_array_equal(select_stan_name(draws, "mu"), values[:, :, 0, 0])
    np.testing.assert_array_equal(select_stan_name(draws, "tau"), values[:, :, 0, 0])  # (c, d, 1) is a scalar
    with pytest.raises(ValueError, match="1-based"):
        select_stan_name(draws, "Sigma[5,1]")
    with pytest.raises(KeyError, match="theta"):
        select_stan_name(draws, "theta[1]")


def test_stan_names_map_onto_vector_elements():
    reference = load_reference(EIGHT_SCHOOLS)
    rng = np.random.default_rng(11)
    theta = np.array([reference["mean"][f"theta[{j}]"] for j in range(1, 9)])
    draws = {
        "theta": theta + 0.01 * rng.normal(size=(4, 1000, 8)),
        "mu": reference["mean"]["mu"] + 0.01 * rng.normal(size=(4, 1000)),
        "tau": reference["mean"]["tau"] + 0.01 * rng.normal(size=(4, 1000)),
    }
    zscores = zscores_against_reference(draws, reference)
    assert list(zscores) == reference["names"]
    assert max(abs(z) for z in zscores.values()) < 1.0

    # Moving the third element must flag theta[3], and only theta[3].
    draws["theta"][..., 2] += 1.0
    flagged = [name for name, z in zscores_against_reference(draws, reference).items() if abs(z) > 4.5]
    assert flagged == ["theta[3]"]

    # Reversed elements are caught (theta[1] and theta[8] differ by 1.3, about 20 MCSE).
    draws["theta"] = theta[::-1] + 0.01 * rng.normal(size=(4, 1000, 8))
    assert abs(zscores_against_reference(draws, EIGHT_SCHOOLS)["theta[1]"]) > 4.5


# --------------------------------------------------------------------------- #
# Reference files and assert_reference_match
# --------------------------------------------------------------------------- #


def test_shipped_references_are_consistent():
    assert available_references() == SHIPPED
    for name in SHIPPED:
        reference = load_reference(name)
        bases = {parse_stan_name(stan_name)[0] for stan_name in reference["names"]}
        assert bases == set(reference["dimensions"]), name
        assert len(reference["names"]) == sum(reference["dimensions"].values()), name
        for stan_name in reference["names"]:
            assert reference["mean_mcse"][stan_name] > 0 and reference["mean_squared_mcse"][stan_name] > 0
            assert reference["sd"][stan_name] > 0, (name, stan_name)
            # About 10,000 effective draws per parameter (reference_draws_info.json).
            assert 80 < reference["sd"][stan_name] / reference["mean_mcse"][stan_name] < 120, (name, stan_name)


def test_load_reference_converts_data_and_reports_unknown_names():
    data = load_reference("sblrc-blr")["data"]
    assert data["X"].shape == (data["N"], data["D"]) and data["y"].shape == (data["N"],)
    with pytest.raises(FileNotFoundError, match="available"):
        load_reference("no-such-posterior")


def test_reference_match_passes_draws_with_the_reference_moments():
    reference = load_reference(EIGHT_SCHOOLS)
    assert_reference_match(gaussian_like_reference(reference, seed=12), EIGHT_SCHOOLS)


def test_reference_match_fails_on_a_shifted_parameter():
    reference = load_reference(EIGHT_SCHOOLS)
    draws = gaussian_like_reference(reference, seed=13)
    draws["mu"] += 0.5 * reference["sd"]["mu"]
    with pytest.raises(AssertionError, match=r"mean mu: z=\+") as failure:
        assert_reference_match(draws, EIGHT_SCHOOLS)
    assert "theta[1]" not in str(failure.value)


def test_reference_match_fails_on_a_stuck_chain():
    reference = load_reference("kidiq-kidscore_momiq")
    draws = gaussian_like_reference(reference, seed=14)
    draws["sigma"][2] = draws["sigma"][2, 0]
    with pytest.raises(AssertionError, match=r"R-hat sigma"):
        assert_reference_match(draws, "kidiq-kidscore_momiq")
