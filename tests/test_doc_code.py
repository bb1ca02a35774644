"""The code in the README and in docs/ runs as printed.

Each test takes one ```python block (found by a line it contains, so edits around it do not matter),
fills in the names the text leaves to the reader (``model``, ``X``, a round reward), sometimes runs
fewer draws, and executes it. ``MARKERS`` lists the line each test looks for, and a test checks that
every block of every document is one of them: a block no test runs fails the suite.
"""

import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = {path.relative_to(ROOT).as_posix(): [textwrap.dedent(code) for code in
                                             re.findall(r"```python\n(.*?)```", path.read_text(), re.S)]
          for path in DOCUMENTS}
# name -> the line that identifies the block its test runs
MARKERS = {
    "numpyro_quickstart": "idata = arviz.from_numpyro(mcmc)    # posterior",
    "blackjax_quickstart": "# Sample with the tuned kernel: HMC with L_t ~ Uniform{1..L}, one chain per state.",
    "pymc_quickstart": "idata = pm.sample(step=AdaptiveHMC(), tune=1000, draws=1000, chains=4)",
    "compiled_quickstart": "idata = sample_numpyro_ahmc(draws=1000, tune=1000, chains=4, random_seed=1)",
    "readme_diagnostics": "history = history_from_numpyro(mcmc, warmup=warmup)",
    "core": "from ahmc.core import search_space, gp_ucb",
    "blackjax_guide": "pooled = pooled_adaptive_hmc(logdensity_fn, num_chains=4, num_warmup=1000)",
    "numpyro_in_own_loop": "init = initialize_model(",
    "pymc_pooled": "PooledAdaptiveHMC()",
    "compiled_options": "sample_numpyro_ahmc(discard_tuned_samples=False, dense_mass=True)",
    "datatree_diagnostics": "history = history_from_datatree(tree)",
    "rmhmc_jax": "samples, info = run_chains(key, logdensity_fn, positions, 500, 1000, metric=metric)",
    "rmhmc_model_fisher": 'AdaptiveRMHMC(funnel, metric="diagonal_fisher")',
    "funnel_metric": "def funnel_metric(flat):",
    "rmhmc_pymc": "idata = pm.sample(step=AdaptiveRMHMC(metric=fisher_logistic_metric(X)))",
    "cross_validation": "cv = cross_validate(model, X, y,",
    "warm_start": 'tuning_snapshot(info, state).save("fit.json")',
    "warm_start_no_recompile": "jit_model_args=True)",
    "warm_start_partial": "jax.tree_util.Partial(logistic, X_new, y_new)",
    "readme_devices": "positions = shard_chains(jax.random.normal(key, (64, dim)))",
}


def block(name):
    """The one code block, over README and docs, that contains ``MARKERS[name]``."""
    found = [code for blocks in BLOCKS.values() for code in blocks if MARKERS[name] in code]
    assert len(found) == 1, f"{len(found)} code blocks contain {MARKERS[name]!r}"
    return found[0]


def run(code, **names):
    namespace = dict(names)
    exec(compile(code, "<doc block>", "exec"), namespace)
    return namespace


def test_every_python_block_is_run_by_a_test():
    assert len(BLOCKS["README.md"]) == 6
    unclaimed = [f"{doc}: {code.splitlines()[0]}" for doc, blocks in BLOCKS.items() for code in blocks
                 if sum(marker in code for marker in MARKERS.values()) != 1]
    assert not unclaimed, "code blocks that no test runs (add a marker and a test):\n" + "\n".join(unclaimed)
    for name in MARKERS:
        block(name)  # every marker finds exactly one block


def eight_schools_numpyro():
    """Eight schools as ``examples/plot_tuning.py`` writes it: ``(model(y, sigma), y, sigma)``."""
    from tests.test_examples import load

    example = load("plot_tuning")
    return example.eight_schools, example.y, example.sigma


def test_core_in_ten_lines_finds_the_best_arm():
    best = (0.1, 20)  # a smooth reward surface over (log eps, L) with its peak here

    def my_round_reward(step_size, num_steps):
        return 4.0 * np.exp(-np.log(step_size / best[0]) ** 2 - ((num_steps - best[1]) / 30) ** 2)

    names = run(block("core"), my_round_reward=my_round_reward)
    step_size, num_steps = names["tuner"].arm(names["state"])
    assert abs(np.log(step_size / best[0])) < 0.5 and abs(num_steps - best[1]) < 15
    assert np.shape(names["surrogate"].mean) == np.shape(names["surrogate"].sd)


def test_numpyro_quickstart_runs(capsys):
    pytest.importorskip("numpyro")
    names = run(block("numpyro_quickstart"))
    idata = names["idata"]
    assert idata["posterior"]["mu"].shape == (4, 1000)
    assert {"reward", "max_steps", "step_size"} <= set(idata["sample_stats"].data_vars)
    assert "theta_trans[7]" in capsys.readouterr().out  # print_summary's table
    mu = idata["posterior"]["mu"].values
    assert abs(mu.mean() - 4.4) < 1.0  # eight schools' posterior mean of mu is about 4.4 (sd 3.3)


def test_blackjax_quickstart_runs():
    pytest.importorskip("blackjax")
    names = run(block("blackjax_quickstart"))
    assert set(names["parameters"]) >= {"step_size", "inverse_mass_matrix", "num_integration_steps"}
    assert names["state"].position.shape == (4, 10)
    assert names["states"].position.shape == (4, 10)


def test_readme_devices_block_runs():
    """On this process's one device: the chains are laid out on a one-device mesh and come back so."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    code = block("readme_devices").replace("1000, 1000", "300, 200")
    names = run(code, jax=jax, key=jax.random.key(0), dim=3,
                logdensity_fn=lambda x: -0.5 * jnp.sum((x / jnp.arange(1.0, 4.0)) ** 2))
    samples = names["samples"]
    assert samples.shape == (64, 200, 3)
    assert samples.sharding.mesh.axis_names == ("chains",)  # one device: the spec is trivially P()
    np.testing.assert_allclose(np.asarray(samples).std(axis=(0, 1)), [1.0, 2.0, 3.0], rtol=0.15)


@pytest.mark.slow  # the quickstart's first half again, and the pooled form
def test_blackjax_guide_block_runs():
    pytest.importorskip("blackjax")
    names = run(block("blackjax_guide"))
    assert names["state"].position.shape == (4, 10)


def test_pymc_quickstart_runs():
    pytest.importorskip("pymc")
    names = run(block("pymc_quickstart"))
    posterior, stats = names["idata"].posterior, names["idata"].sample_stats
    assert posterior["beta"].shape == (4, 1000, 5)
    np.testing.assert_allclose(posterior["beta"].mean(("chain", "draw")), np.arange(1.0, 6.0), atol=0.5)
    assert {"max_steps", "reward", "tuning_round", "arm_changed"} <= set(stats.data_vars)


def test_pymc_pooled_line_runs():
    """The one-line pooled example, in a small model (fewer draws)."""
    pm = pytest.importorskip("pymc")
    from ahmc.adapters.pymc import PooledAdaptiveHMC

    code = block("pymc_pooled").replace("tune=1000, draws=1000", "tune=300, draws=200")
    with pm.Model():
        pm.Normal("x", 0.0, [1.0, 10.0], shape=2)
        names = run(code, pm=pm, PooledAdaptiveHMC=PooledAdaptiveHMC)
    stats = names["idata"].sample_stats
    assert names["idata"].posterior["x"].shape == (4, 200, 2)
    np.testing.assert_array_equal(stats["step_size"].values[1:], np.broadcast_to(stats["step_size"].values[0], (3, 200)))


def test_readme_diagnostics_block_runs(tmp_path, monkeypatch, capsys):
    pytest.importorskip("numpyro")
    pytest.importorskip("matplotlib")
    import arviz
    import jax
    from numpyro.infer import MCMC

    from ahmc.adapters.numpyro import AdaptiveHMC

    monkeypatch.chdir(tmp_path)  # the block writes tuning.png
    model, y, sigma = eight_schools_numpyro()
    code = block("readme_diagnostics").replace("num_warmup=1000, num_samples=1000", "num_warmup=400, num_samples=200")
    run(code, MCMC=MCMC, AdaptiveHMC=AdaptiveHMC, eight_schools=model, y=y, sigma=sigma, jax=jax, arviz=arviz)
    out = capsys.readouterr().out
    assert "ahmc tuning summary: 4 chain(s), one pooled tuner" in out
    assert "not recorded" not in out  # the warm-up's rounds are in the history
    assert (tmp_path / "tuning.png").stat().st_size > 10_000


@pytest.mark.slow
def test_datatree_diagnostics_block_runs(tmp_path, monkeypatch):
    pytest.importorskip("numpyro")
    pytest.importorskip("matplotlib")
    import jax
    from numpyro.infer import MCMC

    from ahmc.adapters.numpyro import AdaptiveHMC

    monkeypatch.chdir(tmp_path)  # the block writes tuning.png
    model, y, sigma = eight_schools_numpyro()
    run(block("datatree_diagnostics"), MCMC=MCMC, AdaptiveHMC=AdaptiveHMC, model=model,
        data=(y, sigma), rng_key=jax.random.key(0))
    assert (tmp_path / "tuning.png").stat().st_size > 10_000


@pytest.mark.slow
def test_numpyro_in_ahmcs_own_loop_block_runs():
    pytest.importorskip("numpyro")
    import jax

    model, y, sigma = eight_schools_numpyro()
    names = run(block("numpyro_in_own_loop"), jax=jax, model=model, y=y, sigma=sigma)
    assert names["posterior"]["tau"].shape == (4, 1000)
    assert float(names["posterior"]["tau"].min()) > 0  # constrained back


@pytest.mark.slow
def test_compiled_pymc_quickstart_runs():
    pytest.importorskip("pymc")
    pytest.importorskip("numpyro")
    names = run(block("compiled_quickstart"))
    assert names["idata"].posterior["x"].shape[:2] == (4, 1000)
    np.testing.assert_allclose(names["idata"].posterior["x"].std(("chain", "draw")), [1.0, 3.0], rtol=0.15)


@pytest.mark.slow
def test_compiled_pymc_options_block_runs():
    pm = pytest.importorskip("pymc")
    pytest.importorskip("numpyro")
    from ahmc.adapters.pymc import sample_numpyro_ahmc

    with pm.Model() as model:
        pm.MvNormal("x", np.zeros(2), np.array([[1.0, 0.9], [0.9, 1.0]]))
    names = run(block("compiled_options"), model=model, sample_numpyro_ahmc=sample_numpyro_ahmc)
    assert "warmup_posterior" in names["idata"].children


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

    names = run(block("rmhmc_jax"), MCMC=MCMC, jax=jax, model=model, X_with_ones_column=X,
                logdensity_fn=logdensity_fn, key=jax.random.key(1), positions=jnp.zeros((4, 3)))
    assert names["mcmc"].get_samples()["beta"].shape == (4000, 3)
    assert np.shape(names["samples"])[:2] == (4, 1000)


def test_rmhmc_model_fisher_block_runs():
    pytest.importorskip("numpyro")
    import jax

    with jax.enable_x64(True):
        names = run(block("rmhmc_model_fisher"))
    v = np.asarray(names["mcmc"].get_samples(group_by_chain=True)["v"])
    assert v.shape == (4, 1000) and v.min() < -3.0  # P(v < -3) = 16%: a sampler stuck at the mouth fails


def test_funnel_metric_block_is_the_funnels_expected_fisher_information():
    jnp = pytest.importorskip("jax.numpy")
    metric = run(block("funnel_metric"), jnp=jnp)["funnel_metric"]
    flat = jnp.array([1.0, 0.3, -0.2, 0.5])
    np.testing.assert_allclose(metric(flat), [1 / 9 + 3 / 2, *([np.exp(-1.0)] * 3)], rtol=1e-6)


@pytest.mark.slow
def test_rmhmc_pymc_block_runs():
    pytest.importorskip("pymc")
    import pymc as pm

    X, y = logistic_data()
    with pm.Model() as model:
        beta = pm.Normal("beta", 0, 10, shape=3)
        pm.Bernoulli("y", logit_p=X @ beta, observed=y)
    names = run(block("rmhmc_pymc"), pm=pm, model=model, X=X,
                my_pytensor_matrix=lambda x: 2.0 * pm.math.eye(3) + 0.0 * x.sum())
    assert names["idata"].posterior["beta"].shape[2] == 3


@pytest.mark.slow
def test_cross_validation_block_runs():
    pytest.importorskip("numpyro")
    rng = np.random.default_rng(0)
    X, X_test = rng.uniform(-2, 2, size=(40, 2)), rng.uniform(-2, 2, size=(10, 2))
    y = np.column_stack([np.sin(X[:, 0]), np.cos(X[:, 1])]) + 0.1 * rng.normal(size=(40, 2))
    code = block("cross_validation").replace("num_warmup=1000, num_samples=4000", "num_warmup=100, num_samples=100")
    names = run(code, X=X, y=y, X_test=X_test)
    assert np.shape(names["means"])[:2] == (8, 10)


def test_warm_start_block_runs(tmp_path, monkeypatch):
    pytest.importorskip("blackjax")
    import warnings

    from ahmc.adapters._jax_snapshot import WarmStartWarning

    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", WarmStartWarning)  # the snapshot fits the refit
        names = run(block("warm_start"))
    assert (tmp_path / "fit.json").exists()
    assert np.asarray(names["info"].is_warmup).sum(axis=1).tolist() == [250] * 4
    assert names["samples"].shape == (4, 1000, 10)


def test_warm_start_with_data_as_arguments_block_runs():
    """The BlackJAX refit block, on a simulated logistic regression and a bootstrap resample of it: the
    warm refit is used (no fallback) and compiles no new run program (the cold fit compiled the
    1000-iteration one; the warm refit's 250-iteration one is new, and a second warm refit reuses it)."""
    pytest.importorskip("blackjax")
    import warnings

    import jax.numpy as jnp

    from ahmc.adapters import _jax_run
    from ahmc.adapters._jax_snapshot import WarmStartWarning

    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.normal(size=(300, 3)))
    y = jnp.asarray((rng.uniform(size=300) < 1 / (1 + np.exp(-np.asarray(X) @ np.array([1.0, -0.5, 0.0]))))
                    .astype(float))
    rows = rng.integers(0, 300, 300)
    code = block("warm_start_partial").replace("1000, 1000", "1000, 200").replace("250, 1000", "250, 200")
    with warnings.catch_warnings():
        warnings.simplefilter("error", WarmStartWarning)  # the snapshot fits the refit
        names = run(code, X=X, y=y, X_new=X[rows], y_new=y[rows])
        programs = _jax_run._spec_run_jit._cache_size()
        refit = code.split("# Each refit")[1].split("\n", 1)[1]
        again = run(refit, **{**names, "X_new": X[rows[::-1]], "y_new": y[rows[::-1]]})
    assert _jax_run._spec_run_jit._cache_size() == programs  # the second refit compiled nothing
    assert names["samples"].shape == again["samples"].shape == (4, 200, 3)
    assert np.asarray(names["info"].is_warmup).sum(axis=1).tolist() == [250] * 4
    assert np.all(np.abs(np.asarray(again["samples"]).mean(axis=(0, 1)) - np.asarray(names["samples"]).mean(
        axis=(0, 1))) < 0.5)


def test_warm_start_without_recompiling_block_runs(tmp_path, monkeypatch):
    """The NumPyro refit block: a cold fit's snapshot, then the block's warm refit on a bootstrap resample
    (the suite's conftest already keeps a compilation cache, so the block's cache line is left out)."""
    pytest.importorskip("numpyro")
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC

    from ahmc.adapters.numpyro import AdaptiveHMC, tuning_snapshot

    def model(X, y):
        b = numpyro.sample("b", dist.Normal(0.0, 3.0).expand([X.shape[1]]))
        numpyro.sample("y", dist.Bernoulli(logits=X @ b), obs=y)

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = (rng.uniform(size=200) < 1 / (1 + np.exp(-X @ np.array([1.0, -0.5, 0.0])))).astype(float)
    monkeypatch.chdir(tmp_path)
    cold = MCMC(AdaptiveHMC(model), num_warmup=1000, num_samples=200, num_chains=4, chain_method="vectorized",
                progress_bar=False, jit_model_args=True)
    cold.run(jax.random.key(0), jnp.asarray(X), jnp.asarray(y))
    tuning_snapshot(cold).save("snapshot.npz")
    rows = rng.integers(0, 200, 200)
    code = block("warm_start_no_recompile")
    line = 'jax.config.update("jax_compilation_cache_dir", "/path/to/cache")'
    assert line in code
    code = code.replace(line, "pass").replace("num_samples=1000", "num_samples=200")
    import warnings

    from ahmc.adapters._jax_snapshot import WarmStartWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", WarmStartWarning)  # the snapshot fits the refit
        names = run(code, MCMC=MCMC, AdaptiveHMC=AdaptiveHMC, model=model, X_new=jnp.asarray(X[rows]),
                    y_new=jnp.asarray(y[rows]))
    samples = names["mcmc"].get_samples()["b"]
    assert samples.shape == (800, 3) and np.all(np.isfinite(np.asarray(samples)))
