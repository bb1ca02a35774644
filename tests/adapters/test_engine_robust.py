"""The JAX engine's warm-up against a lost chain (issue #4).

A chain that starts in (or falls into) a local mode of negligible mass has an
acceptance rate near 0 at any step size the other chains can use; with the
step size's dual averaging pooled over chains it used to drag the shared step
size down by orders of magnitude and never leave (posteriordb
``low_dim_gauss_mix`` through NumPyro: R-hat 1.56, eps 4e-4).  The trap below
is a N(0, I) target plus a narrow bump far away (peak log density -60, width
0.01): its mass (~1e-31) is negligible, so the truth is N(0, I), but a chain
started on it cannot climb out.
"""

import warnings

import numpy as np
import pytest

pytest.importorskip("numpyro")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

from ahmc.adapters._jax_warmup import WindowStats, _warn_host, climbing, far_below, lost_chains  # noqa: E402
from ahmc.adapters.blackjax import run_chains  # noqa: E402
from ahmc.adapters.numpyro import AdaptiveHMC  # noqa: E402

from ..reference import assert_moments_match, time_major  # noqa: E402

DIM = 3
TRAP = 8.0  # the bump sits at (8, 8, 8)


def trapped_logdensity(x):
    main = -0.5 * jnp.sum(x**2)
    bump = -60.0 - 0.5 * jnp.sum((x - TRAP) ** 2) / 0.01**2
    return jnp.logaddexp(main, bump)


def trapped_start(num_chains):
    """Uniform(-2, 2) starts, except chain 1, which starts on the bump."""
    positions = np.random.default_rng(0).uniform(-2.0, 2.0, size=(num_chains, DIM))
    positions[1] = TRAP
    return jnp.asarray(positions)


@pytest.mark.slow  # ~20 s; the engine's own restart test stays; default run under 15 min (2026-11-28)
def test_numpyro_vectorized_chains_recover_from_a_trapped_chain():
    kernel = AdaptiveHMC(potential_fn=lambda x: -trapped_logdensity(x))
    mcmc = MCMC(kernel, num_warmup=400, num_samples=1000, num_chains=4, chain_method="vectorized",
                progress_bar=False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")  # a lost chain left at the end of warm-up would warn
        mcmc.warmup(jax.random.key(3), init_params=trapped_start(4), collect_warmup=True,
                    extra_fields=("restarted",))
        restarted = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["restarted"])
        mcmc.run(mcmc.post_warmup_state.rng_key, extra_fields=("step_size",))
    assert not [w for w in record if str(w.message).startswith("ahmc:")]
    # The sample stat `restarted` shows the trapped chain (and only it) being moved in warm-up.
    assert restarted.shape == (4, 400) and restarted[1].any() and not restarted[[0, 2, 3]].any()
    draws = np.asarray(mcmc.get_samples(group_by_chain=True))
    # Every chain, the trapped one included, samples N(0, I).
    assert_moments_match(draws, np.zeros(DIM), np.ones(DIM))
    # The shared step size did not collapse: ~1 on N(0, I), 0.014 when the trapped chain dragged it.
    step_size = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["step_size"])
    assert np.all(step_size > 0.3)


@pytest.mark.slow  # ~18 s; default run under 15 min (2026-11-28)
def test_two_chains_cannot_restart_but_warn():
    """With 2 chains the median cannot tell which chain is lost: no restart, a warning instead."""
    with pytest.warns(UserWarning, match=r"chain\(s\) \[1\]"):
        samples, info = run_chains(jax.random.key(4), trapped_logdensity, trapped_start(2), 150, 10)
        info = time_major(info)  # run_chains: (chains, iterations)
        np.asarray(samples)  # wait for the host callback
    assert not np.asarray(info.restarted).any()
    assert np.allclose(np.asarray(samples)[1], TRAP, atol=0.1)  # still trapped


def window(means, sds, acceptance, count=50, rises=None):
    """Window sums of chains with these means, sds and linear rises over the window (default flat)."""
    means, sds = np.asarray(means, float), np.asarray(sds, float)
    rises = np.zeros_like(means) if rises is None else np.asarray(rises, float)
    t = np.arange(1, count + 1)
    # A linear ramp of total rise R plus noise of sd sqrt(sd^2 - R^2 / 12) about it (exact sums).
    trend = means[:, None] + rises[:, None] * ((t - (count + 1) / 2) / count)[None, :]
    noise_var = np.maximum(sds**2 - (trend - means[:, None]).var(axis=1), 0.0)
    return WindowStats(jnp.asarray(count, jnp.int32), jnp.asarray(trend.sum(axis=1)),
                       jnp.asarray((trend**2).sum(axis=1) + noise_var * count),
                       jnp.asarray(np.asarray(acceptance, float) * count), jnp.asarray((trend * t).sum(axis=1)))


def test_lost_chains_rule():
    # Chains 1 and 2 of the gauss_mix failure: ~420 nats below, flat, log density sd ~2.
    flags = lost_chains(window([-2105, -2530, -2525, -2104], [2, 1, 1, 2], [0.8] * 4))
    np.testing.assert_array_equal(np.asarray(flags), [False, True, True, False])
    # The same gap while climbing 200 nats over the window: a slow start, left alone (but still far below).
    climbing_window = window([-2105, -2530, -2525, -2104], [2, 60, 1, 2], [0.8] * 4, rises=[0, 200, 0, 0])
    np.testing.assert_array_equal(np.asarray(climbing(climbing_window)), [False, True, False, False])
    np.testing.assert_array_equal(np.asarray(lost_chains(climbing_window)), [False, False, True, False])
    np.testing.assert_array_equal(np.asarray(far_below(climbing_window)), [False, True, True, False])
    # Climbing ~4 nats per iteration, ~215 below the median: in time if 100 iterations remain, too late if 20.
    np.testing.assert_array_equal(np.asarray(lost_chains(climbing_window, remaining=100)), [False, False, True, False])
    np.testing.assert_array_equal(np.asarray(lost_chains(climbing_window, remaining=20)), [False, True, True, False])
    # Far below on average but arrived by the end of the window (current log density): not lost.
    trapped = window([-2105, -2530, -2525, -2104], [2, 1, 1, 2], [0.8] * 4)
    now = jnp.asarray([-2105.0, -2106.0, -2525.0, -2104.0])
    np.testing.assert_array_equal(np.asarray(lost_chains(trapped, now)), [False, False, True, False])
    # Healthy chains differing by a few sds, a chain on a high spike, and a gap below 10 nats are left alone.
    assert not np.asarray(lost_chains(window([-500, -520, -505, -510], [22, 22, 22, 22], [0.8] * 4))).any()
    assert not np.asarray(lost_chains(window([-5, -5, 300, -6], [1, 1, 1, 1], [0.8] * 4))).any()
    assert not np.asarray(lost_chains(window([-1, -1, -9, -1], [0.1] * 4, [0.8] * 4))).any()


@pytest.mark.slow  # ~16 s; default run under 15 min (2026-11-28)
def test_the_engine_gives_the_rule_its_deadline(monkeypatch):
    """The warm-up's chain checks pass the metric-phase iterations left, so slow arrivals count as lost."""
    from ahmc.adapters import _jax_warmup

    deadlines = []

    def spy(window, logdensity=None, remaining=None):
        deadlines.append(remaining)
        return lost_chains(window, logdensity, remaining)

    monkeypatch.setattr(_jax_warmup, "lost_chains", spy)
    run_chains(jax.random.key(5), lambda x: -0.5 * jnp.sum(x**2), trapped_start(4), 200, 10)
    assert deadlines and all(remaining is not None for remaining in deadlines)


def test_stuck_chain_warning_names_the_chain():
    with pytest.warns(UserWarning, match=r"chain\(s\) \[2\] accepted almost no proposals"):
        _warn_host(np.zeros(3, bool), np.array([0.8, 0.7, 0.01]), np.zeros(3))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _warn_host(np.zeros(3, bool), np.array([0.8, 0.7, 0.6]), np.zeros(3))
    assert not record


def test_a_collapsed_step_size_is_reported():
    """A step size that collapsed (the chains accept everything and move nowhere: no stuck-chain warning would
    fire) is named, with its causes; an ordinary one is not. Before non-finite energies were rejected one
    float32 chain of eight schools ended warm-up at 6.6e-11, all its draws at one point, in silence."""
    accepting = (np.zeros(2, bool), np.array([1.0, 1.0]), np.zeros(2))
    with pytest.warns(UserWarning, match=r"step size collapsed to 6\.6e-11 .* barely move"):
        _warn_host(*accepting, True, 6.6e-11, 6.6e-11)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _warn_host(*accepting, True, 1e-4, 0.3)  # tiny scales, ordinary step: the metric absorbed the scale
    assert not record


def test_early_warmup_ignores_a_trapped_chain_and_caps_the_trajectories():
    """Before the first mass-matrix window closes, the pooled dual averaging follows the median chain
    and L = ceil(T_w / eps) is capped at EARLY_MAX_STEPS.  With the mean, the chain on the bump (width
    0.01) pulled the shared step size of the N(0, I) chains to 0.025 (three seeds; 0.88-0.92 with the
    median) and their trajectories to 30 steps on average; and a posterior with sd 0.01 under the
    initial identity metric asked for L = 200 per iteration until the first window."""
    from blackjax.adaptation.window_adaptation import build_schedule

    from ahmc.core.schedule import EARLY_MAX_STEPS

    num_warmup = 400
    first_window_end = int(np.argmax(np.asarray(build_schedule(num_warmup // 2))[:, 1]))  # metric_fraction 0.5
    early = slice(10, first_window_end + 1)  # after dual averaging's first moves
    _, info = run_chains(jax.random.key(5), trapped_logdensity, trapped_start(4), num_warmup, 10)
    info = time_major(info)  # run_chains: (chains, iterations)
    assert np.median(np.asarray(info.step_size)[early]) > 0.3
    assert np.asarray(info.num_integration_steps)[early].mean() < 8

    def narrow(x):
        return -0.5 * jnp.sum((x / 0.01) ** 2)

    _, info = run_chains(jax.random.key(5), narrow, jnp.asarray(0.01 * trapped_start(4)), num_warmup, 10)
    info = time_major(info)  # run_chains: (chains, iterations)
    steps = np.asarray(info.num_integration_steps)
    assert steps[: first_window_end + 1].max() <= EARLY_MAX_STEPS  # without the cap: ~200
    assert np.median(np.asarray(info.step_size)[first_window_end + 50: num_warmup // 2]) > 0.3  # metric learned


def test_a_warning_made_an_error_does_not_abort_the_run(caplog):
    """Under a filter that makes warnings errors (pytest's ``filterwarnings = error``) the end-of-warm-up
    warning, raised from inside the compiled run, aborted it (JAX: "INTERNAL: CpuCallback error", every draw
    lost). Now the run finishes and the message goes to the ``ahmc`` logger."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        samples, _ = run_chains(jax.random.key(0), lambda x: 0.0 * jnp.sum(x), jnp.zeros((4, 2)), 300, 10)
    assert samples.shape == (4, 10, 2)
    assert "improper posterior" in caplog.text
