"""The README's code runs as printed.

Each test takes one ```python block from README.md (found by a line it contains, so edits around it
do not matter), fills in the names the README leaves to the reader (``model``, ``y``, ``X``, a round
reward) and executes it.  A renamed argument, a changed return value or a missing import in the
README then fails here instead of in a user's first session.
"""

import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def block(marker):
    """The one README code block that contains ``marker``."""
    found = [code for code in BLOCKS if marker in code]
    assert len(found) == 1, f"{len(found)} README code blocks contain {marker!r}"
    return found[0]


def run(code, **names):
    namespace = dict(names)
    exec(compile(code, str(README), "exec"), namespace)
    return namespace


def eight_schools_numpyro():
    """Eight schools as ``examples/plot_tuning.py`` writes it: ``(model(y, sigma), y, sigma)``."""
    from tests.test_examples import load

    example = load("plot_tuning")
    return example.eight_schools, example.y, example.sigma


def test_every_python_block_is_valid_python():
    assert len(BLOCKS) >= 10
    for code in BLOCKS:
        compile(textwrap.dedent(code), str(README), "exec")


def test_core_in_ten_lines_finds_the_best_arm():
    best = (0.1, 20)  # a smooth reward surface over (log eps, L) with its peak here

    def my_round_reward(step_size, num_steps):
        return 4.0 * np.exp(-np.log(step_size / best[0]) ** 2 - ((num_steps - best[1]) / 30) ** 2)

    names = run(block("from ahmc.core import search_space, gp_ucb"), my_round_reward=my_round_reward)
    step_size, num_steps = names["tuner"].arm(names["state"])
    assert abs(np.log(step_size / best[0])) < 0.5 and abs(num_steps - best[1]) < 15
    assert np.shape(names["surrogate"].mean) == np.shape(names["surrogate"].sd)


def test_blackjax_block_runs():
    pytest.importorskip("blackjax")
    names = run(block("from ahmc.adapters.blackjax import gpucb_adaptation, uniform_steps_hmc, adaptive_hmc"))
    assert set(names["parameters"]) >= {"step_size", "inverse_mass_matrix", "num_integration_steps"}
    assert names["state"].position.shape == (4, 10)


def test_numpyro_block_runs(capsys):
    pytest.importorskip("numpyro")
    import arviz
    import jax

    model, y, sigma = eight_schools_numpyro()
    names = run(block("idata = arviz.from_numpyro(mcmc)"),
                jax=jax, arviz=arviz, model=model, y=y, sigma=sigma)
    idata = names["idata"]
    assert idata["posterior"]["mu"].shape == (4, 1000)
    assert {"reward", "max_steps", "step_size"} <= set(idata["sample_stats"].data_vars)
    assert "theta_trans[7]" in capsys.readouterr().out  # print_summary's table


def test_pymc_block_runs():
    pytest.importorskip("pymc")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 5))
    names = run(block("idata = pm.sample(step=AdaptiveHMC(), tune=1000, draws=1000, chains=4)"),
                X=X, y=X @ np.arange(1.0, 6.0) + rng.normal(size=50))
    posterior, stats = names["idata"].posterior, names["idata"].sample_stats
    assert posterior["beta"].shape == (4, 1000, 5)
    np.testing.assert_allclose(posterior["beta"].mean(("chain", "draw")), np.arange(1.0, 6.0), atol=0.5)
    assert {"max_steps", "reward", "tuning_round", "arm_changed"} <= set(stats.data_vars)


def test_pymc_pooled_line_runs():
    """The one-line pooled example, in a model like the block above (fewer draws)."""
    pm = pytest.importorskip("pymc")
    from ahmc.adapters.pymc import AdaptiveHMC

    code = block("AdaptiveHMC(pooled=True)").replace("tune=1000, draws=1000", "tune=300, draws=200")
    with pm.Model():
        pm.Normal("x", 0.0, [1.0, 10.0], shape=2)
        names = run(code, pm=pm, AdaptiveHMC=AdaptiveHMC)
    stats = names["idata"].sample_stats
    assert names["idata"].posterior["x"].shape == (4, 200, 2)
    np.testing.assert_array_equal(stats["step_size"].values[1:], np.broadcast_to(stats["step_size"].values[0], (3, 200)))


@pytest.mark.slow
def test_tuning_diagnostics_block_runs(tmp_path, monkeypatch):
    pytest.importorskip("numpyro")
    pytest.importorskip("matplotlib")
    import jax
    from numpyro.infer import MCMC

    from ahmc.adapters.numpyro import AdaptiveHMC

    monkeypatch.chdir(tmp_path)  # the block writes tuning.png
    model, y, sigma = eight_schools_numpyro()
    run(block("history = history_from_datatree(tree)"), MCMC=MCMC, AdaptiveHMC=AdaptiveHMC, model=model,
        data=(y, sigma), rng_key=jax.random.key(0))
    assert (tmp_path / "tuning.png").stat().st_size > 10_000


@pytest.mark.slow
def test_compiled_pymc_block_runs():
    pytest.importorskip("pymc")
    pytest.importorskip("numpyro")
    import pymc as pm

    with pm.Model() as model:
        pm.Normal("x", 0.0, np.array([1.0, 3.0]), shape=2)
    names = run(block("idata = sample_numpyro_ahmc(draws=1000, tune=1000, chains=4, random_seed=1)"), model=model)
    assert names["idata"].posterior["x"].shape[:2] == (4, 1000)


def logistic_data(n=100):
    rng = np.random.default_rng(3)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, 2))])  # intercept first
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-X @ np.array([0.5, 1.0, -1.0])))).astype(float)
    return X, y


@pytest.mark.slow
def test_rmhmc_numpyro_and_blackjax_block_runs():
    pytest.importorskip("numpyro")
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC

    X, y = logistic_data()

    def model():
        beta = numpyro.sample("beta", dist.Normal(0, 10).expand([3]))
        numpyro.sample("y", dist.Bernoulli(logits=jnp.asarray(X) @ beta), obs=y)

    def logdensity_fn(beta):
        logits = jnp.asarray(X) @ beta
        return jnp.sum(y * logits - jnp.logaddexp(0.0, logits)) - jnp.sum(beta**2) / 200.0

    names = run(block("samples, info = run_rmhmc_chains(key, logdensity_fn, positions, 500, 1000, metric=metric)"),
                MCMC=MCMC, jax=jax, model=model, X_with_ones_column=X, logdensity_fn=logdensity_fn,
                key=jax.random.key(1), positions=jnp.zeros((4, 3)))
    assert names["mcmc"].get_samples()["beta"].shape == (4000, 3)
    assert np.shape(names["samples"])[:2] == (4, 1000)


def test_rmhmc_model_fisher_block_runs():
    pytest.importorskip("numpyro")
    import jax

    with jax.enable_x64(True):
        names = run(textwrap.dedent(block('AdaptiveRMHMC(funnel, metric="diagonal_fisher")')))
    v = np.asarray(names["mcmc"].get_samples(group_by_chain=True)["v"])
    assert v.shape == (4, 1000) and v.min() < -3.0  # P(v < -3) = 16%: a sampler stuck at the mouth fails


@pytest.mark.slow
def test_rmhmc_pymc_block_runs():
    pytest.importorskip("pymc")
    import pymc as pm

    X, y = logistic_data()
    with pm.Model() as model:
        beta = pm.Normal("beta", 0, 10, shape=3)
        pm.Bernoulli("y", logit_p=X @ beta, observed=y)
    names = run(block("idata = pm.sample(step=AdaptiveRMHMC(metric=fisher_logistic_metric(X)))"),
                pm=pm, model=model, X=X, my_pytensor_matrix=lambda x: 2.0 * pm.math.eye(3) + 0.0 * x.sum())
    assert names["idata"].posterior["beta"].shape[2] == 3
