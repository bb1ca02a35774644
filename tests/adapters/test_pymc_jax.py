"""sample_numpyro_ahmc: a PyMC model on the compiled JAX engine (one pooled tuner)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pm = pytest.importorskip("pymc")
pytest.importorskip("numpyro")

from pymc.exceptions import SamplingError  # noqa: E402

from ahmc.adapters.diagnostics import history_from_datatree  # noqa: E402
from ahmc.core.diagnostics import tuning_summary  # noqa: E402
from tests.adapters.test_pymc import SCALES, gaussian_model, reference_model  # noqa: E402
from tests.reference import assert_moments_match, assert_reference_match, load_reference  # noqa: E402

QUIET = dict(progressbar=False, compute_convergence_checks=False)

# Importing the module turns JAX's 64-bit mode on (PyMC's JAX backend does): import it inside the
# tests, under the fixture that gives the other tests their single precision back.
pytestmark = pytest.mark.usefixtures("jax_x64")


def sample_numpyro_ahmc(*args, **kwargs):
    from ahmc.adapters.pymc import sample_numpyro_ahmc as sample

    return sample(*args, **kwargs)


@pytest.mark.parametrize("name", [
    "eight_schools-eight_schools_noncentered",  # a Deterministic and a log-transformed scale
    pytest.param("low_dim_gauss_mix-low_dim_gauss_mix", marks=pytest.mark.slow),  # ordered, logit transforms
])
def test_posteriordb_reference(name):
    ref = load_reference(name)
    tree = sample_numpyro_ahmc(model=reference_model(name), random_seed=3, **QUIET)
    assert_reference_match({v: tree.posterior[v].values for v in ref["dimensions"]}, name)


def test_gaussian_moments_and_pooled_tuner():
    tree = sample_numpyro_ahmc(model=gaussian_model(), random_seed=4, **QUIET)
    assert_moments_match(tree.posterior["x"].values, np.zeros(len(SCALES)), SCALES)
    stats = tree.sample_stats
    # One pooled tuner: every chain runs the same arm at every draw.
    for name in ("step_size", "max_steps", "tuning_round"):
        values = stats[name].values
        assert (values == values[:1]).all(), name


@pytest.mark.slow  # ~30 s; default run under 15 min (2026-11-28)
def test_riemannian_samples_a_correlated_gaussian_and_reports_the_solver():
    cov = np.array([[1.0, 0.99], [0.99, 1.0]])
    with pm.Model() as model:
        pm.MvNormal("x", np.zeros(2), cov=cov)
    tree = sample_numpyro_ahmc(model=model, tune=500, random_seed=2, riemannian=True, discard_tuned_samples=False,
                               **QUIET)
    x = tree.posterior["x"].values
    # The whitened coordinates (x1 + x2, x1 - x2) / sqrt(2) are independent N(0, 1.99) and N(0, 0.01).
    rotated = np.stack([x[..., 0] + x[..., 1], x[..., 0] - x[..., 1]], axis=-1) / np.sqrt(2.0)
    assert_moments_match(rotated, np.zeros(2), np.sqrt([1.99, 0.01]))
    stats = tree.sample_stats
    assert stats["fixed_point_converged"].dtype == bool and stats["fixed_point_converged"].values.mean() > 0.9
    assert (stats["n_grad_evals"].values >= stats["n_steps"].values).all()
    assert tree.posterior.attrs["sampler"] == "ahmc.adapters.numpyro.AdaptiveRMHMC"
    assert "one pooled tuner" in tuning_summary(history_from_datatree(tree))


@pytest.mark.slow  # ~28 s; default run under 15 min (2026-11-28)
def test_datatree_has_pymc_names_coords_and_the_tuning_history():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 2))
    with pm.Model(coords={"k": ["a", "b"]}) as model:
        b = pm.Normal("b", 0, 10, dims="k")
        sigma = pm.HalfNormal("sigma", 5)
        pm.Deterministic("variance", sigma**2)  # perfectly correlated with sigma: no dense-mass hint
        pm.Normal("y", pm.math.dot(X, b), sigma, observed=X @ [1.0, -1.0] + rng.normal(size=50))
        tree = sample_numpyro_ahmc(draws=200, tune=300, chains=2, random_seed=1, discard_tuned_samples=False,
                                   keep_untransformed=True, **QUIET)
    post = tree.posterior
    assert post["b"].dims == ("chain", "draw", "k") and list(post["k"].values) == ["a", "b"]
    assert post["sigma"].shape == (2, 200) and (post["sigma"].values > 0).all()
    np.testing.assert_allclose(post["variance"].values, post["sigma"].values ** 2)
    np.testing.assert_allclose(np.exp(post["sigma_log__"].values), post["sigma"].values)
    assert tree.warmup_posterior["b"].shape == (2, 300, 2)
    stats = tree.sample_stats
    expected = {"step_size": "f", "n_steps": "i", "acceptance_rate": "f", "diverging": "b", "energy": "f",
                "lp": "f", "max_steps": "i", "reward": "f", "tuning_round": "i", "arm_changed": "b",
                "adapt_probability": "f", "restarted": "b", "retried": "b"}
    for name, kind in expected.items():
        assert stats[name].dtype.kind == kind and stats[name].shape == (2, 200), name
    first_try = ~stats["retried"].values  # a retry takes (divergence_retry + 2) x the first try's steps
    assert (stats["n_steps"].values >= 1).all()
    assert (stats["n_steps"].values[first_try] <= stats["max_steps"].values[first_try]).all()
    # lp is the model's log density at the draw (PyMC's convention), not the potential energy
    with model:
        logp = model.compile_logp()
    point = {"b": post["b"].values[1, -1], "sigma_log__": post["sigma_log__"].values[1, -1]}
    np.testing.assert_allclose(stats["lp"].values[1, -1], logp(point), rtol=1e-8)
    assert json.loads(tree.attrs["ahmc_free_vars"]) == ["b", "sigma"]

    history = history_from_datatree(tree)
    summary = tuning_summary(history)
    assert "one pooled tuner" in summary and "Hint: posterior correlation" not in summary
    assert history.strongest_correlation is not None and abs(history.strongest_correlation[0]) < 0.9
    # Without the free-variable list, the Deterministic would be reported as a correlation of ~1.
    everything = history_from_datatree(tree, var_names=list(post.data_vars))
    assert abs(everything.strongest_correlation[0]) > 0.99


@pytest.mark.slow  # ~45 s; default run under 15 min (2026-11-28)
def test_random_seed_reproduces_draws():
    runs = [sample_numpyro_ahmc(model=gaussian_model(), draws=50, tune=100, chains=2, random_seed=seed, **QUIET)
            for seed in (5, 5, 6)]
    first, second, other = (run.posterior["x"].values for run in runs)
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first, other)


@pytest.mark.slow  # ~35 s
def test_warmup_kept_from_one_compiled_loop_as_from_two(monkeypatch):
    """Warm-up and draws run in one compiled loop, the warm-up kept or not; NumPyro's public route to the
    warm-up's draws (``MCMC.warmup`` then ``MCMC.run``, two compiled loops) must give the same draws and stats."""
    from ahmc.adapters.pymc import _compiled

    kwargs = dict(model=gaussian_model(), draws=40, tune=120, chains=2, random_seed=7, **QUIET)
    once = sample_numpyro_ahmc(**kwargs)
    kept = sample_numpyro_ahmc(discard_tuned_samples=False, **kwargs)
    monkeypatch.setattr(_compiled, "_run", lambda mcmc, keys, init, fields, keep_warmup:
                        _compiled._warmup_then_run(mcmc, keys, init, fields))
    two_loops = sample_numpyro_ahmc(discard_tuned_samples=False, **kwargs)
    assert "warmup_posterior" not in once.children
    assert kept["warmup_posterior"]["x"].shape[:2] == (2, 120) and kept.posterior["x"].shape[:2] == (2, 40)
    for group, name in (("posterior", "x"), ("sample_stats", "step_size"), ("sample_stats", "n_steps")):
        np.testing.assert_array_equal(once[group][name].values, kept[group][name].values)
        np.testing.assert_array_equal(two_loops[group][name].values, kept[group][name].values)
    for group, name in (("warmup_posterior", "x"), ("warmup_sample_stats", "n_steps"), ("warmup_sample_stats", "lp")):
        np.testing.assert_array_equal(two_loops[group][name].values, kept[group][name].values)


@pytest.mark.slow  # ~22 s; default run under 15 min (2026-11-28)
def test_one_chain_has_pymc_shapes():
    tree = sample_numpyro_ahmc(model=gaussian_model(), draws=60, tune=100, chains=1, random_seed=1, **QUIET)
    assert tree.posterior["x"].shape == (1, 60, len(SCALES))
    assert tree.sample_stats["n_steps"].shape == (1, 60)


@pytest.mark.slow  # ~22 s; default run under 15 min (2026-11-28)
def test_knobs_reach_the_kernel():
    tree = sample_numpyro_ahmc(model=gaussian_model(), draws=50, tune=200, chains=2, random_seed=1,
                               step_size_bounds=(0.05, 0.06), num_steps_bounds=(3, 4), **QUIET)
    step_size, max_steps = tree.sample_stats["step_size"].values, tree.sample_stats["max_steps"].values
    assert ((step_size >= 0.05 - 1e-12) & (step_size <= 0.06 + 1e-12)).all()
    assert set(np.unique(max_steps)) <= {3, 4}


# ---- bad input -----------------------------------------------------------------------------

def test_discrete_variable_is_refused_with_a_hint():
    with pm.Model() as model:
        pm.Normal("x", 0, 1)
        pm.Poisson("k", 3)
    with pytest.raises(ValueError, match=r"discrete.*\['k'\].*Metropolis"):
        sample_numpyro_ahmc(model=model, **QUIET)


def test_non_finite_initial_density_raises_sampling_error():
    with pm.Model() as model:
        x = pm.Normal("x", 0, 1)
        pm.Potential("bad", pm.math.switch(x > 0.5, -np.inf, 0.0))
    with pytest.raises(SamplingError, match=r"model\.debug\(\)"):
        sample_numpyro_ahmc(model=model, chains=1, initvals={"x": 1.0}, jitter=False, **QUIET)


@pytest.mark.parametrize("kwargs, match", [
    (dict(step_size_bounds=(0.5, 0.1), num_steps_bounds=(1, 10)), "reversed"),
    (dict(objective="bogus"), "objective"),
    (dict(draws=0), "`draws` must be a positive integer"),
    (dict(chains=1.5), "`chains` must be a positive integer"),
])
def test_bad_arguments_raise_before_sampling(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sample_numpyro_ahmc(model=gaussian_model(), **kwargs, **QUIET)
