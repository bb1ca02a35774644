import math

import numpy as np
import pytest

from ahmc.core import TunerState, gp_ucb, search_space
from ahmc.core.config import POOLED_NOISE_VARIANCE, Config
from ahmc.core.tuner import adapt_probability, ucb_beta

from .surfaces import bump_surface, grid_maximum, run_tuner


@pytest.fixture(scope="module")
def space():
    return search_space((1e-3, 1.0), (1, 100))


def test_adapt_probability_formulas():
    i = np.arange(1, 500)
    expected = np.maximum(i - 100 + 1, 1) ** -0.5
    np.testing.assert_allclose(adapt_probability(i), expected, rtol=1e-15)
    assert adapt_probability(100) == 1.0 and adapt_probability(101) == pytest.approx(2**-0.5)
    np.testing.assert_allclose(
        adapt_probability(i, schedule="exponential", decay=0.01), np.exp(-0.01 * (i - 1)), rtol=1e-15
    )


def test_beta_formula():
    for i in [1, 2, 10, 1000]:
        expected = 2 * math.log((i + 1) ** (2 / 2 + 2) * math.pi**2 / (3 * 0.1))
        assert ucb_beta(i) == pytest.approx(expected, rel=1e-14)


def test_schedule_in_python_numbers_matches_numpy():
    """xp=math (the eager tuner update and PyMC's per-round stats) gives Python floats equal to NumPy's."""
    for i in [1, 2, 50, 99, 100, 101, 1000]:
        for schedule in ("inverse_sqrt", "exponential"):
            p = adapt_probability(i, schedule=schedule, k=100, decay=0.01, xp=math)
            assert type(p) is float and p == pytest.approx(float(adapt_probability(i, schedule=schedule, k=100,
                                                                                    decay=0.01)), rel=1e-15)
        beta = ucb_beta(i, delta=0.05, xp=math)
        assert type(beta) is float and beta == pytest.approx(float(ucb_beta(i, delta=0.05)), rel=1e-15)


def test_info_reports_the_schedule(space):
    tuner = gp_ucb(space)
    state = tuner.init()
    for i in range(1, 130):
        state, info = tuner.update(state, 1.0, uniform=0.99)
        assert int(info.round) == i
        assert float(info.adapt_probability) == pytest.approx(max(i - 99, 1) ** -0.5)
        assert float(info.beta) == pytest.approx(ucb_beta(i))
        assert bool(info.is_adapting) == (0.99 < max(i - 99, 1) ** -0.5)


@pytest.mark.parametrize("seed", range(10))
def test_finds_a_good_arm_on_noisy_surfaces(space, seed):
    """After 300 rounds the arm is worth >= 90% of the maximum (checked per seed)."""
    f = bump_surface(seed)
    state, _, _ = run_tuner(gp_ucb(space), f, 300, seed)
    h = space.shape[1]
    arm = int(state.arm)
    value = f(space.step_size_unit[arm // h], space.num_steps_unit[arm % h])
    # The issue allows one seed in ten to miss; we record each seed separately and
    # require all ten with these fixed seeds (the slow test below counts misses).
    assert value >= 0.9 * grid_maximum(space, f)


@pytest.mark.slow
def test_finds_a_good_arm_in_9_of_10_fresh_seeds(space):
    hits = 0
    for seed in range(100, 110):
        f = bump_surface(seed)
        state, _, _ = run_tuner(gp_ucb(space), f, 300, seed)
        arm = int(state.arm)
        h = space.shape[1]
        hits += f(space.step_size_unit[arm // h], space.num_steps_unit[arm % h]) >= 0.9 * grid_maximum(space, f)
    assert hits >= 9


def test_distinct_arms_grow_slowly(space):
    """While p_i = 1 (i <= k) nearly every round may try a new arm; afterwards
    growth is sub-linear and the total stays below 3 sqrt(rounds) by 2000 rounds."""
    f = bump_surface(0)
    _, _, arms = run_tuner(gp_ucb(space), f, 2000, 0, lazy=True)
    distinct = np.array([len(set(arms[:i].tolist())) for i in range(1, 2001)])
    rounds = np.arange(1, 2001)
    assert np.all(distinct[1199:] < 3 * np.sqrt(rounds[1199:]))
    assert distinct[-1] - distinct[999] <= 20  # the last 1000 rounds add few arms


def test_nan_and_inf_rewards_are_the_worst_so_far(space):
    tuner = gp_ucb(space)
    state = tuner.init()
    state, info = tuner.update(state, np.nan, 0.5)
    assert float(info.clean_reward) == 0.0 and not bool(info.is_finite)
    for reward in [2.0, 0.5, np.inf, -np.inf, np.nan, 3.0]:
        state, info = tuner.update(state, reward, 0.5)
        if not np.isfinite(reward):
            assert float(info.clean_reward) == 0.5
        assert np.all(np.isfinite(state.grid_variance))
        assert np.all(np.isfinite(tuner.surrogate(state).mean))
        assert np.all(np.isfinite(state.buffer.mean_reward))
    assert float(state.best_reward) == 3.0 and float(state.scale) == pytest.approx(4.0 / 3.0)


def test_negative_rewards_keep_the_ordering(space):
    """A reward such as minus a prediction error: s = alpha / |best| > 0."""
    tuner = gp_ucb(space)
    state = tuner.init()
    state, _ = tuner.update(state, -2.0, 1.0)
    assert float(state.scale) == pytest.approx(2.0)


def test_shapes_and_dtypes_never_change(space):
    tuner = gp_ucb(space, capacity=4)
    state = tuner.init()
    reference = [(np.shape(x), np.asarray(x).dtype) for x in _leaves(state)]
    rng = np.random.default_rng(0)
    for reward in list(rng.normal(size=30)) + [np.nan, np.inf]:
        state, info = tuner.update(state, reward, rng.uniform())
        assert [(np.shape(x), np.asarray(x).dtype) for x in _leaves(state)] == reference
    assert all(np.shape(x) == () for x in info)


def test_freeze_after_stops_moves(space):
    tuner = gp_ucb(space, freeze_after=5)
    state = tuner.init()
    rng = np.random.default_rng(0)
    arms = []
    for _ in range(20):
        state, info = tuner.update(state, rng.uniform(), uniform=0.0)
        arms.append(int(info.next_arm))
        assert bool(info.is_adapting) == (int(info.round) < 5)
    assert len(set(arms[4:])) == 1
    fixed = gp_ucb(space, freeze_after=0, initial_arm=(0.1, 10))
    state = fixed.init()
    for _ in range(5):
        state, info = fixed.update(state, 1.0, 0.0)
    step_size, num_steps = fixed.arm(state)
    assert int(num_steps) == 10 and step_size == pytest.approx(0.1, rel=0.05)


def test_arm_changes_only_when_adapting(space):
    tuner = gp_ucb(space)
    state = tuner.init()
    rng = np.random.default_rng(4)
    for _ in range(200):
        state, info = tuner.update(state, rng.uniform(), rng.uniform())
        if not bool(info.is_adapting):
            assert not bool(info.arm_changed)
        assert bool(info.arm_changed) == (int(info.next_arm) != int(info.arm))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(capacity=0), "capacity"),
        (dict(lengthscale=-1.0), "lengthscale"),
        (dict(noise_variance=0.0), "noise_variance"),
        (dict(alpha=np.nan), "alpha"),
        (dict(delta=1.5), "delta"),
        (dict(schedule="linear"), "schedule"),
        (dict(k=0), "k must"),
        (dict(freeze_after=-1), "freeze_after"),
        (dict(initial_design=-1), "initial_design"),
        (dict(initial_design=1.5), "initial_design"),
        (dict(initial_arm=(0.0, 3)), "initial_arm"),
        (dict(initial_arm=0.1), "initial_arm"),
    ],
)
def test_bad_config_raises(space, kwargs, match):
    with pytest.raises(ValueError, match=match):
        gp_ucb(space, **kwargs)


@pytest.mark.parametrize("lazy", [False, True])
def test_initial_design_proposes_its_arms_first_then_the_ucb(space, lazy):
    """initial_design=3: after rounds 1-3 the arm moves to three arms at the first arm's step size, spread over
    the L columns (both update paths); a design arm the GP has seen is left to the UCB."""
    tuner = gp_ucb(space, initial_design=3, k=50)
    num_l = space.shape[1]
    row = tuner.init().arm // num_l
    design = [row * num_l + round((j + 0.5) / 3 * (num_l - 1)) for j in range(3)]
    assert len({d % num_l for d in design}) == 3 and min(d % num_l for d in design) < num_l // 3
    state = tuner.init()
    for n in range(3):
        state, info = tuner.update(state, 1.0 + 0.1 * n, 0.0, lazy=lazy)
        assert int(info.next_arm) == design[n]
    # a design arm visited before its turn is not proposed again
    seen = tuner.init()._replace(arm=np.int32(design[0]))
    seen, info = tuner.update(seen, 1.0, 0.0, lazy=lazy)
    assert int(info.next_arm) != design[0]


def test_space_must_be_a_search_space():
    with pytest.raises(ValueError, match="space must be a SearchSpace"):
        gp_ucb(((0.1, 1.0), (1, 10)))


def _leaves(tree):
    for x in tree:
        if isinstance(x, tuple):
            yield from _leaves(x)
        else:
            yield x


def test_lazy_update_gives_the_same_states(space):
    """lazy=True (NumPy) skips discarded work and solves over occupied slots: same states (to rounding) through
    adapting, idle and evicting rounds."""
    tuner = gp_ucb(space, capacity=4, k=3)
    rng = np.random.default_rng(11)
    eager = lazy = tuner.init()
    skipped = 0
    for n in range(60):
        reward, uniform = rng.uniform(0.1, 2.0), rng.uniform()
        arm = np.int32(rng.integers(space.num_arms)) if n % 7 == 0 else eager.arm  # forced moves: evictions
        eager, info_e = tuner.update(eager._replace(arm=arm), reward, uniform)
        lazy, info_l = tuner.update(lazy._replace(arm=arm), reward, uniform, lazy=True)
        _assert_same_state(eager, lazy)
        assert int(info_l.next_arm) == int(info_e.next_arm)
        if not bool(info_e.is_adapting):
            assert int(info_l.proposed_arm) == -1
            skipped += 1
        else:
            assert int(info_l.proposed_arm) == int(info_e.proposed_arm)
    assert skipped > 20 and int(info_e.num_arms) == 4  # both paths were exercised


def test_lazy_update_keeps_a_float32_state_float32(space):
    """The eager path rounds its Python-number arithmetic through the state's dtype (float32 here)."""
    tuner = gp_ucb(space, capacity=4, k=3)
    rng = np.random.default_rng(13)
    full = lazy = tuner.init(dtype=np.float32)
    for n in range(30):
        reward, uniform = rng.uniform(0.1, 2.0), rng.uniform()
        arm = np.int32(rng.integers(space.num_arms)) if n % 7 == 0 else full.arm
        full, _ = tuner.update(full._replace(arm=arm), reward, uniform)
        lazy, _ = tuner.update(lazy._replace(arm=arm), reward, uniform, lazy=True)
        _assert_same_state(full, lazy, rtol=1e-4, atol=1e-5)
    assert lazy.grid_variance.dtype == np.float32 and lazy.best_reward.dtype == np.float32


def test_update_with_cond_skips_work_and_keeps_the_state(space):
    """cond= (how traced code skips the eviction downdate and the acquisition) gives identical states;
    the skipped branches are really skipped (counted), and proposed_arm is -1 when not adapting."""
    tuner = gp_ucb(space, capacity=4, k=3)
    rng = np.random.default_rng(12)
    calls = {True: 0, False: 0}

    def cond(pred, true_fn, false_fn, operand):
        calls[bool(pred)] += 1
        return true_fn(operand) if pred else false_fn(operand)

    plain = branched = tuner.init()
    for n in range(60):
        reward, uniform = rng.uniform(0.1, 2.0), rng.uniform()
        arm = np.int32(rng.integers(space.num_arms)) if n % 7 == 0 else plain.arm
        plain, info_p = tuner.update(plain._replace(arm=arm), reward, uniform)
        branched, info_b = tuner.update(branched._replace(arm=arm), reward, uniform, cond=cond)
        for name in TunerState._fields:
            for a, b in zip(_leaves([getattr(plain, name)]), _leaves([getattr(branched, name)])):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
        expected = int(info_p.proposed_arm) if bool(info_p.is_adapting) else -1
        assert int(info_b.proposed_arm) == expected
    assert calls[False] > 20 and calls[True] > 20  # both branches were exercised


@pytest.mark.parametrize("capacity", [6, 64])  # a buffer that evicts often; one with free slots
def test_record_alone_is_the_update_unless_it_needs_a_solve(space, capacity):
    """update = complete(record(...)); when record says no solve is needed (no move, no eviction, no
    pending rewards at a moved arm) its state already is update's, so traced code may skip complete."""
    tuner = gp_ucb(space, capacity=capacity, k=8)
    rng = np.random.default_rng(5)
    state = tuner.init()
    seen = {True: 0, False: 0}
    evicted = False
    for n in range(80):
        reward, uniform = rng.uniform(0.1, 2.0), rng.uniform()
        arm = np.int32(rng.integers(space.num_arms)) if n % 9 == 0 else state.arm
        state = state._replace(arm=arm)
        expected, info = tuner.update(state, reward, uniform)
        recorded, work = tuner.record(state, reward, uniform)
        seen[bool(work.needs_solve)] += 1
        evicted = evicted or bool(work.is_evicting)
        assert bool(work.needs_solve) == bool(work.is_adapting | work.is_evicting | work.is_moved)
        assert bool(work.is_adapting) == bool(info.is_adapting) and bool(work.is_evicting) == bool(info.is_evicting)
        completed, proposed = tuner.complete(recorded, work)
        _assert_same_state(expected, completed, rtol=0, atol=0)
        assert int(proposed) == int(info.proposed_arm)
        if not work.needs_solve:
            _assert_same_state(expected, recorded, rtol=0, atol=0)
        state = expected
    assert seen[True] > 10 and seen[False] > 10  # both cases were exercised
    assert evicted == (capacity == 6)


def _assert_same_state(expected, actual, skip=(), rtol=1e-10, atol=1e-12):
    """Equal up to rounding (lazy solves over the occupied slots only), with the same dtypes and shapes."""
    for name in TunerState._fields:
        if name in skip:
            continue
        for a, b in zip(_leaves((getattr(expected, name),)), _leaves((getattr(actual, name),))):
            a, b = np.asarray(a), np.asarray(b)
            assert (a.dtype, a.shape) == (b.dtype, b.shape), name
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=name)


def test_frozen_tuner_pools_its_rewards_without_solves(space):
    """Once frozen no acquisition reads the grid variance: rounds only pool their rewards (pending_weight grows
    and the variance array passes through untouched), lazy or not; settle() then takes them in exactly as
    one rank-one step per round would have."""
    tuner = gp_ucb(space, capacity=4, k=3, freeze_after=5)
    rng = np.random.default_rng(12)
    full = lazy = stepwise = tuner.init()
    for n in range(20):
        reward, uniform = rng.uniform(0.1, 2.0), rng.uniform()
        before = lazy
        full, info_f = tuner.update(full, reward, uniform)
        lazy, info_l = tuner.update(lazy, reward, uniform, lazy=True)
        stepwise = tuner.settle(tuner.update(stepwise, reward, uniform)[0])  # the variance learns every round
        _assert_same_state(full, lazy)
        assert int(info_l.next_arm) == int(info_f.next_arm) and bool(info_l.is_adapting) == bool(info_f.is_adapting)
        if n + 1 > 5:  # frozen since round 5: the arm stays, nothing to evict or settle
            assert lazy.grid_variance is before.grid_variance and not bool(info_l.is_adapting)
            assert float(lazy.pending_weight) == float(before.pending_weight) + 1.0
    assert float(lazy.pending_weight) >= 15
    np.testing.assert_allclose(tuner.settle(lazy).grid_variance, stepwise.grid_variance, rtol=1e-10, atol=1e-12)
    assert float(np.max(lazy.grid_variance - stepwise.grid_variance)) > 1e-3  # settling had something to do


def test_pooling_changes_no_arm(space):
    """The rewards pooled between acquisitions give the same acquisitions as one variance step per round:
    over 150 noisy rounds with evictions (capacity 6) and moves from outside, the same arms, to rounding."""
    f = bump_surface(3)
    tuner = gp_ucb(space, capacity=6, k=20)
    rng = np.random.default_rng(5)
    h = space.shape[1]
    pooled = stepwise = tuner.init()
    moves = evictions = longest_pool = 0
    for n in range(150):
        arm = int(pooled.arm)
        reward = f(space.step_size_unit[arm // h], space.num_steps_unit[arm % h]) + 0.05 * rng.normal()
        uniform = rng.uniform()
        pooled, info = tuner.update(pooled, reward, uniform, lazy=True)
        stepwise = tuner.settle(tuner.update(stepwise, reward, uniform)[0])
        assert int(pooled.arm) == int(stepwise.arm), n
        moves += bool(info.arm_changed)
        evictions += bool(info.is_evicting)
        longest_pool = max(longest_pool, float(pooled.pending_weight))
        if n % 37 == 36:  # an adapter's exploit step moves the arm without an acquisition
            forced = np.int32(rng.integers(space.num_arms))
            pooled, stepwise = pooled._replace(arm=forced), stepwise._replace(arm=forced)
    np.testing.assert_allclose(tuner.settle(pooled).grid_variance, stepwise.grid_variance, rtol=1e-9, atol=1e-12)
    assert moves > 20 and evictions > 5 and longest_pool >= 3  # all paths exercised


def _long_trajectory_ridge(u, v):
    """A reward that grows with L (a posterior direction only long trajectories cross) and falls off above a
    middle step size (rejections): the shape that left a pooled run on breast cancer at L = 15 of a box
    1..111 (docs/decisions.md, "An initial design for the GP: the default")."""
    u, v = np.asarray(u), np.asarray(v)
    return np.exp(-0.5 * ((u - 0.45) / 0.2) ** 2) * (0.02 + v ** 3)


def _reached_share(initial_design: int, seeds=range(20)) -> np.ndarray:
    """The true value of the last 10 of 50 rounds' arms over the grid's best, per seed, for a GP with the
    Config's defaults started at a short arm of the JAX routes' automatic (log-spaced) box."""
    gp = Config().gp
    space = search_space((0.05, 0.25), (1, 111), log_num_steps=True)
    top = grid_maximum(space, _long_trajectory_ridge)
    out = []
    for seed in seeds:
        tuner = gp_ucb(space, capacity=gp.capacity, lengthscale=gp.lengthscale, noise_variance=POOLED_NOISE_VARIANCE,
                       alpha=gp.alpha, delta=gp.delta, k=25, initial_design=initial_design, initial_arm=(0.12, 3))
        _, values, _ = run_tuner(tuner, _long_trajectory_ridge, 50, seed, noise_sd=0.3, lazy=True)
        out.append(values[-10:].mean() / top)
    return np.array(out)


def test_the_default_initial_design_finds_long_trajectories_the_ucb_alone_misses():
    """With alpha = 8 an unvisited arm's UCB stays below the best arm's scaled mean, so the UCB alone walks
    only near its first arm: from L = 3 it stalls on half the seeds (10 of 20 end within 0.7 of the best).
    The Config's initial design (three L columns first) reaches the long arms on 19 of 20."""
    assert Config().gp.initial_design == 3
    assert (_reached_share(Config().gp.initial_design) > 0.7).sum() >= 17
    assert (_reached_share(0) > 0.7).sum() <= 14
