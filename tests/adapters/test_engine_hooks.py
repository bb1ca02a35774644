"""The JAX engine's options for predictive adaptation: per-chain data, the round-end reward hook
(it must see exactly the round's draws) and super-transitions (rounds of 2B/(L+1) iterations)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ahmc.adapters._jax_engine import build_engine
from ahmc.adapters._jax_run import _scan

from ..reference import assert_moments_match

MEANS = np.array([[-3.0, 0.0, 2.0], [4.0, 1.0, -1.0]], np.float32)  # chain c targets N(MEANS[c], SDS^2)
SDS = np.array([1.0, 0.5, 2.0], np.float32)


def shifted_gaussian(x, mean):
    return -0.5 * jnp.sum(((x - mean) / SDS) ** 2)


MAX_ROUNDS = 4100


def recording_hook(draws, num_draws, hook):
    """Reward: the squared jumps between the round's consecutive draws, summed (chain mean) --
    per round of a fixed leapfrog budget with super-transitions.  Records what it saw."""
    count, sums, nums = hook
    slots = jnp.arange(draws.shape[1])
    total = jnp.sum(jnp.where((slots < num_draws)[None, :, None], draws, 0.0), axis=1)  # (C, D)
    jumps = jnp.sum(jnp.diff(draws, axis=1) ** 2, axis=2)  # (C, M - 1)
    reward = jnp.mean(jnp.sum(jnp.where(slots[1:] < num_draws, jumps, 0.0), axis=1))
    return reward, (count + 1, sums.at[count].set(total), nums.at[count].set(num_draws))


@pytest.mark.parametrize("super_transitions", [None, 30])
def test_round_end_hook_sees_exactly_the_rounds_draws(super_transitions):
    """Also: with chain_data every chain samples its own target (moments after warm-up)."""
    hook0 = (jnp.asarray(0), jnp.zeros((MAX_ROUNDS, 2, 3)), jnp.zeros(MAX_ROUNDS, jnp.int32))
    engine = build_engine(shifted_gaussian, num_warmup=100, chain_data=jnp.asarray(MEANS), round_length=10,
                          round_end_fn=recording_hook, round_end_state=hook0, super_transitions=super_transitions)
    state = engine.init(jnp.zeros((2, 3)), jax.random.key(1))
    num_iterations = 4100
    state, (positions, info) = _scan(engine.step, jax.random.key(2), state, num_iterations, True)
    positions, reward = np.asarray(positions), np.asarray(info.reward[:, 0])  # (T, C, D), (T,)
    count, sums, nums = (np.asarray(v) for v in state.round_end_state)
    ends = np.flatnonzero(np.isfinite(reward))
    starts = np.concatenate([[engine.config.metric_phase_length], ends[:-1] + 1])
    assert count == len(ends) > 10
    for r, (start, end) in enumerate(zip(starts, ends)):
        assert nums[r] == end - start + 1
        np.testing.assert_allclose(sums[r], positions[start:end + 1].sum(axis=0), rtol=1e-5, atol=1e-4)
        expected = np.mean(np.sum(np.diff(positions[start:end + 1], axis=0) ** 2, axis=(0, 2)))
        np.testing.assert_allclose(reward[end], expected, rtol=1e-5)
    for c in range(2):
        draws = positions[100:, c].reshape(2, -1, 3)  # halves of the chain, for R-hat
        assert_moments_match(draws, MEANS[c], SDS, min_ess=150)
    if super_transitions is None:
        assert np.all(nums[:count] == 10)
    else:  # the round's length is set by its arm: 2B/(L+1) rounded up or down
        num_steps = np.asarray(info.num_steps[ends, 0])
        ratio = 2.0 * super_transitions / (num_steps + 1)
        assert np.all((nums[:count] == np.floor(ratio)) | (nums[:count] == np.ceil(ratio)))
        assert np.all(num_steps <= 2 * super_transitions - 1)
        assert len(set(num_steps.tolist())) > 1  # several arms, so several round lengths were tested


def test_hook_options_check_their_input():
    hook0 = (jnp.asarray(0),)
    with pytest.raises(ValueError, match="super_transitions"):
        build_engine(shifted_gaussian, num_warmup=100, super_transitions=0)
    with pytest.raises(ValueError, match="super_transitions"):
        build_engine(shifted_gaussian, num_warmup=100, super_transitions=20, pooled=False)
    with pytest.raises(ValueError, match="num_steps_bounds upper 100 exceeds"):
        build_engine(shifted_gaussian, num_warmup=100, step_size_bounds=(0.1, 1.0), num_steps_bounds=(1, 100),
                     super_transitions=20)
    with pytest.raises(ValueError, match="round_end_fn must be callable"):
        build_engine(shifted_gaussian, num_warmup=100, round_end_fn=1, round_end_state=hook0)
    with pytest.raises(ValueError, match="initial_arm needs a user box"):
        build_engine(shifted_gaussian, num_warmup=100, initial_arm=(0.5, 3))
    engine = build_engine(shifted_gaussian, num_warmup=100, chain_data=jnp.asarray(MEANS[:1]))
    with pytest.raises(ValueError, match="chain_data must have a leading chain axis of size 2"):
        engine.init(jnp.zeros((2, 3)))
    assert math.isfinite(float(engine.init(jnp.zeros((1, 3))).logdensity[0]))


@pytest.mark.parametrize(
    "num_warmup, num_samples, options",
    [
        (100, 57, {}),  # warm-up ends mid-round: a partial round first, whole rounds, a partial last
        pytest.param(80, 40, {"pooled": False}, marks=pytest.mark.slow),  # aligned rounds; one tuner per chain
        pytest.param(60, 13, {"round_length": 1}, marks=pytest.mark.slow),  # every iteration ends a round
        pytest.param(100, 35, {"round_end_fn": recording_hook, "chain_data": jnp.asarray(MEANS), "round_length": 7},
                     marks=pytest.mark.slow),  # ~11 s; hooks and chain data also run in the test above
        pytest.param(100, 75, {"super_transitions": 30}, marks=pytest.mark.slow),  # plain per-iteration scan
    ],
)
def test_scan_draws_gives_what_scanning_step_gives(num_warmup, num_samples, options):
    """``scan_draws`` (no warm-up work, no run-time round-end branch) only changes the cost: the
    same positions and per-iteration info as a scan of ``step`` from the same warmed-up state."""
    if "round_end_fn" in options:
        options = {**options, "round_end_state": (jnp.asarray(0), jnp.zeros((MAX_ROUNDS, 2, 3)),
                                                  jnp.zeros(MAX_ROUNDS, jnp.int32))}
    logdensity = shifted_gaussian if "chain_data" in options else (lambda x: shifted_gaussian(x, MEANS[0]))
    engine = build_engine(logdensity, num_warmup=num_warmup, **options)
    state = engine.init(jnp.asarray(MEANS), jax.random.key(3))
    state, _ = _scan(engine.step, jax.random.key(4), state, num_warmup, False)
    key = jax.random.key(5)
    expected_state, (expected_positions, expected_info) = _scan(engine.step, key, state, num_samples, True)
    new_state, (positions, info) = jax.jit(engine.scan_draws, static_argnums=(2, 3))(
        key, state, num_samples, num_warmup)
    np.testing.assert_allclose(positions, expected_positions, rtol=1e-6, atol=1e-6)
    assert np.isfinite(np.asarray(expected_info.reward)).sum() >= 3  # the tuner did update in between
    for name, expected in expected_info._asdict().items():
        np.testing.assert_allclose(np.asarray(getattr(info, name), float), np.asarray(expected, float),
                                   rtol=1e-6, atol=1e-6, err_msg=name)
    for actual, expected in zip(jax.tree.leaves(new_state), jax.tree.leaves(expected_state)):
        if jnp.issubdtype(expected.dtype, jax.dtypes.prng_key):
            continue
        np.testing.assert_allclose(np.asarray(actual, float), np.asarray(expected, float), rtol=1e-6, atol=1e-6)


def test_dense_whitening_follows_each_mass_matrix_window():
    """dense_mass=True carries the inverse Cholesky factor W of the inverse mass matrix: after every
    window closes W M^-1 W^T = I, so the reward's jumps are measured in the frame the matrix whitens."""
    cov = np.array([[4.0, 1.9, 0.0], [1.9, 1.0, 0.3], [0.0, 0.3, 0.25]])
    precision = jnp.asarray(np.linalg.inv(cov))
    engine = build_engine(lambda x: -0.5 * x @ precision @ x, num_warmup=300, dense_mass=True)
    state = engine.init(jnp.zeros((4, 3)), jax.random.key(0))
    np.testing.assert_allclose(state.whitening, np.eye(3))
    for _ in range(3):  # window ends fall inside each stretch
        state, _ = _scan(engine.step, jax.random.key(int(state.iteration) + 1), state, 100, False)
        imm, w = np.asarray(state.inverse_mass_matrix), np.asarray(state.whitening)
        np.testing.assert_allclose(w @ imm @ w.T, np.eye(3), atol=1e-3)  # float32
    assert abs(imm[0, 1]) > 0.5  # the last window learned the correlation


def test_carried_metric_is_blackjax_dense_metric_without_the_factorisation():
    """The engine's dense metric draws BlackJAX's momenta (to float32 rounding: two separately compiled
    programs may fuse the triangular product differently) from the carried factor and has its kinetic
    energy; the sampling step then holds no Cholesky factorisation (BlackJAX's own metric
    factorises the matrix in every transition where it cannot be moved out of the loop)."""
    from blackjax.mcmc import metrics

    from ahmc.adapters._jax_kernel import carried_metric, inverse_cholesky

    a = np.random.default_rng(0).normal(size=(6, 6))
    imm = jnp.asarray(a @ a.T / 6 + 0.1 * np.eye(6), jnp.float32)
    ours, theirs = carried_metric(imm, inverse_cholesky(imm)), metrics.gaussian_euclidean(imm)
    x = jnp.zeros(6)
    for seed in range(5):
        key = jax.random.key(seed)
        momentum = jax.jit(lambda k: ours.sample_momentum(k, x))(key)
        expected = jax.jit(lambda k: theirs.sample_momentum(k, x))(key)
        np.testing.assert_allclose(momentum, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ours.kinetic_energy(momentum), theirs.kinetic_energy(momentum), rtol=1e-6)

    engine = build_engine(lambda x: -0.5 * x @ (imm @ x), num_warmup=100, dense_mass=True)
    state = engine.init(jnp.zeros((2, 6)), jax.random.key(0))
    lowered = jax.jit(lambda k, s: engine.step(k, s, sampling=True)).lower(jax.random.key(1), state).as_text()
    assert "cholesky" not in lowered.lower()


def test_run_chains_one_program_draws_what_the_two_phases_draw():
    """run_chains compiles initial state, warm-up and draws as one program: the same keys and draws as the
    engine's phases run one by one (eager initial state, the warm-up scan, scan_draws)."""
    import jax
    import jax.numpy as jnp

    from ahmc.adapters import _jax_engine, _jax_run

    def logdensity(x):
        return -0.5 * jnp.sum((x / jnp.array([1.0, 3.0])) ** 2)

    positions = jnp.array([[0.5, -1.0], [1.0, 2.0], [-0.3, 0.1]])
    key = jax.random.key(11)
    samples, info, _ = _jax_run.sample(key, logdensity, positions, 60, 40)
    engine = _jax_engine.build_engine(logdensity, num_warmup=60)
    init_key, warm_key, sample_key = jax.random.split(key, 3)
    state = engine.init(positions, init_key)
    state, warm_info = _jax_run._scan(engine.step, warm_key, state, 60, False)
    state, (draws, sample_info) = _jax_run._scan_draws(engine, sample_key, state, 40, 60)
    np.testing.assert_allclose(np.asarray(samples), np.swapaxes(np.asarray(draws), 0, 1), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(info.num_integration_steps),
                                  np.concatenate([np.asarray(warm_info.num_integration_steps),
                                                  np.asarray(sample_info.num_integration_steps)]))


def test_the_default_reward_is_the_strict_ess_where_a_mass_matrix_gives_the_mean_else_the_papers():
    """objective=None: "normalized_ess" needs the metric phase's mean; without an adapted mass matrix, or
    without a metric phase, the engine falls back to the paper's reward instead of refusing to run."""
    from ahmc.core.objectives import needs_center

    def logdensity(x):
        return -0.5 * jnp.sum(x * x)

    assert needs_center(build_engine(logdensity, num_warmup=100).config.objective)
    box = dict(step_size_bounds=(0.1, 1.0), num_steps_bounds=(1, 5))
    assert not needs_center(build_engine(logdensity, num_warmup=100, adapt_mass_matrix=False, **box).config.objective)
    assert not needs_center(build_engine(logdensity, num_warmup=100, metric_fraction=0.0, **box).config.objective)


def _solves_and_updates(capacity=4):
    """The host and traced solves of a small tuner (:func:`tuner_solves`), and its updates' ``record`` halves
    from random rewards, with an exploit step's outside move of the arm every ninth round."""
    from ahmc.adapters._jax_rounds import tuner_solves
    from ahmc.core import gp_ucb, search_space

    tuner = gp_ucb(search_space((0.05, 1.0), (1, 20), num_step_sizes=30), capacity=capacity, k=12)
    rng = np.random.default_rng(0)
    num_arms = tuner.space.shape[0] * tuner.space.shape[1]

    def record(state, i):
        if i % 9 == 8:
            state = state._replace(arm=np.int32(rng.integers(num_arms)))
        return tuner.record(state, rng.normal(1.0, 0.3), rng.uniform(0.0, 1.2), 4.0)

    return tuner, [tuner_solves(tuner, on_host=on_host) for on_host in (True, False)], record


def test_the_pooled_tuners_solves_on_the_host_give_the_traced_ones(jax_x64):
    """A pooled route's tuner runs its linear algebra on the host (``host_solves=True``, the default): the
    sampling step holds no LAPACK call, and the host's ``complete`` and best arm equal the traced ones on
    every kind of update (adapting, evicting a stored arm, settling an arm moved from outside)."""
    tuner, (host, traced), record = _solves_and_updates()
    host_complete, traced_complete = jax.jit(host[0]), jax.jit(traced[0])
    state, kinds = tuner.init(np, np.float64), set()
    for i in range(40):
        recorded, work = record(state, i)
        kinds |= {name for name in ("is_moved", "is_evicting", "is_adapting") if getattr(work, name)}
        expected, got = traced_complete(recorded, work), host_complete(recorded, work)
        assert int(got.arm) == int(expected.arm)
        for name in ("grid_variance", "pending_weight"):
            np.testing.assert_allclose(getattr(got, name), getattr(expected, name), rtol=1e-9, atol=1e-12)
        assert int(jax.jit(host[1])(got)) == int(jax.jit(traced[1])(got))
        state = jax.tree.map(np.asarray, expected)
    assert kinds == {"is_moved", "is_evicting", "is_adapting"}

    engine = build_engine(lambda x: -0.5 * jnp.sum(x ** 2), num_warmup=100)
    lowered = jax.jit(lambda k, s: engine.step(k, s, sampling=True)).lower(
        jax.random.key(1), engine.init(jnp.zeros((2, 3)), jax.random.key(0))).as_text()
    assert "lapack" not in lowered and "python_cpu_callback" in lowered


def test_host_solves_run_inside_an_enable_x64_block():
    """JAX casts a callback's outputs under the process-wide precision, so inside ``with
    jax.enable_x64(True)`` (the process in float32) the solves stay traced instead of failing."""
    tuner, (host, traced), record = _solves_and_updates()
    host_complete, traced_complete = jax.jit(host[0]), jax.jit(traced[0])
    with jax.enable_x64(True):
        state = tuner.init(np, np.float64)
        for i in range(4):
            recorded, work = record(state, i)
            expected = traced_complete(recorded, work)
            got = host_complete(recorded, work)
            assert got.grid_variance.dtype == jnp.float64 and int(got.arm) == int(expected.arm)
            state = jax.tree.map(np.asarray, got)
        assert int(jax.jit(host[1])(state)) == int(jax.jit(traced[1])(state))
