"""Tuning diagnostics from per-draw stats alone, checked against a simulated run of the core tuner."""

import numpy as np
import pytest

from ahmc.core import gp_ucb, search_space
from ahmc.core.diagnostics import (
    TuningConfig,
    rebuild_surrogate,
    replay,
    tuning_history,
    tuning_summary,
    tuning_warnings,
    unrecorded_warmup_note,
)


def bump(step_size, num_steps, best=(0.3, 15)):
    """A smooth reward with its maximum at ``best`` (in log step size and L)."""
    return np.exp(-0.5 * (np.log(step_size / best[0]) / 0.5) ** 2 - 0.5 * ((num_steps - best[1]) / 8.0) ** 2)


def simulate(*, step_size=(0.05, 1.0), num_steps=(1, 40), num_num_steps=None, reward=bump, num_rounds=40,
             warmup_rounds=25, round_length=5, num_chains=2, metric=6, pooled=True, seed=0, capacity=32,
             acceptance=lambda eps: np.clip(1.1 - eps, 0.05, 1.0), divergence=lambda eps: 0.0):
    """Drive the core tuner the way an adapter does; return PyMC-named per-draw stats and the tuners.

    ``num_num_steps`` gives a grid of that many columns mapped onto the ``L`` box
    (``L = round(lo + u (hi - lo))``), as the JAX engine's automatic box does.
    """
    rng = np.random.default_rng(seed)
    lo, hi = num_steps
    columns = num_num_steps or hi - lo + 1
    space = search_space(step_size, (1, columns), num_step_sizes=50)
    tuner = gp_ucb(space, k=warmup_rounds, capacity=capacity)
    steps_of = np.maximum(np.round(lo + space.num_steps_unit * (hi - lo)), 1).astype(int)
    num_tuners = 1 if pooled else num_chains
    states = [tuner.init() for _ in range(num_tuners)]
    draws = metric + num_rounds * round_length
    shape = (num_chains, draws)
    stats = {
        "step_size": np.full(shape, 0.2), "max_steps": np.full(shape, 10), "n_steps": np.full(shape, 5),
        "accept": np.full(shape, 0.8), "diverging": np.zeros(shape, bool), "reward": np.full(shape, np.nan),
        "tuning_round": np.zeros(shape, int), "arm_changed": np.zeros(shape, bool),
        "adapt_probability": np.ones(shape), "tune": np.zeros(shape, bool),
    }
    stats["tune"][:, : metric + warmup_rounds * round_length] = True
    probability = np.ones(num_tuners)
    for i in range(1, num_rounds + 1):
        draws_i = slice(metric + (i - 1) * round_length, metric + i * round_length)
        rewards = []
        for c in range(num_chains):
            t = 0 if pooled else c
            arm = int(states[t].arm)
            eps, steps = space.step_sizes[arm // columns], steps_of[arm % columns]
            stats["step_size"][c, draws_i], stats["max_steps"][c, draws_i] = eps, steps
            stats["tuning_round"][c, draws_i] = i
            stats["n_steps"][c, draws_i] = rng.integers(1, steps + 1, round_length)
            stats["accept"][c, draws_i] = acceptance(eps)
            stats["diverging"][c, draws_i] = rng.uniform(size=round_length) < divergence(eps)
            stats["adapt_probability"][c, draws_i] = probability[t]
            rewards.append(reward(eps, steps) * (1 + 0.1 * rng.normal()))
        for t in range(num_tuners):
            chains = list(range(num_chains)) if pooled else [t]
            mean = float(np.mean([rewards[c] for c in chains]))
            states[t], info = tuner.update(states[t], mean, rng.uniform(), float(len(chains)))
            probability[t] = float(info.adapt_probability)
            stats["reward"][chains, draws_i.stop - 1] = mean
            stats["arm_changed"][chains, draws_i.stop - 1] = bool(info.arm_changed)
            stats["adapt_probability"][chains, draws_i.stop - 1] = probability[t]
    config = TuningConfig(step_size=step_size, num_steps=num_steps, num_step_sizes=50,
                          num_num_steps=num_num_steps, initial_arm=space.center_arm(), capacity=capacity)
    return stats, tuner, states, config


def assert_same_tuner(replayed, expected):
    """``replayed``: what ``replay`` returns, ``(tuner, state)``."""
    # The replay never adapts, so its rewards wait in pending_weight where the run's acquisitions took
    # them in: compare the settled variances (the GP they define), not that bookkeeping.
    core, state = replayed
    state, expected = core.settle(state), core.settle(expected)
    for name in ("arm", "last_round"):
        np.testing.assert_array_equal(getattr(state.buffer, name), getattr(expected.buffer, name))
    np.testing.assert_array_equal(state.buffer.count, expected.buffer.count)
    np.testing.assert_allclose(state.buffer.mean_reward, expected.buffer.mean_reward, rtol=1e-12)
    np.testing.assert_allclose(state.grid_variance, expected.grid_variance, rtol=1e-10, atol=1e-12)
    assert int(state.round) == int(expected.round)
    assert float(state.scale) == pytest.approx(float(expected.scale), rel=1e-12)


@pytest.fixture(scope="module")
def run():
    return simulate()


def test_history_equals_the_tuners_record(run):
    stats, tuner, (expected,), config = run
    history = tuning_history(stats, config=config)
    rounds = history.rounds
    assert history.pooled and history.num_tuners == 1 and history.weight(0) == 2.0
    np.testing.assert_array_equal(rounds.round, np.arange(1, 41))
    assert rounds.is_complete.all() and rounds.is_warmup.sum() == 25
    np.testing.assert_array_equal(rounds.num_iterations, 5)
    np.testing.assert_array_equal(rounds.reward, stats["reward"][0, np.isfinite(stats["reward"][0])])
    core, state = replay(history)
    assert_same_tuner((core, state), expected)
    surrogate, own = rebuild_surrogate(history), tuner.surrogate(expected)
    for name in ("mean", "sd", "acquisition"):
        np.testing.assert_allclose(getattr(surrogate, name), getattr(own, name), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(surrogate.step_sizes, tuner.space.step_sizes)
    np.testing.assert_array_equal(surrogate.num_steps, np.arange(1, 41))


def test_arm_table_and_chosen_arm(run):
    stats, tuner, (expected,), config = run
    history = tuning_history(stats, config=config)
    arms = history.arms
    assert arms.share.sum() == pytest.approx(1.0)
    assert arms.num_iterations.sum() == 40 * 5
    # one row per distinct arm, visited as often as the buffer counts (weight 2: two pooled chains)
    counts = np.sort(expected.buffer.count[expected.buffer.count > 0]) / 2
    np.testing.assert_array_equal(np.sort(arms.num_rounds), counts)
    assert history.chosen_step_size[0] == stats["step_size"][0, -1]
    assert history.chosen_num_steps[0] == stats["max_steps"][0, -1]
    top = np.argmax(arms.share)
    assert arms.acceptance[top] == pytest.approx(np.clip(1.1 - arms.step_size[top], 0.05, 1.0))


def test_repeated_L_columns_resolved_like_the_tuner():
    """A grid with more L columns than integers in the box (the automatic box): replay is still exact."""
    stats, tuner, (expected,), config = simulate(num_steps=(1, 6), num_num_steps=32, seed=3,
                                                 reward=lambda e, s: bump(e, s, best=(0.3, 3)))
    assert_same_tuner(replay(tuning_history(stats, config=config)), expected)


def test_a_full_buffer_evicts_the_same_arms_on_replay():
    stats, tuner, (expected,), config = simulate(capacity=8, seed=2)
    assert int(np.sum(expected.buffer.count > 0)) == 8
    assert_same_tuner(replay(tuning_history(stats, config=config)), expected)


def test_independent_chains_get_one_history_each():
    stats, tuner, states, config = simulate(pooled=False, num_chains=3, num_rounds=25, seed=1)
    history = tuning_history(stats, config=config)
    assert not history.pooled and history.tuner_chains == ((0,), (1,), (2,))
    for t, expected in enumerate(states):
        assert_same_tuner(replay(history, tuner=t), expected)
    assert "one tuner per chain" in tuning_summary(history)


def test_names_of_every_adapter(run):
    stats, _, (expected,), config = run
    engine = {"step_size": stats["step_size"], "num_steps": stats["max_steps"],
              "num_integration_steps": stats["n_steps"], "acceptance_rate": stats["accept"],
              "is_divergent": stats["diverging"], "reward": stats["reward"], "round": stats["tuning_round"],
              "arm_changed": stats["arm_changed"], "adapt_probability": stats["adapt_probability"],
              "is_warmup": stats["tune"]}
    numpyro = {**{k: v for k, v in stats.items() if k not in ("n_steps", "accept")},
               "num_steps": stats["n_steps"], "accept_prob": stats["accept"]}
    reference = tuning_history(stats, config=config)
    for source in (engine, numpyro):
        history = tuning_history(source, config=config)
        for a, b in zip(history.rounds, reference.rounds):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(history.trace.num_integration_steps, stats["n_steps"])
    ambiguous = {"step_size": stats["step_size"], "num_steps": stats["max_steps"], "reward": stats["reward"],
                 "tuning_round": stats["tuning_round"]}
    with pytest.raises(ValueError, match="names="):
        tuning_history(ambiguous)
    history = tuning_history(ambiguous, names={"num_steps": "num_steps"})
    np.testing.assert_array_equal(history.rounds.num_steps, reference.rounds.num_steps)
    with pytest.raises(ValueError, match="unknown fields"):
        tuning_history(stats, names={"L": "max_steps"})


def test_one_chain_and_an_unfinished_last_round(run):
    stats, *_ = run
    cut = {name: value[0, :-2] for name, value in stats.items()}  # (draws,), last round 3 of 5 draws
    history = tuning_history(cut)
    assert history.trace.step_size.shape == (1, 204)
    assert not history.rounds.is_complete[-1] and np.isnan(history.rounds.reward[-1])
    assert history.rounds.is_complete[:-1].all()


def test_summary_reports_the_choice_and_stays_quiet_on_a_good_box(run):
    stats, _, _, config = run
    history = tuning_history(stats, config=config)
    text = tuning_summary(history)
    assert f"chosen arm: step_size = {stats['step_size'][0, -1]:.3g}, L = {stats['max_steps'][0, -1]}" in text
    assert f"distinct arms: {len(history.arms.share)}" in text
    assert "search box: step_size 0.05..1, L 1..40" in text
    assert "sampling: acceptance" in text and "divergences 0 of" in text
    assert tuning_warnings(history) == []
    assert "No sign that tuning failed." in text


def test_warning_fires_when_the_optimum_is_outside_the_box():
    stats, *_, config = simulate(step_size=(0.01, 0.08), num_steps=(1, 8))  # optimum at (0.3, 15)
    text = tuning_summary(tuning_history(stats, config=config))
    assert "WARNING: tuning probably failed" in text
    assert "upper step-size edge" in text and "upper L edge" in text and "Widen the box" in text


def test_acceptance_and_divergence_warnings():
    stats, *_, config = simulate(acceptance=lambda eps: 0.1, divergence=lambda eps: 0.2)
    warnings = tuning_warnings(tuning_history(stats, config=config))
    assert any("near 0" in w and "Lower the step-size box" in w for w in warnings)
    assert any("diverged" in w and 'AdaptiveRMHMC(metric="fisher")' in w for w in warnings)
    stats, *_, config = simulate(acceptance=lambda eps: 0.999)
    assert any("near 1" in w for w in tuning_warnings(tuning_history(stats, config=config)))


def test_divergences_rescued_by_the_retry_still_warn():
    """With divergence_retry, a transition whose first try diverged and whose finer retry did not is recorded as
    retried, not diverging: the warning still counts it (the region is still hard), and says so."""
    stats, *_, config = simulate(divergence=lambda eps: 0.2)
    plain = [w for w in tuning_warnings(tuning_history(stats, config=config)) if "diverged" in w]
    first_try = np.asarray(stats["diverging"], bool)
    rescued = {**stats, "diverging": np.zeros_like(first_try), "retried": first_try}  # every retry rescued
    warned = [w for w in tuning_warnings(tuning_history(rescued, config=config)) if "diverged" in w]
    share = plain[0].split("% of transitions")[0]
    assert len(plain) == len(warned) == 1 and warned[0].startswith(share + "% of transitions diverged (0.0% still")
    summary = tuning_summary(tuning_history(stats, config=config))
    divergences = summary.split("divergences ")[1].split(" of ")[0]
    assert "divergences 0 of" in tuning_summary(tuning_history(rescued, config=config))
    assert f"retried finer {divergences}" in tuning_summary(tuning_history(rescued, config=config))


def test_too_little_warm_up_and_missing_warm_up_are_reported(run):
    stats, *_, config = simulate(warmup_rounds=4, num_rounds=20)
    assert any("only 4 GP rounds in warm-up" in w for w in tuning_warnings(tuning_history(stats, config=config)))
    stats, *_, config = run
    later = {name: value[:, 6 + 30 * 5:] for name, value in stats.items()}
    history = tuning_history(later, config=config)
    assert history.rounds.round[0] == 31
    assert "rounds 1-30, where the tuner learns most, are missing" in unrecorded_warmup_note(history)
    assert not any("missing" in w for w in tuning_warnings(history))  # a note, not a sign of failure
    text = tuning_summary(history)
    assert "NOTE: the warm-up was not recorded" in text and "discard_tuned_samples=False" in text


def test_config_round_trips_through_json_and_is_needed_for_the_surrogate(run):
    stats, _, (expected,), config = run
    assert TuningConfig.parse(config.to_json()) == config._replace(step_size=[0.05, 1.0], num_steps=[1, 40])
    history = tuning_history(stats)
    with pytest.raises(ValueError, match="ahmc_config"):
        rebuild_surrogate(history)
    assert_same_tuner(replay(history, config.to_json()), expected)
    assert "No sign" in tuning_summary(history)  # no box: no edge check, the rest still runs
    with pytest.raises(ValueError, match="schedule"):
        TuningConfig.parse({"step_size": (0.1, 1), "num_steps": (1, 5), "schedule": "linear"})


def test_strongest_correlation_finds_the_pair_and_skips_constant_coordinates():
    from ahmc.core.diagnostics import strongest_correlation

    rng = np.random.default_rng(3)
    z = rng.normal(size=(2, 2000, 4))
    draws = np.concatenate([z[..., :1], np.ones((2, 2000, 1)), z[..., 1:3], -z[..., :1] + 0.2 * z[..., 3:]], axis=-1)
    r, a, b = strongest_correlation(draws, ["a", "const", "b", "c", "d"])
    assert (a, b) == ("a", "d") and r == pytest.approx(-1 / np.sqrt(1.04), abs=0.01)
    assert strongest_correlation(np.c_[z[0, :, 0], np.ones(2000)]) is None  # one varying coordinate
    assert strongest_correlation(z, max_dim=3) is None
    with pytest.raises(ValueError, match="names has 2 entries for 4"):
        strongest_correlation(z, ["a", "b"])


def test_summary_suggests_dense_mass_only_for_strong_correlations_without_it():
    from ahmc.core.diagnostics import dense_mass_hint

    stats, _, _, config = simulate()
    history = tuning_history(stats, config=config._replace(dense_mass=False))
    assert dense_mass_hint(history) is None  # no draws given
    strong = history._replace(strongest_correlation=(0.97, "beta[1]", "beta[2]"))
    assert "Hint: posterior correlation +0.97 between beta[1] and beta[2]" in tuning_summary(strong)
    assert "dense_mass=True" in dense_mass_hint(strong) and "Ignore this" not in dense_mass_hint(strong)
    assert dense_mass_hint(strong._replace(config=None)).endswith("already used dense_mass=True.")
    assert dense_mass_hint(history._replace(strongest_correlation=(-0.85, "a", "b"))) is None
    assert dense_mass_hint(strong._replace(config=strong.config._replace(dense_mass=True))) is None
    assert 'dense_mass="auto"' in dense_mass_hint(strong)  # the choice that keeps only real correlations
    assert dense_mass_hint(strong._replace(config=strong.config._replace(dense_mass="auto"))) is None
    # The JAX routes' default low-rank estimate learns correlations already: no dense_mass to suggest
    low_rank = dense_mass_hint(strong._replace(config=strong.config._replace(metric_recipe="fisher_low_rank")))
    assert "dense_mass" not in low_rank and "non-centred" in low_rank
    welford = strong._replace(config=strong.config._replace(metric_recipe="welford_diag"))
    assert 'dense_mass="auto"' in dense_mass_hint(welford)


def test_summary_points_at_the_variances_only_when_the_squares_lag_far_behind():
    from ahmc.core.diagnostics import variance_hint

    stats, _, _, config = simulate()
    history = tuning_history(stats, config=config)
    assert variance_hint(history) is None  # no draws given
    lagging = history._replace(slowest_square=(280.0, "x[9]", 2821.0, 4000))  # the diagonal Gaussian's seed 0
    assert "Hint: the squares mix far more slowly" in tuning_summary(lagging)
    assert "(x[9] - mean)^2 is 280 of 4000 draws" in variance_hint(lagging)
    assert 'objective="normalized_ess"' in variance_hint(lagging)
    assert variance_hint(history._replace(slowest_square=(836.0, "x[0]", 4537.0, 4000))) is None  # 21% of the draws
    slow_everywhere = history._replace(slowest_square=(280.0, "x[0]", 500.0, 4000))
    assert variance_hint(slow_everywhere) is None  # everything mixes slowly, not the squares alone


def test_summary_suggests_more_draws_below_100_ess_per_chain():
    """posteriordb's eight schools in the NumPyro kernel, seed 0: L = 2, 1.5 gradients per draw, the smallest
    bulk ESS 362 over 4 chains: R-hat 1.014 from too few effective draws, not from a failed tuner."""
    from ahmc.core.diagnostics import few_draws_hint

    stats, _, _, config = simulate()  # 2 chains
    history = tuning_history(stats, config=config)
    assert few_draws_hint(history) is None  # no draws given
    short = history._replace(slowest_square=(300.0, "tau", 150.0, 4000))
    hint = few_draws_hint(short)
    assert hint.startswith("the smallest bulk ESS of a coordinate is 150 over 2 chains, under 100 per chain")
    trace = history.trace
    steps = trace.num_integration_steps[~trace.is_warmup].mean()  # the draws' cost, after warm-up
    assert f"at {steps:.1f} leapfrog steps per draw" in hint and "draw about 2x as many" in hint
    assert 'objective="esjd"' in hint and f"Hint: {hint}" in tuning_summary(short)
    assert "WARNING" not in tuning_summary(short)  # a run too short, not a failed tuner
    assert few_draws_hint(history._replace(slowest_square=(300.0, "tau", 200.0, 4000))) is None


def test_a_coordinate_the_chains_barely_explore_is_a_tuning_warning():
    """The issue's sds 1e-6 and 1e6 after a warm-up that missed the wide scale: ESS 7 of 4000 draws."""
    stats, _, _, config = simulate()
    history = tuning_history(stats, config=config)
    missed = history._replace(slowest_square=(5.0, "b", 7.0, 4000))
    assert any("bulk ESS is 7 of 4000 draws: the chains barely explore it" in w for w in tuning_warnings(missed))
    assert "WARNING: tuning probably failed" in tuning_summary(missed)
    fine = history._replace(slowest_square=(280.0, "x[9]", 2821.0, 4000))
    assert not any("barely explore" in w for w in tuning_warnings(fine))


def test_chains_that_disagree_are_a_warning_with_the_metric_remedy():
    """posteriordb's gp_pois_regr under the low-rank metric before the last window's raise to the draws'
    variance: R-hat 1.042 on a GP hyperparameter."""
    stats, _, _, config = simulate()
    history = tuning_history(stats, config=config)
    unmixed = history._replace(worst_rhat=(1.042, "rho", 4))
    (warning,) = [w for w in tuning_warnings(unmixed) if "R-hat" in w]
    assert warning.startswith("R-hat 1.042 for rho over 4 chains (above 1.01)")
    assert 'metric_recipe="welford_diag"' in warning and "Draw more and give more warm-up." in warning
    assert "WARNING: tuning probably failed" in tuning_summary(unmixed)
    # eight schools, seed 0 of the NumPyro kernel: R-hat 1.014 with 362 effective draws over 4 chains
    short = unmixed._replace(worst_rhat=(1.014, "tau", 4), slowest_square=(900.0, "tau", 362.0, 4000))
    (warning,) = [w for w in tuning_warnings(short) if "R-hat" in w]
    assert "With under 100 effective draws per chain R-hat is itself uncertain: draw more first" in warning
    stuck = history._replace(worst_rhat=(9.8e15, "x[1]", 2))
    assert any(w.startswith("R-hat 9.8e+15 for x[1]") for w in tuning_warnings(stuck))
    for fine in (history, history._replace(worst_rhat=(1.01, "rho", 4)), history._replace(worst_rhat=(1.004, "a", 4))):
        assert not any("R-hat" in w for w in tuning_warnings(fine))


def test_summary_points_at_a_single_leapfrog_step_with_the_bound_that_rules_it_out():
    from ahmc.core.diagnostics import single_step_hint

    def short(step_size, num_steps):  # the reward of a low-dimensional posterior: best at L = 1
        return bump(step_size, num_steps, best=(0.3, 1)) * np.exp(-0.5 * (num_steps - 1))

    stats, *_, config = simulate(reward=short, num_steps=(1, 12))
    history = tuning_history(stats, config=config)
    assert history.chosen_num_steps[0] == 1
    hint = single_step_hint(history)
    assert "single leapfrog step (L = 1)" in hint and "num_steps_bounds=(2, 12)" in hint
    assert f"Hint: {hint}" in tuning_summary(history)
    assert "num_steps_bounds=(2, upper)" in single_step_hint(history._replace(config=None))  # box unknown
    # One tuner per chain: the hint names the chains at L = 1.
    stats, *_, config = simulate(reward=short, num_steps=(1, 12), pooled=False)
    assert single_step_hint(tuning_history(stats, config=config)).startswith("chain 0, 1: ")
    # The optimum inside the box, or a box of L = 1 only: no hint.
    stats, *_, config = simulate()
    assert single_step_hint(tuning_history(stats, config=config)) is None
    stats, *_, config = simulate(reward=short, num_steps=(1, 1))
    assert single_step_hint(tuning_history(stats, config=config)) is None
