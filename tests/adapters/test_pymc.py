"""AdaptiveHMC as a PyMC step method: correctness, plumbing, stats and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

pm = pytest.importorskip("pymc")

from pymc.exceptions import SamplingError  # noqa: E402

from ahmc.adapters.pymc import STATS, AdaptiveHMC, PooledAdaptiveHMC  # noqa: E402
from ahmc.core.space import NUM_STEPS_CAP, WARMUP_MAX_STEPS, grid_num_steps  # noqa: E402
from tests.conventions.pymc_models import posteriordb_model  # noqa: E402
from tests.reference import _mean_and_mcse, assert_moments_match, assert_reference_match, load_reference  # noqa: E402

SCALES = np.array([1.0, 10.0, 0.1, 5.0, 2.0, 0.5])


def gaussian_model():
    with pm.Model() as model:
        pm.Normal("x", 0.0, SCALES, shape=len(SCALES))
    return model


def reference_model(name):
    """PyMC versions of the posteriordb Stan programs (tests/conventions/pymc_models.py, which also checks
    every one of them against its reference)."""
    return posteriordb_model(name)


def sample(model, *, step_kwargs=None, **kwargs):
    options = dict(tune=300, draws=300, chains=2, cores=1, random_seed=1, progressbar=False,
                   compute_convergence_checks=False)
    options.update(kwargs)
    with model:
        step_kwargs = dict(step_kwargs or {})
        step_class = PooledAdaptiveHMC if step_kwargs.pop("pooled", False) else AdaptiveHMC
        return pm.sample(step=step_class(**step_kwargs), **options)


# ---- correctness ---------------------------------------------------------------------------

# Four chains: with two chains of 1000 draws, split R-hat < 1.01 fails about once in ten
# seeds on the second moment (its ESS is ~500: short antithetic trajectories), not on bias.
CORRECTNESS = dict(tune=1000, draws=1000, chains=4, cores=2)


def test_gaussian_moments():
    idata = sample(gaussian_model(), random_seed=11, **CORRECTNESS)
    assert_moments_match(idata.posterior["x"].values, np.zeros(len(SCALES)), SCALES)


def test_upper_half_jitter_moments_and_step_counts():
    """min_steps_fraction=0.5: n_steps uniform on {ceil(L/2)..L} in tune and draws; the target is unchanged."""
    idata = sample(gaussian_model(), random_seed=12, discard_tuned_samples=False,
                   step_kwargs=dict(min_steps_fraction=0.5), **CORRECTNESS)
    assert_moments_match(idata.posterior["x"].values, np.zeros(len(SCALES)), SCALES)
    for stats in (idata.warmup_sample_stats, idata.sample_stats):
        first_try = ~stats["retried"].values  # a retry takes (divergence_retry + 2) x the first try's steps
        taken, arm = stats["n_steps"].values[first_try], stats["max_steps"].values[first_try]
        lowest = np.ceil(arm / 2)
        assert np.all((taken >= lowest) & (taken <= arm)) and np.any(taken == lowest)


def test_esjd_moments_objective_moments_and_rewards():
    """objective="esjd_moments" (squares centred on the mass-matrix window's mean): the target is unchanged
    away from the origin, and every round's reward is finite and non-negative, and positive in most rounds
    (a round of ten rejected proposals, e.g. at L = 1 with a large exploratory eps, has jumped nowhere)."""
    means = np.array([30.0, -5.0, 0.0, 12.0, 3.0, -1.0])
    with pm.Model() as model:
        pm.Normal("x", means, SCALES, shape=len(SCALES))
    idata = sample(model, random_seed=13, step_kwargs=dict(objective="esjd_moments"), **CORRECTNESS)
    assert_moments_match(idata.posterior["x"].values, means, SCALES)
    rewards = idata.sample_stats["reward"].values
    ended = ~np.isnan(rewards)
    assert ended.sum() > 100 and np.all(np.isfinite(rewards[ended])) and np.all(rewards[ended] >= 0)
    assert np.mean(rewards[ended] > 0) > 0.9


def test_dense_mass_whitens_a_correlated_gaussian():
    """dense_mass=True: PyMC's dense adaptation learns correlations up to 0.99 and scales 0.1-10, so the
    tuner works at a whitened-scale step size; draws agree with the truth; esjd_moments runs with it."""
    correlation = 0.99 ** np.abs(np.subtract.outer(np.arange(5), np.arange(5)))
    scales = np.logspace(-1, 1, 5)
    mean = np.array([3.0, -1.0, 0.5, 10.0, -4.0])
    with pm.Model() as model:
        pm.MvNormal("x", mean, cov=correlation * np.outer(scales, scales))
    idata = sample(model, random_seed=17, step_kwargs=dict(dense_mass=True), **CORRECTNESS)
    assert_moments_match(idata.posterior["x"].values, mean, scales)
    # The diagonal mass matrix needs eps ~ 0.1 here (the narrow direction's sd ~ sqrt(1 - 0.99)).
    assert np.median(idata.sample_stats["step_size"].values) > 0.4
    moments = sample(model, random_seed=18, step_kwargs=dict(dense_mass=True, objective="esjd_moments"),
                     tune=600, draws=300)
    rewards = moments.sample_stats["reward"].values
    rewards = rewards[~np.isnan(rewards)]
    # A round whose proposals were all rejected scores 0 (seen on 2026-11-29's machine: 1 of 60 rounds).
    assert np.all(rewards >= 0) and np.mean(rewards > 0) > 0.9
    assert np.median(moments.sample_stats["step_size"].values) > 0.4


@pytest.mark.parametrize("correlated", [True, False])
def test_dense_mass_auto_keeps_correlations_only_where_they_stand_out(correlated):
    """dense_mass="auto": Stan's windows over one chain's 900 draws keep the dense estimate for
    correlations 0.9^|i-j| and only its diagonal for independent coordinates (the same variances)."""
    from ahmc.adapters.pymc._step import _WarmupFullAdapt

    dim, rng = 6, np.random.default_rng(20 + correlated)
    scales = np.logspace(-1, 1, dim)
    correlation = 0.9 ** np.abs(np.subtract.outer(np.arange(dim), np.arange(dim))) if correlated else np.eye(dim)
    covariance = correlation * np.outer(scales, scales)
    potential = _WarmupFullAdapt(dim, np.zeros(dim), np.eye(dim), 10, rng=rng, auto=True)
    potential.set_warmup(900)
    potential.reset()
    for draw in rng.multivariate_normal(np.zeros(dim), covariance, size=900):
        potential.update(draw, None, True)
    assert potential.kept_correlations == correlated  # the sample stat dense_mass_matrix
    learned = potential._cov
    off_diagonal = np.abs(learned[~np.eye(dim, dtype=bool)]).max() / np.diag(learned).max()
    np.testing.assert_allclose(np.diag(learned), scales**2, rtol=0.3)
    if correlated:
        assert off_diagonal > 0.1
        np.testing.assert_allclose(learned, covariance, rtol=0.5, atol=0.15 * scales.max() ** 2)
    else:
        assert off_diagonal == 0.0


def test_dense_mass_auto_samples_a_correlated_gaussian():
    """Through pm.sample (2 processes): "auto" keeps the dense matrix for correlations up to 0.99, so the
    tuner works at a whitened-scale step size; draws agree with the truth."""
    correlation = 0.99 ** np.abs(np.subtract.outer(np.arange(4), np.arange(4)))
    scales = np.logspace(-1, 1, 4)
    with pm.Model() as model:
        pm.MvNormal("x", np.zeros(4), cov=correlation * np.outer(scales, scales))
    idata = sample(model, random_seed=21, step_kwargs=dict(dense_mass="auto"), **CORRECTNESS)
    assert_moments_match(idata.posterior["x"].values, np.zeros(4), scales)
    assert np.median(idata.sample_stats["step_size"].values) > 0.4
    assert idata.sample_stats["dense_mass_matrix"].values.all()  # every chain kept the correlations


def test_dense_mass_spends_most_of_tune_on_the_metric():
    """One chain's dense estimate needs the draws: with dense_mass=True the GP rounds start after 90% of
    tune (DENSE_METRIC_FRACTION), with the diagonal after half; an explicit metric_fraction wins."""
    with pm.Model() as model:
        pm.Normal("x", 0.0, 1.0, shape=2)
    for kwargs, first_round in ((dict(dense_mass=True), 180), (dict(), 100),
                                (dict(dense_mass=True, metric_fraction=0.5), 100)):
        idata = sample(model, tune=200, draws=10, chains=1, step_kwargs=kwargs, discard_tuned_samples=False)
        rounds = idata.warmup_sample_stats["tuning_round"].values[0]
        assert np.flatnonzero(rounds > 0)[0] == first_round, kwargs


def test_stan_windows_match_stans_schedule():
    from ahmc.adapters.pymc._step import stan_windows

    # Stan, 1000 warm-up: buffer 75, windows 25/50/100/200/500 (the last stretched), terminal 50.
    assert stan_windows(1000) == (75, (100, 150, 250, 450, 950))
    assert stan_windows(500) == (75, (100, 150, 250, 450))
    assert stan_windows(100) == (15, (90,))  # short: 15% / 75% / 10%
    assert stan_windows(0) == (0, ())


def test_dense_mass_with_more_dimensions_than_the_first_window_has_draws():
    """40 dimensions, scales 0.1-10: one chain's 25-draw first window is rank-deficient; the estimate
    must not freeze the directions it missed (it did with Stan's shrinkage alone: a 1000-fold miss)."""
    scales = np.logspace(-1, 1, 40)
    with pm.Model() as model:
        pm.Normal("x", 0.0, scales, shape=40)
    idata = sample(model, random_seed=19, step_kwargs=dict(dense_mass=True), **CORRECTNESS)
    assert_moments_match(idata.posterior["x"].values, np.zeros(40), scales)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10))
def test_gaussian_moments_many_seeds(seed):
    idata = sample(gaussian_model(), random_seed=100 + seed, **{**CORRECTNESS, "draws": 2000})
    assert_moments_match(idata.posterior["x"].values, np.zeros(len(SCALES)), SCALES)


# ---- plumbing ------------------------------------------------------------------------------

def test_multiprocessing_chains():
    idata = sample(gaussian_model(), tune=200, draws=100, chains=2, cores=2)
    x = idata.posterior["x"].values
    assert x.shape == (2, 100, len(SCALES)) and np.all(np.isfinite(x))
    assert not np.array_equal(x[0], x[1])
    assert (idata.sample_stats["tuning_round"].values > 0).all()


def test_random_seed_reproduces_draws():
    first = sample(gaussian_model(), tune=100, draws=100, random_seed=5)
    second = sample(gaussian_model(), tune=100, draws=100, random_seed=5)
    other = sample(gaussian_model(), tune=100, draws=100, random_seed=6)
    np.testing.assert_array_equal(first.posterior["x"].values, second.posterior["x"].values)
    np.testing.assert_array_equal(first.sample_stats["reward"].values, second.sample_stats["reward"].values)
    assert not np.array_equal(first.posterior["x"].values, other.posterior["x"].values)


@pytest.mark.slow  # tests/conventions/test_pymc.py's coal-mining compound step runs by default
def test_compound_step_with_discrete_variable():
    """AdaptiveHMC for x beside Metropolis for k samples the exact joint posterior.

    x ~ N(0, I_2), k ~ Bernoulli(0.3), y_i ~ N(x_1 + x_2 + k, 1).  With s = x_1 + x_2 ~ N(0, 2) the
    marginal of y given k is N(k 1, 2 11^T + I), which gives P(k = 1 | y) in closed form, and
    s | k, y is normal with precision 1/2 + n and mean (sum(y) - n k) / (1/2 + n).
    """
    observed = np.array([0.5, 1.5])
    with pm.Model():
        x = pm.Normal("x", 0, 1, shape=2)
        k = pm.Bernoulli("k", 0.3)
        pm.Normal("y", x.sum() + k, 1, observed=observed)
        idata = pm.sample(step=[AdaptiveHMC(vars=[x]), pm.Metropolis(vars=[k])], tune=500, draws=1500, chains=2,
                          cores=1, random_seed=2, progressbar=False, compute_convergence_checks=False)
    assert idata.posterior["k"].values.dtype.kind == "i"
    assert set(np.unique(idata.posterior["k"].values)) <= {0, 1}
    assert "reward" in idata.sample_stats and "max_steps" in idata.sample_stats

    n = len(observed)
    covariance = 2.0 * np.ones((n, n)) + np.eye(n)
    log_likelihood = [-0.5 * (observed - kk) @ np.linalg.solve(covariance, observed - kk) for kk in (0, 1)]
    log_odds = math.log(0.3 / 0.7) + log_likelihood[1] - log_likelihood[0]
    p_one = 1.0 / (1.0 + math.exp(-log_odds))
    s_mean_given_k = [(observed.sum() - n * kk) / (0.5 + n) for kk in (0, 1)]
    s_mean = (1 - p_one) * s_mean_given_k[0] + p_one * s_mean_given_k[1]
    draws = np.stack([idata.posterior["k"].values.astype(float), idata.posterior["x"].values.sum(-1)], axis=-1)
    truth = np.array([p_one, s_mean])
    mean, mcse, effective = _mean_and_mcse(draws)
    assert np.all(effective > 100), effective  # Metropolis on k mixes slowly; the z-scores need a fair ESS
    z = (mean - truth) / mcse
    assert np.all(np.abs(z) < 4.5), (mean, truth, z)


def _count_model_calls(step):
    """Wrap the step integrator's compiled log density and gradient with a call counter."""
    calls = [0]
    func = step.integrator._logp_dlogp_func

    def counted(*args):
        calls[0] += 1
        return func(*args)

    step.integrator._logp_dlogp_func = counted
    return calls


def test_each_trajectory_starts_from_the_density_the_last_one_left():
    """PyMC's BaseHMC evaluates the density and gradient again at every trajectory's start; the
    step reuses the previous iteration's (its accepted end, or its start): the same draws with one
    model call fewer per iteration, except at each chain's first."""
    draws, calls = {}, {}
    for reuse in (True, False):
        with gaussian_model():
            step = AdaptiveHMC()
        step.integrator.reuse = reuse
        calls[reuse] = _count_model_calls(step)
        idata = pm.sample(step=step, tune=100, draws=100, chains=2, cores=1, random_seed=4, progressbar=False,
                          compute_convergence_checks=False, discard_tuned_samples=False, model=step._model)
        draws[reuse] = idata.posterior["x"].values
        steps = int(idata.warmup_sample_stats["n_steps"].sum() + idata.sample_stats["n_steps"].sum())
        assert calls[reuse][0] == steps + (2 if reuse else 400)  # 2 chains x 200 iterations
    np.testing.assert_array_equal(draws[True], draws[False])


def test_a_compound_step_evaluates_every_start():
    """Another step may move a variable the density depends on while this step's position stays."""
    with pm.Model():
        x = pm.Normal("x", 0, 1, shape=2)
        k = pm.Bernoulli("k", 0.5)
        pm.Normal("y", x.sum() + 3 * k, 1, observed=[0.5, 1.5])
        step = AdaptiveHMC(vars=[x])
        calls = _count_model_calls(step)
        idata = pm.sample(step=[step, pm.BinaryGibbsMetropolis(vars=[k])], tune=50, draws=50, chains=1,
                          random_seed=2, progressbar=False, compute_convergence_checks=False,
                          discard_tuned_samples=False)
    assert not step.integrator.reuse
    steps = int(idata.warmup_sample_stats["n_steps"].sum() + idata.sample_stats["n_steps"].sum())
    assert calls[0] == steps + 100


@pytest.mark.parametrize("dense_mass, pooled", [(False, False), (True, False), (False, True)])
def test_each_chain_gets_a_fresh_tuner_and_state_round_trips(dense_mass, pooled):
    model = gaussian_model()
    with model:
        step = (PooledAdaptiveHMC if pooled else AdaptiveHMC)(round_length=5, dense_mass=dense_mass)
    point = model.initial_point()
    step.setup_chain(np.random.default_rng(0), tune=40, draws=20)
    for _ in range(30):  # past warm-up, into the GP rounds
        point, _ = step.step(point)
    saved, saved_point = step.sampling_state, point
    run = []
    for _ in range(15):
        point, stats = step.step(point)
        run.append((point["x"].copy(), stats[0]["reward"], stats[0]["step_size"]))
    step.sampling_state = saved
    point = saved_point
    for expected in run:
        point, stats = step.step(point)
        np.testing.assert_array_equal(point["x"], expected[0])
        np.testing.assert_equal((stats[0]["reward"], stats[0]["step_size"]), expected[1:])
    step.setup_chain(np.random.default_rng(1), tune=40, draws=20)  # the next chain starts afresh
    assert step._tuner_state is None and step._chain_iteration == 0


def test_interrupt_keeps_draws():
    def stop(trace, draw):
        if draw.draw_idx == 150:
            raise KeyboardInterrupt

    idata = sample(gaussian_model(), tune=100, draws=200, chains=1, callback=stop)
    assert 0 < idata.posterior.sizes["draw"] < 200


# ---- stats ---------------------------------------------------------------------------------

def test_stats_declared_and_tuning_history_rebuilds():
    round_length, tune = 10, 300
    idata = sample(gaussian_model(), tune=tune, draws=200, discard_tuned_samples=False,
                   step_kwargs=dict(round_length=round_length))
    stats = idata.sample_stats
    for name, dtype, shape, _ in STATS:
        if name == "warning":
            continue
        name = {"model_logp": "lp"}.get(name, name)  # PyMC's DataTree renames it
        assert name in stats, name
        assert stats[name].dtype == np.dtype(dtype), name
    warm = idata.warmup_sample_stats
    tuning_round = np.concatenate([warm["tuning_round"].values, stats["tuning_round"].values], axis=1)
    reward = np.concatenate([warm["reward"].values, stats["reward"].values], axis=1)
    step_size = np.concatenate([warm["step_size"].values, stats["step_size"].values], axis=1)
    max_steps = np.concatenate([warm["max_steps"].values, stats["max_steps"].values], axis=1)
    changed = np.concatenate([warm["arm_changed"].values, stats["arm_changed"].values], axis=1)
    for chain in range(2):
        rounds = tuning_round[chain]
        num_warmup = int((rounds == 0).sum())
        assert num_warmup == 150  # 0.5 * 300, rounded so that the rounds end with tune
        ends = np.flatnonzero(np.isfinite(reward[chain]))
        np.testing.assert_array_equal(ends, np.arange(num_warmup + round_length - 1, 500, round_length))
        np.testing.assert_array_equal(rounds[num_warmup:], 1 + np.arange(500 - num_warmup) // round_length)
        # The arm only moves after a round's last iteration, and arm_changed says when (a move between two
        # of the automatic box's columns that run the same L, or after the last iteration, does not show).
        arm = step_size[chain, num_warmup:], max_steps[chain, num_warmup:]
        moves = np.flatnonzero((np.diff(arm[0]) != 0) | (np.diff(arm[1]) != 0)) + num_warmup
        assert set(moves) <= set(np.flatnonzero(changed[chain][:-1])) <= set(ends)
        assert len(moves) > 0
    # The automatic box's L columns, as in the JAX routes: 32, log-spaced from 1 to the box's top.
    assert np.all(stats["num_num_steps"].values == 32) and np.all(stats["log_num_steps"].values)
    for chain in range(2):
        top = int(stats["max_steps_max"].values[chain, -1])
        columns = grid_num_steps(np.linspace(0.0, 1.0, 32), 1, top, log=True)
        assert np.isin(stats["max_steps"].values[chain], columns).all()
    p_tune = warm["adapt_probability"].values[:, 150:]
    assert np.all(p_tune == 1.0) and np.all(stats["adapt_probability"].values[:, 10:] < 1.0)
    assert np.isnan(warm["adapt_probability"].values[:, :150]).all()
    box = stats["step_size_min"].values, stats["step_size_max"].values
    assert np.all(box[0] <= stats["step_size"].values)
    assert np.all(stats["step_size"].values <= box[1])
    first_try = ~stats["retried"].values  # a retry takes (divergence_retry + 2) x the first try's steps
    assert np.all(1 <= stats["n_steps"].values)
    assert np.all(stats["n_steps"].values[first_try] <= stats["max_steps"].values[first_try])


def test_num_steps_bounds_alone_fixes_l_and_keeps_the_automatic_step_sizes():
    """The L range the user gives, around the step size dual averaging found (the box eps* x (0.5, 2))."""
    idata = sample(gaussian_model(), step_kwargs=dict(num_steps_bounds=(2, 5)))
    stats = idata.sample_stats
    assert np.all(stats["max_steps_min"].values == 2) and np.all(stats["max_steps_max"].values == 5)
    assert np.all(stats["num_num_steps"].values == 0)  # a given L range: every integer, no columns
    assert np.all((2 <= stats["max_steps"].values) & (stats["max_steps"].values <= 5))
    lo, hi = stats["step_size_min"].values, stats["step_size_max"].values
    np.testing.assert_allclose(hi / lo, 4.0)
    assert np.all((lo <= stats["step_size"].values) & (stats["step_size"].values <= hi))


def test_divergence_penalty_scales_the_first_round_reward():
    """Same seed, no mass-matrix adaptation: the first round's draws agree, its reward is the paper reward x exp(-10 f)."""
    rewards, divergent = {}, {}
    for penalty in (0.0, 10.0):
        idata = sample(gaussian_model(), tune=20, draws=0, chains=1, discard_tuned_samples=False,
                       step_kwargs=dict(step_size_bounds=(0.22, 0.26), num_steps_bounds=(2, 8), round_length=10,
                                        adapt_mass_matrix=False, divergence_penalty=penalty))
        warm = idata.warmup_sample_stats
        rewards[penalty] = warm["reward"].values[0, :10]
        # the penalty counts the first tries' divergences, a retry's rescue included
        divergent[penalty] = (warm["diverging"].values | warm["retried"].values)[0, :10]
    np.testing.assert_array_equal(divergent[0.0], divergent[10.0])
    fraction = divergent[0.0].mean()
    assert 0 < fraction < 1  # the 0.1-scale coordinate is unstable at eps > 0.2 for some leapfrog counts
    assert np.isnan(rewards[0.0][:9]).all() and np.isfinite(rewards[0.0][9])
    np.testing.assert_allclose(rewards[10.0][9], rewards[0.0][9] * np.exp(-10.0 * fraction), rtol=1e-10)


def test_blown_up_trajectory_stops_before_overflow():
    """At eps = 1 the 0.1-scale coordinate's leapfrog multiplies the energy ~1e4-fold per step: past
    1e50 within about 13 steps, float64's overflow within about 80.  The step stops at the former (a
    divergence either way), so it spends a dozen gradients, not up to L = 100, and never integrates on
    into overflow (no NumPy RuntimeWarning)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        idata = sample(gaussian_model(), tune=20, draws=0, chains=1, discard_tuned_samples=False,
                       step_kwargs=dict(step_size_bounds=(1.0, 1.2), num_steps_bounds=(80, 100), round_length=10,
                                        adapt_mass_matrix=False, divergence_retry=None))
    warm = idata.warmup_sample_stats
    assert warm["diverging"].values.all()
    assert warm["max_steps"].values.min() >= 80 and warm["n_steps"].values.max() <= 20
    assert np.isfinite(warm["reward"].values[0, [9, 19]]).all()


def test_overflow_in_one_step_is_a_divergence_without_numpy_warnings():
    """At eps >= 3 the first step sends log(sigma) so far that the next momentum overflows at once.
    Each such iteration is a divergence that stops there, with no NumPy RuntimeWarning on the way."""
    import warnings

    y = np.random.default_rng(0).normal(size=50)
    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma", 10)
        pm.Normal("y", 0, sigma, observed=y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        idata = sample(model, tune=20, draws=0, chains=1, discard_tuned_samples=False,
                       step_kwargs=dict(step_size_bounds=(3.0, 4.0), num_steps_bounds=(5, 10), round_length=10,
                                        adapt_mass_matrix=False, divergence_retry=None))
    warm = idata.warmup_sample_stats
    assert warm["diverging"].values.all() and (warm["n_steps"].values < warm["max_steps"].values).all()


def test_user_objective_gets_arrays_and_matches_the_builtin_reward():
    """A built-in objective reads the round's sums in Python numbers, a user callable gets arrays
    (round_init's dtypes); the same reward gives the same rewards, arms and draws."""
    from ahmc.core.objectives import normalized_esjd

    seen = []

    def user_reward(stats, max_num_steps):
        seen.append({type(v) for v in stats} | {np.asarray(v).dtype.name for v in stats})
        return normalized_esjd(stats, max_num_steps)

    runs = {}
    for objective in ("normalized_esjd", user_reward):
        runs[objective is user_reward] = sample(gaussian_model(), tune=150, draws=50, chains=1,
                                                step_kwargs=dict(objective=objective))
    assert seen and all(kinds == {np.ndarray, "int32", "float64"} for kinds in seen)
    builtin, user = (runs[False].sample_stats, runs[True].sample_stats)
    assert np.isfinite(builtin["reward"].values).sum() == 5  # one per round of the 50 draws
    np.testing.assert_allclose(user["reward"].values, builtin["reward"].values, rtol=1e-12)
    np.testing.assert_array_equal(runs[True].posterior["x"].values, runs[False].posterior["x"].values)


def test_trajectory_values_weight_each_steps_whitened_jump_by_its_acceptance():
    """jump_estimate="trajectory": per leapfrog step, min(1, exp(-energy error)) x the squared jump from the
    start in units of the mass matrix's standard deviations; 0 after the trajectory stopped early."""
    from pymc.blocking import DictToArrayBijection

    variances = SCALES**2 * np.array([1.0, 0.5, 2.0, 1.0, 4.0, 1.0])  # not the posterior's: acceptance < 1
    with gaussian_model():
        step = AdaptiveHMC()
    potential = step.potential  # the adapted diagonal, as after a metric window
    potential._var[:] = variances
    potential._stds[:] = np.sqrt(variances)
    potential._inv_stds[:] = 1 / potential._stds
    q0 = DictToArrayBijection.map({"x": np.array([0.5, -3.0, 0.02, 1.0, -0.4, 0.3])})
    p0 = potential.random()
    start = step.integrator.compute_state(q0, p0)
    states, state = [], start
    for _ in range(3):
        state = step.integrator.step(0.9, state)
        states.append(state)
    values = step._trajectory_values(start, states, 5)
    expected = [min(1.0, math.exp(-(s.energy - start.energy))) * np.sum(((s.q.data - q0.data) / np.sqrt(variances)) ** 2)
                for s in states]
    np.testing.assert_allclose(values[:3], expected, rtol=1e-12)
    np.testing.assert_array_equal(values[3:], 0.0)
    assert 0 < min(values[:3]) and any(math.exp(-(s.energy - start.energy)) < 0.999 for s in states)


def test_jump_estimates_give_different_rewards_from_the_same_first_round():
    """Both estimates run; the first round's draws are the same (the arm has not moved) and its rewards
    differ (the trajectory estimate is not the made jumps)."""
    runs = {estimate: sample(gaussian_model(), tune=20, draws=0, chains=1, discard_tuned_samples=False,
                             step_kwargs=dict(step_size_bounds=(0.15, 0.2), num_steps_bounds=(2, 8),
                                              adapt_mass_matrix=False, jump_estimate=estimate))
            for estimate in ("trajectory", "transition")}
    first = {k: v.warmup_posterior["x"].values[0, :10] for k, v in runs.items()}
    np.testing.assert_array_equal(first["trajectory"], first["transition"])
    rewards = {k: v.warmup_sample_stats["reward"].values[0, 9] for k, v in runs.items()}
    assert np.isfinite(list(rewards.values())).all() and rewards["trajectory"] != rewards["transition"]


def test_freeze_after_tune_keeps_the_arm_during_draws():
    idata = sample(gaussian_model(), tune=200, draws=200, step_kwargs=dict(freeze_after="tune"))
    stats = idata.sample_stats
    for name in ("step_size", "max_steps"):
        assert (stats[name].values == stats[name].values[:, :1]).all()
    assert not stats["arm_changed"].values.any()
    assert (stats["adapt_probability"].values == 0).all()


def test_paper_preset_fixed_box_and_metric():
    idata = sample(gaussian_model(), tune=200, draws=100, chains=1,
                   step_kwargs=dict(step_size_bounds=(0.01, 0.5), num_steps_bounds=(1, 30),
                                    adapt_mass_matrix=False), discard_tuned_samples=False)
    warm = idata.warmup_sample_stats
    assert (warm["tuning_round"].values > 0).all()  # no warm-up phase: GP rounds from the first iteration
    assert (warm["step_size_min"].values == 0.01).all() and (warm["max_steps_max"].values == 30).all()


def test_automatic_box_reaches_long_trajectories():
    """Correlation 0.9999 under a diagonal metric forces eps* ~ 0.01: the box's L reaches
    ceil(4 pi / eps*) beyond the former cap of 256 (NUTS's default allows 1023 steps), warm-up's
    L stays within WARMUP_MAX_STEPS, and a given num_steps_cap bounds the box."""
    with pm.Model() as model:
        pm.MvNormal("x", np.zeros(2), np.array([[1.0, 0.9999], [0.9999, 1.0]]))
    for cap, random_seed in ((None, 3), (64, 4)):
        idata = sample(model, tune=200, draws=10, chains=1, random_seed=random_seed, discard_tuned_samples=False,
                       step_kwargs={} if cap is None else dict(num_steps_cap=cap))
        stats = idata.sample_stats
        eps_star, l_hi = float(stats["step_size_bar"].values[0, -1]), int(stats["max_steps_max"].values[0, -1])
        if cap is None:
            assert l_hi == min(math.ceil(4 * math.pi / eps_star), NUM_STEPS_CAP) and l_hi > 256
        else:
            assert l_hi == cap
        metric_phase = idata.warmup_sample_stats["max_steps"].values[0, :100]
        assert metric_phase.max() <= min(cap or NUM_STEPS_CAP, WARMUP_MAX_STEPS)


# ---- bad input -----------------------------------------------------------------------------

def test_discrete_variable_is_refused_with_a_hint():
    with pm.Model():
        pm.Normal("x", 0, 1)
        k = pm.Poisson("k", 3)
        with pytest.raises(ValueError, match=r"discrete.*\['k'\].*Metropolis"):
            AdaptiveHMC(vars=[k])


@pytest.mark.parametrize("kwargs, match", [
    (dict(step_size_bounds=(0.5, 0.1)), "reversed"),
    (dict(num_steps_bounds=(20, 2)), "reversed"),
    (dict(objective="bogus"), "objective"),
    (dict(divergence_penalty=-1.0), "divergence_penalty must be a finite number >= 0"),
    (dict(schedule="linear"), "schedule"),
    (dict(round_length=0), "round_length"),
    (dict(freeze_after="never"), "freeze_after"),
    (dict(lengthscale=-1.0), "lengthscale"),
    (dict(min_steps_fraction=1.5), r"min_steps_fraction must be a number in \[0, 1\]"),
    (dict(objective="esjd_moments", adapt_mass_matrix=False), "esjd_moments.*adapted mass matrix"),
    (dict(dense_mass=True, adapt_mass_matrix=False), "dense_mass=True .* needs adapt_mass_matrix=True"),
    (dict(dense_mass="yes"), "dense_mass must be True, False or 'auto'"),
    (dict(jump_estimate="steps"), "jump_estimate must be 'trajectory'"),
])
def test_bad_options_raise_before_sampling(kwargs, match):
    with gaussian_model(), pytest.raises(ValueError, match=match):
        AdaptiveHMC(**kwargs)


# ---- one tuner for all chains (pooled=True) -------------------------------------------------

def test_pooled_gaussian_moments():
    idata = sample(gaussian_model(), random_seed=13, step_kwargs=dict(pooled=True), **{**CORRECTNESS, "cores": 1})
    assert_moments_match(idata.posterior["x"].values, np.zeros(len(SCALES)), SCALES)


def test_pooled_posteriordb_reference():
    name = "eight_schools-eight_schools_noncentered"
    ref = load_reference(name)
    idata = sample(reference_model(name), random_seed=4, step_kwargs=dict(pooled=True), **{**CORRECTNESS, "cores": 1})
    assert_reference_match({v: idata.posterior[v].values for v in ref["dimensions"]}, name)


def test_pooled_chains_share_one_tuner_and_keep_their_own_draws():
    from ahmc.adapters.diagnostics import history_from_datatree
    from ahmc.core.diagnostics import replay
    from tests.core.test_diagnostics import assert_same_tuner

    with gaussian_model():
        step = PooledAdaptiveHMC(round_length=5)
        assert isinstance(step, AdaptiveHMC) and type(step).__name__ == "PooledAdaptiveHMC"
        idata = pm.sample(step=step, tune=200, draws=100, chains=3, cores=1, random_seed=7, progressbar=False,
                          discard_tuned_samples=False, compute_convergence_checks=False)
    for group in (idata.warmup_sample_stats, idata.sample_stats):
        for name in ("step_size", "max_steps", "tuning_round", "reward", "arm_changed", "adapt_probability"):
            values = group[name].values  # the same in every chain, warm-up's dual averaging included
            np.testing.assert_array_equal(values[1:], np.broadcast_to(values[0], values[1:].shape), err_msg=name)
        assert not np.array_equal(group["n_steps"].values[0], group["n_steps"].values[1])  # own jitter
    # One diagonal mass-matrix estimate took every chain's metric-phase draws; its windows moved once per iteration.
    metric = step._pristine[0]
    assert metric._calls == 3 * 100 and metric._n_samples == 100
    assert np.isfinite(idata.sample_stats["reward"].values[0]).sum() == 20
    x = idata.posterior["x"].values
    assert not np.array_equal(x[0], x[1]) and not np.array_equal(x[1], x[2])
    # The tree reads as one pooled tuner, and replaying it gives the tuner the chains shared.
    history = history_from_datatree(idata)
    assert history.pooled and history.tuner_chains == ((0, 1, 2),)
    assert_same_tuner(replay(history), step._tuner_state)
    # The same seed gives the same draws.
    with gaussian_model():
        again = pm.sample(step=PooledAdaptiveHMC(round_length=5), tune=200, draws=100, chains=3, cores=1,
                          random_seed=7, progressbar=False, compute_convergence_checks=False)
    np.testing.assert_array_equal(again.posterior["x"].values, x)


def test_pooled_with_several_cores_steps_the_chains_in_one_process():
    with pytest.warns(UserWarning, match="steps them in one process"):
        idata = sample(gaussian_model(), tune=100, draws=50, chains=2, cores=2, step_kwargs=dict(pooled=True))
    step_size = idata.sample_stats["step_size"].values
    np.testing.assert_array_equal(step_size[0], step_size[1])


@pytest.mark.parametrize("chains", [1, 2])
def test_pooled_with_one_or_two_chains(chains):
    idata = sample(gaussian_model(), tune=100, draws=50, chains=chains, step_kwargs=dict(pooled=True))
    assert idata.posterior["x"].shape == (chains, 50, len(SCALES))
    assert (idata.sample_stats["tuning_round"].values > 0).all()


def test_pooled_is_a_bool_and_not_for_rmhmc():
    from ahmc.adapters.pymc import AdaptiveRMHMC

    with gaussian_model(), pytest.raises(ValueError, match="pooled must be True or False"):
        AdaptiveHMC(pooled="yes")
    with gaussian_model(), pytest.raises(ValueError, match=r"AdaptiveRMHMC\(pooled=True\) is not available"):
        AdaptiveRMHMC(pooled=True)
    with gaussian_model(), pytest.raises(ValueError, match=r"use PooledAdaptiveHMC\(\.\.\.\)"):
        AdaptiveHMC(pooled=True)  # one tuner for all chains is its own (population) step method


def test_non_finite_initial_density_raises_sampling_error():
    with pm.Model() as model:
        x = pm.Normal("x", 0, 1)
        pm.Potential("bad", pm.math.switch(x > 0.5, -np.inf, 0.0))
    with pytest.raises(SamplingError, match=r"model\.debug\(\)"):
        sample(model, tune=10, draws=10, chains=1, initvals={"x": 1.0})


def test_a_non_finite_reward_warns_and_the_run_goes_on():
    """A user reward that is NaN on long arms (finite on the typical round checked at construction):
    a warning, NaN rewards in the stats at those rounds, all draws kept and finite."""
    from ahmc.core.objectives import normalized_esjd

    def nan_on_long_arms(stats, max_num_steps):
        return np.nan if max_num_steps > 8 else normalized_esjd(stats, max_num_steps)

    with pytest.warns(UserWarning, match="reward was not finite.*check the objective"):
        idata = sample(gaussian_model(), tune=150, draws=100, chains=1, discard_tuned_samples=False,
                       step_kwargs=dict(objective=nan_on_long_arms, step_size_bounds=(0.3, 0.6),
                                        num_steps_bounds=(1, 20)))
    rewards, arm_l, rounds = (np.concatenate([idata.warmup_sample_stats[name].values[0],
                                              idata.sample_stats[name].values[0]])
                              for name in ("reward", "max_steps", "tuning_round"))
    ended = rounds[1:] > rounds[:-1]
    long_ends, short_ends = ended & (arm_l[:-1] > 8), ended & (arm_l[:-1] <= 8)
    assert long_ends.any() and short_ends.any(), (arm_l, ended)
    assert np.isnan(rewards[:-1][long_ends]).all() and np.isfinite(rewards[:-1][short_ends]).all()
    assert np.all(np.isfinite(idata.posterior["x"].values)) and idata.posterior["x"].shape[1] == 100
    with pytest.raises(ValueError, match="objective .* returned nan"):
        AdaptiveHMC(objective=lambda stats, max_num_steps: np.nan, model=gaussian_model())


def test_progress_bar_shows_step_size_and_L_like_nuts():
    columns, stats = AdaptiveHMC._progressbar_config(2)
    headers = [column.get_table_column().header for column in columns]
    assert headers == ["Divergences", "Step size", "L", "Grad evals"] and set(stats) == {
        "divergences", "step_size", "max_steps", "n_steps"}
    (update,) = AdaptiveHMC._make_progressbar_update_functions()
    shown = update({"divergences": 2, "step_size": 0.3, "max_steps": 7, "n_steps": 5, "reward": 1.0})
    assert shown == {"divergences": 2, "step_size": 0.3, "max_steps": 7, "n_steps": 5, "failing": True}


def test_pooled_step_replaces_pymcs_cores_advice(caplog):
    import logging

    from ahmc.adapters.pymc._pooled import POOLED_CORES_MESSAGE

    with gaussian_model(), caplog.at_level(logging.INFO, logger="pymc"):
        pm.sample(step=PooledAdaptiveHMC(), tune=60, draws=20, chains=2, cores=1, progressbar=False,
                  random_seed=1, compute_convergence_checks=False)
    messages = [record.getMessage() for record in caplog.records]
    assert POOLED_CORES_MESSAGE in messages
    assert not any(m.startswith("Chains are not parallelized") for m in messages)


def test_pooled_progress_bar_shows_divergences_step_size_and_L(monkeypatch):
    """PyMC's population sampler draws a bare bar; with PooledAdaptiveHMC it gets the tuner's columns,
    and other population steps keep PyMC's own."""
    from pymc.sampling import population
    from rich.console import Console

    consoles = []
    factory = population.CustomProgress

    def recording(*args, **kwargs):
        consoles.append(Console(record=True, force_terminal=True, width=200))
        return factory(*args, console=consoles[-1], **kwargs)

    monkeypatch.setattr(population, "CustomProgress", recording)
    with gaussian_model():
        step = PooledAdaptiveHMC()
        pm.sample(step=step, tune=60, draws=20, chains=2, cores=1, progressbar=True, random_seed=1,
                  compute_convergence_checks=False)
        text = consoles[-1].export_text()
        assert f"L {step._pool.progress['max_steps']}" in text and "step size" in text and "divergences" in text
        pm.sample(step=pm.DEMetropolis(), tune=20, draws=20, chains=3, cores=1, progressbar=True, random_seed=1,
                  compute_convergence_checks=False)
        assert "step size" not in consoles[-1].export_text()


def test_the_step_keeps_the_papers_reward_and_the_pooled_step_scores_the_strict_ess():
    """objective=None: one chain's rounds (AdaptiveHMC) keep the paper's jump reward, where the lag-1 ESS
    estimate lost (docs/decisions.md); pooled rounds take the JAX routes' strict-ESS reward, which measures
    the squares about the adapted matrix's window mean, so a potential given by the user turns it off."""
    from pymc.step_methods.hmc.quadpotential import QuadPotentialDiag

    from ahmc.core.objectives import needs_center

    with pm.Model():
        pm.Normal("x", shape=3)
        assert not AdaptiveHMC()._uses_center and not needs_center(AdaptiveHMC()._objective)
        assert PooledAdaptiveHMC()._uses_center and needs_center(PooledAdaptiveHMC()._objective)
        fixed = PooledAdaptiveHMC(potential=QuadPotentialDiag(np.ones(3)))
        assert not fixed._uses_center and not needs_center(fixed._objective)
