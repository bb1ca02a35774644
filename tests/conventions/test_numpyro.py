"""ahmc's NumPyro kernel used the way NumPyro users use ``NUTS``: every ``HMCState``-like field keeps
NumPyro's meaning, so ``arviz.from_numpyro`` and its E-BFMI, energy plot and diagnose work."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import arviz as az
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS
from numpyro.infer.util import potential_energy

from ahmc.adapters.numpyro import AdaptiveHMC
from tests.reference import _mean_and_mcse, bulk_ess

DIM = 5
SCALES = jnp.linspace(0.5, 3.0, DIM)


def gaussian():
    numpyro.sample("x", dist.Normal(0.0, SCALES))


def funnel():
    log_scale = numpyro.sample("v", dist.Normal(0.0, 3.0))
    numpyro.sample("x", dist.Normal(0.0, jnp.exp(log_scale / 2)).expand([9]))


def run(kernel, model, chain_method="vectorized", seed=0, warmup=400, samples=800, chains=4):
    mcmc = MCMC(kernel(model), num_warmup=warmup, num_samples=samples, num_chains=chains,
                chain_method=chain_method, progress_bar=False)
    mcmc.run(jax.random.key(seed), extra_fields=("energy", "potential_energy"))
    return mcmc


@pytest.fixture(scope="module")
def gaussian_run():
    """One vectorized run shared by the energy and E-BFMI checks (same settings, one compile)."""
    return run(AdaptiveHMC, gaussian, "vectorized")


def ebfmi(mcmc):
    return np.asarray(az.bfmi(az.from_numpyro(mcmc))["energy"]).reshape(-1)


# The sequential form shares every line of the kernel but the chain axis's removal: slow (-m slow).
@pytest.mark.parametrize("chain_method", ["vectorized", pytest.param("sequential", marks=pytest.mark.slow)])
def test_energy_is_the_current_states_hamiltonian(chain_method, request):
    """Kinetic energy = energy - potential_energy of the state after each transition: at stationarity
    the momentum is N(0, M), so its kinetic energy is >= 0 with mean d / 2 (sd sqrt(d / 2))."""
    mcmc = request.getfixturevalue("gaussian_run") if chain_method == "vectorized" else run(
        AdaptiveHMC, gaussian, chain_method)
    fields = mcmc.get_extra_fields(group_by_chain=True)
    kinetic = np.asarray(fields["energy"] - fields["potential_energy"])
    assert np.all(np.isfinite(kinetic)) and np.all(kinetic >= 0)
    mcse = np.sqrt(DIM / 2 / bulk_ess(kinetic[..., None])[0])
    assert abs(kinetic.mean() - DIM / 2) < 4.5 * mcse
    # potential_energy is the model's potential at the returned z (the sample, here on the real line)
    x = np.asarray(mcmc.get_samples(group_by_chain=True)["x"])
    for chain, draw in [(0, 0), (1, 17), (3, -1)]:
        expected = potential_energy(gaussian, (), {}, {"x": jnp.asarray(x[chain, draw])})
        np.testing.assert_allclose(fields["potential_energy"][chain, draw], expected, rtol=1e-5)


def test_ebfmi_matches_nuts_on_a_gaussian(gaussian_run):
    ours, nuts = ebfmi(gaussian_run), ebfmi(run(NUTS, gaussian))
    assert ours.shape == (4,) and np.all(np.isfinite(ours))
    # E-BFMI of 1000 draws has a standard error of about 0.05 here; both samplers refresh the momentum fully
    assert abs(ours.mean() - nuts.mean()) < 0.25, (ours, nuts)
    assert np.all((ours > 0.5) & (ours < 1.5)), ours


def test_ebfmi_is_finite_on_a_funnel():
    values = ebfmi(run(AdaptiveHMC, funnel, warmup=500, samples=500))
    # E-BFMI is E[(E_t - E_t-1)^2] / Var(E): 2 for independent energies, at most 4 (alternating ones)
    assert np.all(np.isfinite(values)) and np.all((values > 0) & (values < 4.0)), values


def test_no_latent_sites_is_said_in_the_users_terms():
    def observed_only():
        numpyro.sample("y", dist.Normal(0.0, 1.0), obs=0.5)

    with pytest.raises(ValueError, match="no latent sample sites"):
        run(AdaptiveHMC, observed_only, warmup=10, samples=10)


def wide_and_narrow():
    numpyro.sample("x", dist.Normal(0.0, jnp.array([1e-6, 1e6])))


def run_wide_and_narrow(**options):
    with jax.enable_x64(True):
        mcmc = MCMC(AdaptiveHMC(wide_and_narrow, **options), num_warmup=300, num_samples=1000, num_chains=2,
                    chain_method="vectorized", progress_bar=False)
        mcmc.run(jax.random.key(1))
    return mcmc


@pytest.mark.parametrize("recipe", [None, pytest.param("fisher_diag", marks=pytest.mark.slow)])
def test_the_warm_up_finds_scales_1e_minus_6_and_1e6(recipe):
    """sds 1e-6 and 1e6 in one model with a short warm-up (300): the draws' variances match within Monte
    Carlo error. Before the window rescue the low-rank default ended near sd 1e5 (BlackJAX's Fisher
    estimate floors var(grad) at 1e-10) and Welford's diagonal near 1 (the identity's short moves)."""
    mcmc = run_wide_and_narrow(**({} if recipe is None else {"metric_recipe": recipe}))
    x = np.asarray(mcmc.get_samples(group_by_chain=True)["x"])
    # Squares of mean-zero draws: their mean is the variance, checked with its own ESS-based error.
    mean, mcse, ess = _mean_and_mcse(x ** 2 / np.array([1e-12, 1e12]))
    z = (mean - 1.0) / mcse
    assert np.all(ess > 50) and np.all(np.abs(z) < 4.5), (mean, z, ess)


def test_a_scale_welford_cannot_reach_is_reported():
    """Stan's Welford diagonal shrinks each variance towards 1e-3 (absolute units), so the 1e-6 coordinate
    keeps a variance near 1e-4 and the wide one barely mixes: the tuning summary must say so."""
    from ahmc.adapters.diagnostics import history_from_numpyro
    from ahmc.core.diagnostics import tuning_summary

    summary = tuning_summary(history_from_numpyro(run_wide_and_narrow(metric_recipe="welford_diag")))
    assert "the chains barely explore it" in summary, summary