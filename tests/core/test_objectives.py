import numpy as np
import pytest

from ahmc.core.objectives import (OBJECTIVES, esjd, esjd_moments, esjd_per_gradient, get_objective,
                                  needs_center, normalized_esjd, normalized_ess, round_arrays, round_init, round_update,
                                  step_jumps_estimate, step_jumps_init, step_jumps_update,
                                  with_divergence_penalty)


def test_zero_step_gives_zero_jump():
    stats = round_init()
    x = np.array([1.0, -2.0, 3.0])
    for _ in range(5):
        stats = round_update(stats, x, x, num_gradients=4)
    assert normalized_esjd(stats, 9) == 0.0
    assert int(stats.num_gradients) == 20 and int(stats.num_iterations) == 5


def test_hand_computed_rewards():
    stats = round_init()
    # jumps of squared length 4 and 1, with 3 and 1 leapfrog steps
    stats = round_update(stats, np.zeros(2), np.array([2.0, 0.0]), 3, acceptance=0.5)
    stats = round_update(stats, np.array([2.0, 0.0]), np.array([2.0, 1.0]), 1, acceptance=1.0, is_divergent=True)
    assert esjd(stats, 4) == pytest.approx(2.5)
    assert normalized_esjd(stats, 4) == pytest.approx(2.5 / 2.0)
    assert esjd_per_gradient(stats, 4) == pytest.approx(5.0 / 4.0)
    assert float(stats.sum_acceptance) == pytest.approx(1.5)
    assert int(stats.num_divergent) == 1


def test_whitened_jump_divides_by_scale():
    stats = round_update(round_init(), np.zeros(2), np.array([10.0, 0.1]), 1, scale=np.array([10.0, 0.1]))
    assert esjd(stats, 1) == pytest.approx(2.0)


def test_empty_round_gives_nan_not_an_error():
    assert np.isnan(normalized_esjd(round_init(), 5))
    assert np.isnan(esjd_per_gradient(round_init(), 5))


def test_get_objective():
    assert get_objective("normalized_esjd") is normalized_esjd
    custom = lambda stats, max_num_steps: 1.0  # noqa: E731
    assert get_objective(custom) is custom
    with pytest.raises(ValueError, match="objective must be one of"):
        get_objective("ess")


def _round_with_divergences(num_divergent, num_iterations=10):
    stats = round_init()
    for i in range(num_iterations):
        stats = round_update(stats, np.zeros(2), np.array([1.0, 1.0]), 2, is_divergent=i < num_divergent)
    return stats


def test_divergence_penalty_scales_the_reward_by_the_divergent_fraction():
    penalized = get_objective("normalized_esjd", divergence_penalty=10.0)
    clean, two = _round_with_divergences(0), _round_with_divergences(2)
    # 2 of 10 divergent: exp(-10 * 0.2); without divergences the reward is untouched.
    assert float(penalized(two, 4)) == pytest.approx(float(normalized_esjd(two, 4)) * np.exp(-2.0))
    assert float(penalized(clean, 4)) == float(normalized_esjd(clean, 4))
    assert get_objective("normalized_esjd", divergence_penalty=0) is normalized_esjd
    custom = with_divergence_penalty(lambda stats, max_num_steps: 3.0, 5.0)
    assert float(custom(_round_with_divergences(10), 4)) == pytest.approx(3.0 * np.exp(-5.0))
    assert np.isnan(penalized(round_init(), 4))  # an empty round stays NaN, not 0


def test_divergence_penalty_runs_under_jax():
    jnp = pytest.importorskip("jax.numpy")
    penalized = get_objective("esjd", divergence_penalty=10.0)
    stats = round_update(round_init(jnp, jnp.float32), jnp.zeros(2), jnp.ones(2), 3, is_divergent=True)
    assert float(penalized(stats, 3)) == pytest.approx(2.0 * np.exp(-10.0), rel=1e-5)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "ten"])
def test_divergence_penalty_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="divergence_penalty must be a finite number >= 0"):
        get_objective("normalized_esjd", divergence_penalty=bad)


def test_squares_jump_is_summed_only_with_a_center_and_in_whitened_units():
    old, new = np.array([1.0, 4.0]), np.array([3.0, 0.0])
    scale, center = np.array([1.0, 2.0]), np.array([1.0, 2.0])
    stats = round_update(round_init(), old, new, 2, scale=scale)
    assert float(stats.sum_squared_jump_squares) == 0.0  # no center: skipped
    stats = round_update(round_init(), old, new, 2, scale=scale, center=center)
    # z: (0, 1) -> (2, -1); squares (0, 1) -> (4, 1); (4^2 + 0^2) / 2 = 8
    assert float(stats.sum_squared_jump_squares) == pytest.approx(8.0)
    assert float(stats.sum_squared_jump) == pytest.approx(4.0 + 4.0)  # jumps (2, -4) / (1, 2)
    # esjd_moments: sqrt(mean jump 8 * mean squares jump 8) / sqrt(L = 4)
    assert float(esjd_moments(stats, 4)) == pytest.approx(8.0 / 2.0)
    assert np.isnan(esjd_moments(round_init(), 4))


def test_squares_jump_is_the_same_under_jax_and_numpy():
    jnp = pytest.importorskip("jax.numpy")
    rng = np.random.default_rng(0)
    old, new, scale, center = rng.normal(size=5), rng.normal(size=5), rng.uniform(0.5, 2, 5), rng.normal(size=5)
    a = round_update(round_init(), old, new, 3, 0.7, False, scale, center)
    b = round_update(round_init(jnp, jnp.float32), jnp.asarray(old), jnp.asarray(new), 3, 0.7, False,
                     jnp.asarray(scale), jnp.asarray(center))
    for x, y in zip(a, b):
        assert float(x) == pytest.approx(float(y), rel=1e-5)  # float32 under JAX


def test_esjd_moments_on_independent_normal_draws_balances_both_jumps():
    """Both mean jumps are 2 for independent N(0, 1) draws, so the reward is 2 / sqrt(L)."""
    draws = np.random.default_rng(1).normal(size=(20001, 3))
    stats = round_init()
    for old, new in zip(draws[:-1], draws[1:]):
        stats = round_update(stats, old, new, 1, center=np.zeros(3))
    n = float(stats.num_iterations)
    assert float(stats.sum_squared_jump) / n / 3 == pytest.approx(2.0, rel=0.03)
    assert float(stats.sum_squared_jump_squares) / n / 3 == pytest.approx(2.0, rel=0.08)
    assert float(esjd_moments(stats, 9)) / 3 == pytest.approx(2.0 / 3.0, rel=0.06)


def _ar1_round(rho, num_steps, size=40000, dim=2, seed=3):
    """The sums of a stationary Gaussian AR(1) chain ``x' = rho x + sqrt(1 - rho^2) noise``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=dim)
    stats = round_init(None)
    for _ in range(size):
        new = rho * x + np.sqrt(1 - rho * rho) * rng.normal(size=dim)
        stats = round_update(stats, x, new, num_steps, center=np.zeros(dim))
        x = new
    return stats


@pytest.mark.parametrize("rho, num_steps", [(0.0, 1), (0.6, 3), (-0.6, 2)])
def test_normalized_ess_is_the_worse_of_the_means_and_squares_ess_over_root_steps(rho, num_steps):
    """For a Gaussian AR(1) chain the means' ESS per draw is (1 - rho) / (1 + rho) and the squares',
    whose autocorrelation is rho^2, (1 - rho^2) / (1 + rho^2): an antithetic chain (rho < 0) is
    scored by its squares, not by its means' ESS above one draw per draw."""
    means, squares = (1 - rho) / (1 + rho), (1 - rho ** 2) / (1 + rho ** 2)
    expected = min(means, squares) / np.sqrt(num_steps)
    assert normalized_ess(_ar1_round(rho, num_steps), 7) == pytest.approx(expected, rel=0.05)


def test_normalized_ess_bounds_a_round_that_jumps_beyond_twice_the_variance():
    """Two alternating points jump 4 variances: lag-1 correlation -1 is kept at -0.9 (ESS 19 per draw),
    and the squares, which do not move, score 0."""
    stats = round_init(None)
    for t in range(10):
        stats = round_update(stats, np.array([(-1.0) ** t]), np.array([(-1.0) ** (t + 1)]), 2,
                             center=np.zeros(1))
    assert normalized_ess(stats, 1) == 0.0
    # squares that jump 16 (mean) against their variance 2: kept at -0.9 too, so 19 / sqrt(2 steps)
    stats = stats._replace(sum_squared_jump_squares=80.0)
    assert normalized_ess(stats, 1) == pytest.approx(19.0 / np.sqrt(2))
    assert normalized_ess(stats._replace(sum_squared_jump_squares=5.0), 1) == pytest.approx((0.25 / 1.75) / np.sqrt(2))


def test_objectives_that_need_a_center_say_so_also_when_penalized():
    assert needs_center(esjd_moments) and needs_center(get_objective("esjd_moments", divergence_penalty=10.0))
    assert not needs_center(get_objective("normalized_esjd", divergence_penalty=10.0))
    assert not needs_center(lambda stats, max_num_steps: 1.0)


def _rounds(xp, center=None, num_divergent=3):
    """One round of 10 iterations summed in arrays (xp=np) or in Python numbers (xp=None)."""
    rng = np.random.default_rng(5)
    draws, scale = rng.normal(size=(11, 4)), rng.uniform(0.5, 2.0, 4)
    stats = round_init(xp) if xp is None else round_init(xp, np.float64)
    for t in range(10):
        stats = round_update(stats, draws[t], draws[t + 1], t % 3 + 1, 0.1 * t, t < num_divergent, scale, center)
    return stats


def test_python_number_sums_match_the_array_sums_and_convert_to_their_dtypes():
    """round_init(None) keeps the sums in Python numbers (PyMC's eager loop); round_arrays gives back
    exactly round_init's arrays and dtypes."""
    center = np.linspace(-1, 1, 4)
    in_python, in_arrays = _rounds(None, center), _rounds(np, center)
    assert all(isinstance(v, (int, float)) and not isinstance(v, np.generic) for v in in_python)
    converted = round_arrays(in_python)
    for name, a, b in zip(in_arrays._fields, in_arrays, converted):
        assert (np.asarray(a).dtype, np.shape(a)) == (b.dtype, b.shape), name
        assert float(a) == pytest.approx(float(b), rel=1e-14), name
    assert int(converted.num_divergent) == 3 and int(converted.num_gradients) == 19


@pytest.mark.parametrize("name", ["normalized_esjd", "esjd", "esjd_per_gradient", "esjd_moments", "normalized_ess"])
@pytest.mark.parametrize("penalty", [0.0, 10.0])
def test_builtin_objectives_give_the_same_reward_on_python_number_sums(name, penalty):
    objective = get_objective(name, divergence_penalty=penalty)
    center = np.zeros(4) if needs_center(objective) else None
    in_python, in_arrays = _rounds(None, center), _rounds(np, center)
    reward, on_arrays = objective(in_python, 7), objective(in_arrays, 7)
    assert type(reward) is float and type(on_arrays) is not float  # each took its own path
    assert reward == pytest.approx(float(on_arrays), rel=1e-13)
    if penalty:  # the penalty did something: exp(-10 * 3 / 10)
        assert reward == pytest.approx(float(OBJECTIVES[name](in_arrays, 7)) * np.exp(-3.0), rel=1e-13)
    empty = objective(round_init(None), 7)
    assert isinstance(empty, float) and np.isnan(empty) and np.isnan(float(objective(round_init(), 7)))


def test_check_objective_names_a_broken_user_reward_before_any_draw():
    """A user reward that raises, returns NaN or returns a vector on a typical round is refused by
    get_objective with the contract in the message; a good one (or a built-in) passes unchanged."""
    from ahmc.core import check_objective

    good = lambda stats, max_num_steps: stats.sum_squared_jump / stats.num_iterations  # noqa: E731
    assert get_objective(good) is good
    for name in OBJECTIVES:
        check_objective(OBJECTIVES[name])
    broken = {
        "one_argument": (lambda stats: 1.0, "failed on a typical round's sums"),
        "nan": (lambda stats, max_num_steps: np.nan, "returned nan"),
        "log_of_zero": (lambda stats, max_num_steps: np.log(stats.num_divergent * 1.0), "returned"),
        "vector": (lambda stats, max_num_steps: np.ones(3), "returned"),
    }
    for objective, message in broken.values():
        with pytest.raises(ValueError, match=message) as caught:
            with np.errstate(divide="ignore"):
                get_objective(objective)
        assert "(stats: RoundStats, max_num_steps) -> float" in str(caught.value)


def test_step_jumps_average_the_mean_at_each_length_reached():
    jumps = step_jumps_init(4)
    for values in ([1.0, 2.0], [3.0, 4.0, 5.0, 6.0], [0.5]):
        jumps = step_jumps_update(jumps, values)
    # per length: (1 + 3 + 0.5) / 3, (2 + 4) / 2, 5, 6
    assert step_jumps_estimate(jumps) == pytest.approx((1.5 + 3.0 + 5.0 + 6.0) / 4)
    assert step_jumps_estimate(jumps, min_num_steps=3) == pytest.approx(5.5)  # U{3..L}: shorter ones unused
    short = step_jumps_update(step_jumps_init(5), [2.0, 4.0])
    assert step_jumps_estimate(short) == pytest.approx(3.0)  # lengths 3-5 never reached: left out
    assert np.isnan(step_jumps_estimate(step_jumps_init(3)))
    assert np.isnan(step_jumps_estimate(short, min_num_steps=3))
    longer = step_jumps_update(step_jumps_init(2), [1.0, 2.0, 9.0])  # beyond L: ignored
    assert step_jumps_estimate(longer) == pytest.approx(1.5)
    np.testing.assert_array_equal(short.sums, [2.0, 4.0, 0, 0, 0])  # updates return new arrays


def test_step_jumps_estimate_the_made_jump_with_less_noise():
    """Leapfrog on an 8-d standard normal, L ~ U{1..4}, rounds of 10 trajectories (the PyMC step's): the
    per-step estimate and the jumps the chain made (accept/reject coin included) agree in the mean over 400
    rounds, and the per-step estimate varies less from round to round (variance ratio 0.60-0.71 over eight
    seeds; the threshold 0.9 is about three standard errors above)."""
    rng = np.random.default_rng(3)
    eps, top, rounds, per_round = 0.9, 4, 400, 10
    x = rng.standard_normal(8)
    made, estimated = [], []
    for _ in range(rounds):
        jumps, total = step_jumps_init(top), 0.0
        for _ in range(per_round):
            p = rng.standard_normal(8)
            q, v, start_h, values = x.copy(), p.copy(), 0.5 * x @ x + 0.5 * p @ p, []
            for _ in range(int(rng.integers(1, top + 1))):
                v -= 0.5 * eps * q
                q += eps * v
                v -= 0.5 * eps * q
                values.append(min(1.0, np.exp(start_h - 0.5 * q @ q - 0.5 * v @ v)) * np.sum((q - x) ** 2))
            jumps = step_jumps_update(jumps, values)
            accepted = rng.uniform() < min(1.0, np.exp(start_h - 0.5 * q @ q - 0.5 * v @ v))
            total += np.sum((q - x) ** 2) if accepted else 0.0
            x = q if accepted else x
        made.append(total / per_round)
        estimated.append(step_jumps_estimate(jumps))
    made, estimated = np.array(made), np.array(estimated)
    error = np.sqrt(made.var() / rounds + estimated.var() / rounds)
    assert abs(made.mean() - estimated.mean()) < 4.5 * error
    assert estimated.var() < 0.9 * made.var()
