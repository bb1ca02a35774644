"""The NumPyro kernel: drop-in use, correctness against posteriordb, plumbing."""

import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

numpyro = pytest.importorskip("numpyro")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

from ahmc.adapters.numpyro import AdaptiveHMC  # noqa: E402

from ..reference import assert_moments_match, assert_reference_match, load_reference  # noqa: E402
from .numpyro_models import MODELS, as_numpy  # noqa: E402


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def normal_model(y=None, scale=1.0):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    numpyro.deterministic("mu_times_two", 2 * mu)
    numpyro.sample("y", dist.Normal(mu, sigma * scale), obs=y)


DATA = np.random.default_rng(0).normal(1.0, 2.0, size=40)


def run(kernel, *args, num_chains=4, chain_method="vectorized", seed=0, warmup=300, samples=300, **kwargs):
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=samples, num_chains=num_chains,
                chain_method=chain_method, progress_bar=False)
    mcmc.run(jax.random.key(seed), *args, **kwargs)
    return mcmc


# eight schools, garch and the GP: slow (the default run stays under 15 min); tests/conventions checks every
# posteriordb model in PyMC's two routes, the compiled one on this kernel
SLOW_REFERENCES = ("eight_schools", "garch", "gp_pois_regr", "sblrc")  # kidiq runs by default


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.slow) if name.startswith(SLOW_REFERENCES) else name for name in sorted(MODELS)])
def test_posteriordb_reference_means(name, x64):
    reference = load_reference(name)
    mcmc = run(AdaptiveHMC(MODELS[name](reference["data"])), seed=1, warmup=1000,
               samples=1000)
    draws = as_numpy(mcmc.get_samples(group_by_chain=True))
    assert_reference_match(draws, name)
    # exploration arms may diverge now and then; the draws above are still right
    assert float(np.mean(mcmc.get_extra_fields()["diverging"])) < 0.02


# sequential: slow (21 s; the suite neared 15 min); vectorized and parallel stay in the default run
@pytest.mark.parametrize("chain_method", [pytest.param("sequential", marks=pytest.mark.slow), "vectorized"])
def test_chain_methods_agree_with_the_truth(chain_method, x64):
    """A 5-d Gaussian with very different scales, via potential_fn, for each chain method."""
    scales = jnp.array([0.01, 0.3, 1.0, 5.0, 100.0])

    def potential(z):
        return 0.5 * jnp.sum((z / scales) ** 2)

    init = jnp.tile(scales * 0.5, (4, 1))
    mcmc = run(AdaptiveHMC(potential_fn=potential), chain_method=chain_method, seed=3,
               warmup=1000, samples=1000, init_params=init)
    draws = np.asarray(mcmc.get_samples(group_by_chain=True))
    assert_moments_match(draws, np.zeros(5), np.asarray(scales))


@pytest.mark.slow  # 2026-12-05: the default suite took 18-22 min on this host; a default test covers most of it
def test_parallel_chain_method_agrees_with_the_truth():
    """chain_method="parallel" (pmap over 4 simulated host devices), same target and check as above."""
    code = textwrap.dedent(
        """
        import numpyro; numpyro.set_host_device_count(4)
        import jax, jax.numpy as jnp, numpy as np
        jax.config.update("jax_enable_x64", True)
        from numpyro.infer import MCMC
        from ahmc.adapters.numpyro import AdaptiveHMC
        from tests.reference import assert_moments_match
        assert jax.local_device_count() == 4
        scales = jnp.array([0.01, 0.3, 1.0, 5.0, 100.0])
        mcmc = MCMC(AdaptiveHMC(potential_fn=lambda z: 0.5 * jnp.sum((z / scales) ** 2)), num_warmup=1000,
                    num_samples=1000, num_chains=4, chain_method="parallel", progress_bar=False)
        mcmc.run(jax.random.key(3), init_params=jnp.tile(scales * 0.5, (4, 1)))
        draws = np.asarray(mcmc.get_samples(group_by_chain=True))
        assert draws.shape == (4, 1000, 5), draws.shape
        assert_moments_match(draws, np.zeros(5), np.asarray(scales))
        print("ok")
        """
    )
    root = pathlib.Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok" in result.stdout


def test_upper_half_jitter_agrees_with_the_truth(x64):
    """min_steps_fraction=0.5 reaches the engine: num_steps on {ceil(L/2)..L}, the target unchanged."""
    scales = jnp.array([0.01, 0.3, 1.0, 5.0, 100.0])

    def potential(z):
        return 0.5 * jnp.sum((z / scales) ** 2)

    # L of 3 to 6 (with L <= 2 the two jitters coincide and the range check below would be vacuous)
    mcmc = run(AdaptiveHMC(potential_fn=potential, min_steps_fraction=0.5, num_steps_bounds=(3, 6)), seed=8,
               warmup=1000, samples=1000, init_params=jnp.tile(scales * 0.5, (4, 1)))
    assert_moments_match(np.asarray(mcmc.get_samples(group_by_chain=True)), np.zeros(5), np.asarray(scales))
    extra = mcmc.get_extra_fields()
    first_try = ~np.asarray(extra["retried"])  # a retry takes (divergence_retry + 2) x the first try's steps
    taken, arm = np.asarray(extra["num_steps"])[first_try], np.asarray(extra["max_steps"])[first_try]
    lowest = np.ceil(arm / 2)
    assert np.any(lowest >= 2)  # not vacuous: U{1..L} would fall below the lower end here
    assert np.all((taken >= lowest) & (taken <= arm)) and np.any(taken == lowest)


def assert_continuation_carries_the_tuner_over(mcmc, num_chains, num_samples):
    """``post_warmup_state = last_state`` and run again: the tuner goes on where it stopped."""
    rounds_first = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["tuning_round"])
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(mcmc.post_warmup_state.rng_key, DATA)
    rounds_second = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["tuning_round"])
    assert rounds_second.shape == (num_chains, num_samples)
    # the round counter keeps going: the tuner state was not reset
    assert rounds_second.min() >= rounds_first.max()
    assert np.asarray(mcmc.get_samples(group_by_chain=True)["mu"]).shape == (num_chains, num_samples)


def test_same_key_same_draws_different_key_different_draws_and_continuation():
    # One MCMC object run three times (its compiled sampler is cached, which keeps the test short);
    # a kernel that kept state from one run to the next would fail the first comparison.  Then a
    # continuation from the last state (vectorized; the sequential one is the slow test below).
    mcmc = run(AdaptiveHMC(normal_model), DATA, seed=5, warmup=100, samples=50)
    a = mcmc.get_samples()["mu"]
    mcmc.run(jax.random.key(5), DATA)
    b = mcmc.get_samples()["mu"]
    mcmc.run(jax.random.key(6), DATA)
    c = mcmc.get_samples()["mu"]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(c))
    assert_continuation_carries_the_tuner_over(mcmc, num_chains=4, num_samples=50)


@pytest.mark.slow  # the vectorized continuation runs in the test above
def test_sequential_continuation_carries_the_tuner_over():
    mcmc = run(AdaptiveHMC(normal_model), DATA, num_chains=2, chain_method="sequential", warmup=200, samples=100)
    assert_continuation_carries_the_tuner_over(mcmc, num_chains=2, num_samples=100)


def test_numpyro_model_through_the_blackjax_loop_recipe(x64):
    """The README's recipe for cheap NumPyro models: the model's potential and initial values from
    ``initialize_model``, sampled by ``run_chains`` (ahmc owns the loop), constrained back by its
    ``postprocess_fn``.  A normal site and a log-normal one (a positive site, sampled on the log scale)."""
    from numpyro.infer.util import initialize_model

    from ahmc.adapters.blackjax import run_chains

    def model():
        numpyro.sample("x", dist.Normal(1.0, 2.0))
        numpyro.sample("s", dist.LogNormal(0.0, 0.5))

    init = initialize_model(jax.random.split(jax.random.key(1), 4), model)
    samples, _ = run_chains(jax.random.key(0), lambda z: -init.potential_fn(z), init.param_info.z,
                            num_warmup=500, num_samples=1000)
    posterior = jax.vmap(jax.vmap(init.postprocess_fn))(samples)
    draws = np.stack([np.asarray(posterior["x"]), np.asarray(posterior["s"])], axis=-1)
    lognormal_mean = np.exp(0.125)
    lognormal_sd = np.sqrt((np.exp(0.25) - 1.0) * np.exp(0.25))
    assert_moments_match(draws, np.array([1.0, lognormal_mean]), np.array([2.0, lognormal_sd]))


@pytest.mark.slow  # 2026-12-05: the default suite took 18-22 min on this host; a default test covers most of it
def test_esjd_moments_objective_reaches_the_engine():
    """The engine's variance-aware reward through the kernel (its statistics: test_blackjax.py)."""
    mcmc = run(AdaptiveHMC(normal_model, objective="esjd_moments"), DATA, num_chains=2, warmup=200, samples=200)
    rewards = np.asarray(mcmc.get_extra_fields()["reward"])
    ended = ~np.isnan(rewards)
    assert ended.sum() >= 20 and np.all(rewards[ended] > 0)
    assert abs(float(jnp.mean(mcmc.get_samples()["mu"])) - float(np.mean(DATA))) < 0.2  # posterior sd 0.32


@pytest.mark.parametrize("dense_mass", [True, pytest.param("auto", marks=pytest.mark.slow)])
def test_dense_mass_samples_a_correlated_gaussian(x64, dense_mass):
    """dense_mass=True (NumPyro's name): the learned dense matrix whitens correlation 0.99, so the step size
    is whitened-scale (a diagonal one needs ~0.1); the draws agree with the truth. "auto" keeps it too."""
    correlation = 0.99 ** np.abs(np.subtract.outer(np.arange(3), np.arange(3)))
    scales, mean = np.array([0.1, 1.0, 10.0]), np.array([1.0, -2.0, 5.0])

    def model():
        numpyro.sample("x", dist.MultivariateNormal(mean, correlation * np.outer(scales, scales)))

    mcmc = run(AdaptiveHMC(model, dense_mass=dense_mass), seed=3, warmup=1000, samples=1000)
    assert_moments_match(np.asarray(mcmc.get_samples(group_by_chain=True)["x"]), mean, scales)
    assert np.asarray(mcmc.last_state.engine.inverse_mass_matrix).shape == (3, 3)
    assert np.median(np.asarray(mcmc.get_extra_fields()["step_size"])) > 0.4
    with pytest.raises(ValueError, match="dense_mass must be True, False or 'auto'"):
        AdaptiveHMC(model, dense_mass=[("x",)])


def test_model_args_kwargs_deterministic_sites_and_jit_model_args():
    mcmc = MCMC(AdaptiveHMC(normal_model), num_warmup=200, num_samples=200, progress_bar=False, jit_model_args=True)
    mcmc.run(jax.random.key(0), DATA, scale=1.0)
    first = mcmc.get_samples()
    np.testing.assert_allclose(first["mu_times_two"], 2 * first["mu"], rtol=1e-6)
    assert float(jnp.min(first["sigma"])) > 0  # constrained site comes back constrained
    mcmc.run(jax.random.key(0), DATA + 10.0, scale=1.0)  # new data, same compiled kernel
    assert float(jnp.mean(mcmc.get_samples()["mu"])) > 8.0


def test_stats_summary_and_arviz_datatree(capsys):
    mcmc = run(AdaptiveHMC(normal_model), DATA, num_chains=2, warmup=200, samples=100)
    fields = mcmc.get_extra_fields(group_by_chain=True)
    for name in ["diverging", "step_size", "max_steps", "num_steps", "accept_prob", "reward", "tuning_round",
                 "arm_changed", "adapt_probability", "potential_energy", "energy"]:
        assert np.asarray(fields[name]).shape == (2, 100), name
    first_try = ~np.asarray(fields["retried"])  # a retry takes (divergence_retry + 2) x the first try's steps
    assert np.all(np.asarray(fields["num_steps"])[first_try] <= np.asarray(fields["max_steps"])[first_try])
    assert np.all(np.asarray(fields["num_steps"]) >= 1)
    mcmc.print_summary()
    assert "Number of divergences" in capsys.readouterr().out

    arviz_base = pytest.importorskip("arviz_base")
    tree = arviz_base.from_numpyro(mcmc)
    assert {"posterior", "sample_stats"} <= set(tree.children)
    stats = tree["sample_stats"]
    for name in ["step_size", "max_steps", "reward", "tuning_round", "diverging", "acceptance_rate"]:
        assert name in stats.data_vars, name
    assert tree["posterior"]["mu"].shape == (2, 100)


@pytest.mark.parametrize("num_chains, chain_method", [(3, "vectorized"), (1, "sequential")])
def test_nuts_field_names_mean_what_they_mean_in_numpyro(x64, num_chains, chain_method):
    """A NUTS user's ``extra_fields`` work: ``adapt_state.step_size`` and ``.inverse_mass_matrix``,
    ``mean_accept_prob`` (the running mean of ``accept_prob``, restarted when the draws begin), ``z_grad``
    (the potential's gradient at ``z``) and ``trajectory_length``, each checked against what it means."""
    scales = jnp.array([0.5, 1.0, 3.0])

    def potential(z):
        return 0.5 * jnp.sum((z / scales) ** 2)

    init = jnp.tile(jnp.array([0.3, -0.2, 1.0]), (num_chains, 1)) if num_chains > 1 else jnp.array([0.3, -0.2, 1.0])
    mcmc = MCMC(AdaptiveHMC(potential_fn=potential), num_warmup=200, num_samples=150, num_chains=num_chains,
                chain_method=chain_method, progress_bar=False)
    mcmc.run(jax.random.key(3), init_params=init, extra_fields=(
        "adapt_state.step_size", "adapt_state.inverse_mass_matrix", "mean_accept_prob", "z_grad",
        "trajectory_length", "accept_prob"))
    fields = {name: np.asarray(value) for name, value in mcmc.get_extra_fields(group_by_chain=True).items()}
    z = np.asarray(mcmc.get_samples(group_by_chain=True))
    metric = np.asarray(mcmc.last_state.engine.inverse_mass_matrix)  # one for all chains: (3, 3) low-rank
    assert metric.shape == (3, 3)
    assert fields["adapt_state.inverse_mass_matrix"].shape == (num_chains, 150, 3, 3)
    np.testing.assert_array_equal(fields["adapt_state.inverse_mass_matrix"][:, -1],
                                  np.broadcast_to(metric, (num_chains, 3, 3)))
    np.testing.assert_array_equal(fields["adapt_state.step_size"], fields["step_size"])
    np.testing.assert_allclose(fields["trajectory_length"], fields["step_size"] * fields["num_steps"])
    np.testing.assert_allclose(fields["z_grad"], z / np.asarray(scales) ** 2, rtol=1e-10)
    running = np.cumsum(fields["accept_prob"], axis=1) / np.arange(1, 151)  # the draws' phase from its start
    np.testing.assert_allclose(fields["mean_accept_prob"], running, rtol=1e-10)


def test_diagnostics_string():
    kernel = AdaptiveHMC(normal_model)
    mcmc = run(kernel, DATA, num_chains=1, warmup=50, samples=10)
    text = kernel.get_diagnostics_str(mcmc.last_state)
    assert "steps of size" in text and "L=" in text and "acc. prob" in text


def test_discrete_latent_site_gets_a_clear_error():
    def model():
        numpyro.sample("k", dist.Poisson(3.0))
        numpyro.sample("x", dist.Normal(0.0, 1.0))

    with pytest.raises((ValueError, ImportError), match="discrete|funsor"):
        run(AdaptiveHMC(model), num_chains=1, warmup=10, samples=10)


def test_non_finite_initial_density_and_bad_knobs_raise():
    with pytest.raises(ValueError, match="not finite"):
        run(AdaptiveHMC(potential_fn=lambda z: jnp.sum(z) * jnp.inf), num_chains=1, warmup=10, samples=10,
            init_params=jnp.zeros(2))
    with pytest.raises(ValueError, match="exactly one"):
        AdaptiveHMC()
    with pytest.raises(ValueError, match="min_steps_fraction"):
        AdaptiveHMC(normal_model, min_steps_fraction=-0.5)
    with pytest.raises(ValueError, match="step_size bounds are reversed"):
        AdaptiveHMC(normal_model, step_size_bounds=(1.0, 0.1), num_steps_bounds=(1, 10))
    with pytest.raises(ValueError, match="needs adapt_mass_matrix=True"):
        AdaptiveHMC(normal_model, objective="esjd_moments", adapt_mass_matrix=False)
