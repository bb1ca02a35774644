"""Tuning history from real runs (NumPyro DataTree, BlackJAX info, a PyMC-named DataTree) and the plots."""

import io
import subprocess
import sys
import textwrap

import numpy as np
import pytest

numpyro = pytest.importorskip("numpyro")
arviz_base = pytest.importorskip("arviz_base")
xr = pytest.importorskip("xarray")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

from ahmc.adapters.diagnostics import (  # noqa: E402
    config_from_numpyro,
    history_from_blackjax,
    history_from_datatree,
)
from ahmc.adapters.numpyro import AdaptiveHMC  # noqa: E402
from ahmc.core.diagnostics import (  # noqa: E402
    TuningConfig,
    arm_parameters,
    rebuild_surrogate,
    replay,
    tuning_summary,
    unrecorded_warmup_note,
)

from ..core.test_diagnostics import assert_same_tuner, simulate  # noqa: E402

Y = np.random.default_rng(0).normal(1.0, 2.0, size=40)


def model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


@pytest.fixture(scope="module")
def numpyro_run():
    """Two pooled chains, automatic box; warm-up stats kept as the `warmup_sample_stats` group."""
    mcmc = MCMC(AdaptiveHMC(model), num_warmup=200, num_samples=100, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.warmup(jax.random.key(0), Y, collect_warmup=True)
    warmup = arviz_base.from_numpyro(mcmc)
    mcmc.run(mcmc.post_warmup_state.rng_key, Y)
    tree = arviz_base.from_numpyro(mcmc)
    tree["warmup_sample_stats"] = warmup["sample_stats"]
    return mcmc, tree


def assert_matches_engine(replayed, engine_tuner):
    """Replayed (NumPy float64) tuner vs the engine's (JAX, float32 by default); ``replayed`` is what
    ``replay`` returns.  Variances are compared settled (see ``assert_same_tuner``)."""
    core, state = replayed
    state, engine_tuner = core.settle(state), core.settle(jax.tree.map(np.asarray, engine_tuner))
    np.testing.assert_array_equal(state.buffer.arm, np.asarray(engine_tuner.buffer.arm))
    np.testing.assert_array_equal(state.buffer.count, np.asarray(engine_tuner.buffer.count))
    np.testing.assert_array_equal(state.buffer.last_round, np.asarray(engine_tuner.buffer.last_round))
    np.testing.assert_allclose(state.buffer.mean_reward, np.asarray(engine_tuner.buffer.mean_reward), rtol=1e-5)
    np.testing.assert_allclose(state.grid_variance, np.asarray(engine_tuner.grid_variance), atol=1e-5)
    assert int(state.round) == int(engine_tuner.round)


def test_numpyro_history_equals_the_engine_record(numpyro_run):
    mcmc, tree = numpyro_run
    config = config_from_numpyro(mcmc)
    assert config.num_num_steps == 32  # automatic box: L columns repeat when the box has few integers
    history = history_from_datatree(tree, config=config)
    engine = mcmc.last_state.engine.tuner
    assert history.pooled and history.weight(0) == 2.0
    assert int(history.rounds.is_complete.sum()) == int(engine.round)
    assert history.rounds.round[0] == 1 and history.rounds.is_warmup.sum() == 10  # (200 - 100) / 10
    # The arms tried, as (eps, L), and their visits are the engine's buffer ...
    occupied = np.asarray(engine.buffer.count) > 0
    visits = {}
    for arm, count in zip(np.asarray(engine.buffer.arm)[occupied], np.asarray(engine.buffer.count)[occupied]):
        eps, steps = arm_parameters(config, arm)
        key = (round(eps, 4), steps)
        visits[key] = visits.get(key, 0) + count / 2
    rebuilt = {(round(e, 4), int(s)): int(n) for e, s, n in
               zip(history.arms.step_size, history.arms.num_steps, history.arms.num_rounds) if n > 0}
    assert rebuilt == visits
    # ... and the replay is the engine's tuner, grid arm by grid arm.
    assert_matches_engine(replay(history), engine)


def test_config_from_the_datatree_attribute(numpyro_run):
    mcmc, tree = numpyro_run
    config = config_from_numpyro(mcmc)
    tree.attrs["ahmc_config"] = config.to_json()
    history = history_from_datatree(tree)
    # the JAX default's estimator, "default" until the draws give the dimension (d = 10: the low-rank one)
    assert config.metric_recipe == "default"
    assert history.config == TuningConfig.parse(config.to_json())._replace(metric_recipe="fisher_low_rank")
    np.testing.assert_allclose(rebuild_surrogate(history).mean, rebuild_surrogate(history, config).mean)


def test_missing_warmup_group_is_reported(numpyro_run):
    mcmc, _ = numpyro_run
    history = history_from_datatree(arviz_base.from_numpyro(mcmc), config=config_from_numpyro(mcmc))
    assert history.rounds.round[0] > 1 and not history.warmup_known
    assert "the warm-up was not recorded" in unrecorded_warmup_note(history)
    assert "collect_warmup=True" in tuning_summary(history)


def test_blackjax_bad_box_replays_exactly_and_warns():
    pytest.importorskip("blackjax")
    from ahmc.adapters.blackjax import gpucb_adaptation

    options = {"step_size_bounds": (1e-3, 1e-2), "num_steps_bounds": (1, 4), "round_length": 5}

    def logdensity(x):
        return -0.5 * jnp.sum((x / jnp.array([1.0, 3.0])) ** 2)

    # 400 warm-up iterations (80 rounds): with fewer the GP's best arm can sit one row below the edge.
    (_, parameters), info = gpucb_adaptation(logdensity, **options).run(jax.random.key(1), jnp.ones((2, 2)), 400)
    history = history_from_blackjax(info, **options)
    assert_matches_engine(replay(history), info.tuner_state)
    assert history.chosen_step_size[0] == pytest.approx(float(parameters["step_size"]), rel=1e-5)
    assert history.chosen_num_steps[0] == int(parameters["num_integration_steps"])
    text = tuning_summary(history)
    assert "WARNING: tuning probably failed" in text and "upper step-size edge" in text
    assert "Widen the box" in text


def test_an_initial_design_spreads_the_first_arms_over_l_and_replays_exactly():
    """initial_design=3 (automatic box): GP rounds 2-4 run three arms at one step size, short to long L, and
    the replayed tuner is still the engine's."""
    pytest.importorskip("blackjax")
    from ahmc.adapters.blackjax import gpucb_adaptation

    def logdensity(x):
        return -0.5 * jnp.sum((x / jnp.array([1.0, 3.0])) ** 2)

    options = {"initial_design": 3}
    (_, _), info = gpucb_adaptation(logdensity, **options).run(jax.random.key(1), jnp.ones((2, 2)), 400)
    history = history_from_blackjax(info, **options)
    assert history.config.initial_design == 3
    assert_matches_engine(replay(history), info.tuner_state)
    trace = history.trace
    rounds, steps, eps = trace.round[0], trace.num_steps[0], trace.step_size[0]
    design = [(float(eps[rounds == r][0]), int(steps[rounds == r][0])) for r in (2, 3, 4)]
    assert len({e for e, _ in design}) == 1  # one step size: the first arm's
    lengths = [s for _, s in design]
    assert lengths == sorted(lengths) and len(set(lengths)) == 3 and lengths[2] >= 4 * lengths[0]


def test_blackjax_user_l_range_with_automatic_step_sizes_replays_exactly():
    """num_steps_bounds alone (the automatic step sizes around eps*): the diagnostics rebuild the same grid
    of arms from the run's box, so the replayed tuner is the engine's and the chosen arm is the run's."""
    pytest.importorskip("blackjax")
    from ahmc.adapters.blackjax import gpucb_adaptation

    options = {"num_steps_bounds": (2, 5), "round_length": 5}

    def logdensity(x):
        return -0.5 * jnp.sum((x / jnp.array([1.0, 3.0])) ** 2)

    (_, parameters), info = gpucb_adaptation(logdensity, **options).run(jax.random.key(2), jnp.ones((2, 2)), 400)
    assert tuple(np.asarray(info.search_box.num_steps)) == (2, 5)
    history = history_from_blackjax(info, **options)
    assert_matches_engine(replay(history), info.tuner_state)
    assert history.chosen_step_size[0] == pytest.approx(float(parameters["step_size"]), rel=1e-5)
    assert history.chosen_num_steps[0] == int(parameters["num_integration_steps"])
    assert "search box: step_size" in tuning_summary(history) and "L 2..5" in tuning_summary(history)


def pymc_like_datatree(stats, *, attrs=None, box=None):
    """A DataTree shaped like PyMC's with `discard_tuned_samples=False` (no PyMC needed)."""
    tune = stats["tune"][0]

    def dataset(select):
        variables = {name: (("chain", "draw"), value[:, select]) for name, value in stats.items()}
        shape = stats["reward"][:, select].shape + (2,)
        for name, pair in (box or {}).items():
            variables[name] = (("chain", "draw", "bound"), np.broadcast_to(pair, shape))
        return xr.Dataset(variables)

    tree = xr.DataTree.from_dict({"sample_stats": dataset(~tune), "warmup_sample_stats": dataset(tune)})
    tree.attrs.update(attrs or {})
    return tree


def test_pymc_named_datatree_equals_the_tuners_record():
    stats, _, (expected,), config = simulate(seed=4)
    history = history_from_datatree(pymc_like_datatree(stats, attrs={"ahmc_config": config.to_json()}))
    assert history.warmup_known and history.rounds.is_warmup.sum() == 25
    assert_same_tuner(replay(history), expected)
    # the box as per-draw stats (one per chain), the other settings from the attribute
    static = config._replace(step_size=None, num_steps=None).to_json()
    tree = pymc_like_datatree(stats, attrs={"ahmc_config": static},
                              box={"step_size_bounds": config.step_size, "num_steps_bounds": config.num_steps})
    assert_same_tuner(replay(history_from_datatree(tree)), expected)


def test_pymc_history_equals_the_step_record():
    pm = pytest.importorskip("pymc")
    try:
        from ahmc.adapters.pymc import AdaptiveHMC as PyMCAdaptiveHMC
    except ImportError as error:  # the adapter is optional; its framework may be missing
        pytest.skip(f"ahmc.adapters.pymc unavailable: {error}")
    with pm.Model():
        pm.Normal("x", 0.0, 1.0, shape=2)
        step = PyMCAdaptiveHMC()
        tree = pm.sample(tune=300, draws=100, chains=2, cores=1, step=step, random_seed=1, progressbar=False,
                         discard_tuned_samples=False, compute_convergence_checks=False)
    history = history_from_datatree(tree)  # the box comes from the per-draw stats, one per chain
    assert not history.pooled and history.num_tuners == 2 and history.warmup_known
    assert np.shape(history.config.step_size) == (2, 2)
    final = getattr(step, "_tuner_state", None)  # chains ran in turn on this step: it holds the last one's
    if final is None:
        pytest.skip("the PyMC step keeps no final tuner state to compare with")
    assert_same_tuner(replay(history, tuner=1), final)


def test_plots_render_headless(numpyro_run):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ahmc.adapters import plots

    mcmc, tree = numpyro_run
    history = history_from_datatree(tree, config=config_from_numpyro(mcmc))

    def png(figure):
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=50)
        plt.close(figure)
        return buffer.getvalue()

    ax = plots.plot_reward_surface(history)
    assert ax.get_xscale() == "log" and png(ax.figure).startswith(b"\x89PNG")
    top, bottom = plots.plot_surrogate_slice(history, along="num_steps")
    assert png(top.figure).startswith(b"\x89PNG")
    assert png(plots.plot_reward_surface(rebuild_surrogate(history)).figure).startswith(b"\x89PNG")
    axes = plots.plot_arm_trace(history)
    assert len(axes) == 2 and png(axes[0].figure).startswith(b"\x89PNG")
    assert png(plots.plot_adapt_probability(history).figure).startswith(b"\x89PNG")
    assert png(plots.plot_tuning(history)).startswith(b"\x89PNG")
    assert png(plots.plot_tuning(history._replace(config=None))).startswith(b"\x89PNG")  # says: no box


def test_plots_without_matplotlib_name_the_extra():
    code = textwrap.dedent(
        """
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "matplotlib":
                    raise ImportError(f"No module named {name!r} (blocked by test)")
        sys.meta_path.insert(0, Block())
        import ahmc.adapters.diagnostics  # import-light: fine without matplotlib and without JAX
        assert "jax" not in sys.modules and "matplotlib" not in sys.modules
        import ahmc.adapters.plots
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode != 0
    assert "ImportError" in result.stderr and "ahmc[plot]" in result.stderr


def test_datatree_history_reads_the_posterior_correlation(numpyro_run):
    """The summary names a strongly correlated pair of the posterior and suggests dense_mass=True,
    unless the config says the run already had it."""
    mcmc, tree = numpyro_run
    config = config_from_numpyro(mcmc)
    assert config.dense_mass is False
    weak = history_from_datatree(tree, config=config)  # mu and sigma of a normal: nearly uncorrelated
    # (other hints, e.g. about an L = 1 arm, depend on the run, not on the correlation)
    assert abs(weak.strongest_correlation[0]) < 0.5 and "Hint: posterior correlation" not in tuning_summary(weak)
    rng = np.random.default_rng(0)
    z = rng.normal(size=(2, 100, 2))
    beta = np.stack([z[..., 0], z[..., 0] + 0.1 * z[..., 1]], axis=-1)
    tree = tree.copy()
    tree["posterior"] = xr.Dataset({"beta": (("chain", "draw", "beta_dim_0"), beta),
                                    "tau": (("chain", "draw"), z[..., 1])})
    strong = history_from_datatree(tree, config=config)
    assert strong.strongest_correlation[1:] == ("beta[0]", "beta[1]")
    assert "Hint: posterior correlation +0.99 between beta[0] and beta[1]" in tuning_summary(strong)
    dense = history_from_datatree(tree, config=config._replace(dense_mass=True))
    assert "Hint: posterior correlation" not in tuning_summary(dense)


def test_inside_a_pymc_model_the_correlation_hint_skips_its_deterministics(numpyro_run):
    """pm.sample's tree does not say which variables are Deterministics: inside the model's block the
    history reads the model's free variables, so x is not paired with its own x_twice."""
    pm = pytest.importorskip("pymc")
    mcmc, tree = numpyro_run
    x = np.random.default_rng(2).normal(size=(2, 100))
    tree = tree.copy()
    tree["posterior"] = xr.Dataset({"x": (("chain", "draw"), x), "x_twice": (("chain", "draw"), 2 * x),
                                    "y": (("chain", "draw"), x[::-1])})
    config = config_from_numpyro(mcmc)
    assert "Hint: posterior correlation +1.00 between x and x_twice" in tuning_summary(
        history_from_datatree(tree, config=config))
    with pm.Model():
        pm.Normal("x")
        pm.Normal("y")
        pm.Deterministic("x_twice", 2 * pm.math.constant(1.0))
        history = history_from_datatree(tree, config=config)
    assert "x_twice" not in tuning_summary(history)


def test_plot_tuning_with_a_tuner_per_chain_names_the_chain_it_shows():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from ahmc.adapters import plots
    from ahmc.core.diagnostics import tuning_history

    rounds = np.repeat(np.arange(1, 6), 10)
    stats = {"step_size": np.stack([np.full(50, 0.1), np.full(50, 0.2)]),
             "max_steps": np.stack([np.full(50, 8), np.full(50, 5)]),
             "tuning_round": np.stack([rounds, rounds]),
             "reward": np.where(np.arange(50) % 10 == 9, 0.5, np.nan)[None].repeat(2, 0)}
    history = tuning_history(stats)
    assert history.num_tuners == 2
    figure = plots.plot_tuning(history, tuner=1)
    assert "chain 1's" in figure.get_suptitle()


def test_slowest_square_finds_a_chain_that_flips_the_sign_and_the_summary_says_so(numpyro_run):
    """Draws x' = -0.95 x + noise: the coordinate mixes well (negative autocorrelation), its square badly."""
    from ahmc.adapters.diagnostics import slowest_square

    rng = np.random.default_rng(1)
    flips = np.zeros((2, 1000, 3))
    flips[:, 0] = rng.normal(size=(2, 3))
    for t in range(1, 1000):
        flips[:, t] = -0.95 * flips[:, t - 1] + np.sqrt(1 - 0.95**2) * rng.normal(size=(2, 3))
    draws = np.concatenate([rng.normal(size=(2, 1000, 1)), np.ones((2, 1000, 1)), flips], axis=-1)
    ess_square, name, ess_coordinates, num_draws = slowest_square(draws, ["iid", "const", "a", "b", "c"])
    assert name in ("a", "b", "c") and num_draws == 2000
    assert ess_square < 200 < 1000 < ess_coordinates  # about 0.05 N for the squares, about N and more for x
    iid = slowest_square(rng.normal(size=(2, 1000, 3)))
    assert iid[0] > 1000 and iid[1].startswith("x[")
    mcmc, tree = numpyro_run
    tree = tree.copy()
    tree["posterior"] = xr.Dataset({"theta": (("chain", "draw", "theta_dim_0"), flips)})
    summary = tuning_summary(history_from_datatree(tree, config=config_from_numpyro(mcmc)))
    assert "Hint: the squares mix far more slowly" in summary and "(theta[" in summary


def test_worst_rhat_names_the_coordinate_whose_chains_disagree_and_the_summary_warns(numpyro_run):
    from ahmc.adapters.diagnostics import worst_rhat

    rng = np.random.default_rng(3)
    iid = worst_rhat(rng.normal(size=(4, 1000, 13)))
    assert iid[0] < 1.005 and iid[2] == 4  # 200 such draws: max 1.0032
    apart = rng.normal(size=(4, 1000, 3))
    apart[1, :, 2] += 0.5  # one chain sits half an sd off in "c"
    rhat, name, num_chains = worst_rhat(apart, ["a", "b", "c"])
    assert name == "c" and rhat > 1.02 and num_chains == 4
    stuck = np.zeros((2, 100, 2))
    stuck[:, :, 0] = rng.normal(size=(2, 100))
    stuck[1, :, 1] = 1.0  # each chain constant in x[1], at different values
    assert worst_rhat(stuck)[1] == "x[1]" and worst_rhat(stuck)[0] > 100
    assert worst_rhat(rng.normal(size=(1, 100, 2))) is None  # one chain: nothing to compare
    mcmc, tree = numpyro_run
    tree = tree.copy()
    tree["posterior"] = xr.Dataset({"theta": (("chain", "draw", "theta_dim_0"), apart)})
    summary = tuning_summary(history_from_datatree(tree, config=config_from_numpyro(mcmc)))
    assert "R-hat" in summary and "for theta[2] over 4 chains" in summary


@pytest.mark.slow  # ~20 s; the DataTree test above keeps the correlation hint in the default run
def test_blackjax_history_reads_the_correlation_of_the_samples():
    pytest.importorskip("blackjax")
    from ahmc.adapters.blackjax import run_chains

    cov = jnp.array([[1.0, 0.95], [0.95, 1.0]])
    precision = jnp.linalg.inv(cov)

    def logdensity(x):
        return -0.5 * x @ precision @ x

    options = {"round_length": 5}
    samples, info = run_chains(jax.random.key(2), logdensity, jnp.zeros((2, 2)), 200, 200, **options)
    history = history_from_blackjax(info, search_box=None, samples=samples, **options)
    r, a, b = history.strongest_correlation
    assert (a, b) == ("x[0]", "x[1]") and r == pytest.approx(0.95, abs=0.04)
    assert history.slowest_square[1] in ("x[0]", "x[1]") and history.slowest_square[3] == 400
    assert history_from_blackjax(info, **options).strongest_correlation is None


def test_riemannian_runs_get_no_mass_matrix_hint():
    from ahmc.adapters.diagnostics import _riemannian

    steps = np.array([[3, 1, 2]])
    assert not _riemannian({"n_steps": steps})  # PyMC / NumPyro HMC: no solver stat
    assert _riemannian({"fixed_point_converged": np.ones_like(steps, bool)})  # PyMC / NumPyro RMHMC
    engine = {"fixed_point_converged": np.ones_like(steps, bool), "num_integration_steps": steps}
    assert not _riemannian({**engine, "num_gradient_evals": steps})  # JAX engine, HMC
    assert _riemannian({**engine, "num_gradient_evals": 5 * steps})  # JAX engine, RMHMC (metric evaluations)


def test_the_jax_config_records_its_metric_and_the_hint_follows_it():
    """config_from_engine records the estimator; the JAX default ("default") resolves by the draws' dimension,
    and a low-rank run gets no dense_mass suggestion for a strong correlation (its metric learns those)."""
    from ahmc.adapters.diagnostics import _with_draws, config_from_engine
    from ahmc.core.diagnostics import tuning_history

    box = ((0.1, 1.0), (1, 10))
    assert config_from_engine(box).metric_recipe == "default"
    assert config_from_engine(box, metric_recipe="welford_diag").metric_recipe == "welford_diag"
    assert config_from_engine(box, dense_mass=True).metric_recipe == "welford_dense"
    stats, _, _, _ = simulate()
    history = tuning_history(stats, config=config_from_engine(box))
    rng = np.random.default_rng(0)
    for dim, recipe in ((3, "fisher_low_rank"), (201, "welford_diag")):
        z = rng.normal(size=(2, 200, dim))
        z[..., 1] = z[..., 0] + 0.1 * z[..., 1]  # correlation 0.995
        resolved = _with_draws(history, stats, (z, [f"x[{i}]" for i in range(dim)]))
        assert resolved.config.metric_recipe == recipe
        summary = tuning_summary(resolved)
        assert "Hint: posterior correlation" in summary
        assert ('dense_mass="auto"' in summary) == (recipe == "welford_diag"), summary
