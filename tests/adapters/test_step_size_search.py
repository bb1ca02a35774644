"""The warm-up's initial step-size search (Hoffman and Gelman's doubling heuristic).

It runs as the warm-up's first iterations, with one leapfrog step each, rather than as BlackJAX's
``find_reasonable_step_size`` in the initial state (a second compiled copy of the transition, 0.1-0.6 s
of every run: docs/decisions.md, "The initial step-size search runs in the warm-up's loop").
"""

import numpy as np
import pytest

pytest.importorskip("blackjax")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from blackjax.adaptation.step_size import dual_averaging_adaptation  # noqa: E402

from ahmc.adapters._jax_warmup import StepSizeSearch, search_step_size  # noqa: E402
from ahmc.adapters.blackjax import run_chains  # noqa: E402

from ..reference import time_major  # noqa: E402

TARGET = 0.8
DA_INIT = dual_averaging_adaptation(TARGET)[0]


def _search(eps, direction, acceptance):
    da_state, search = search_step_size(StepSizeSearch(jnp.asarray(True), jnp.asarray(direction, jnp.int32)),
                                        DA_INIT(jnp.asarray(eps, jnp.float32)), jnp.asarray(acceptance),
                                        TARGET, DA_INIT)
    eps = float(np.exp(np.float64(da_state.log_step_size)))
    return pytest.approx(eps, rel=1e-5), bool(search.active), int(search.direction), da_state


def test_the_search_doubles_above_the_target_halves_below_and_stops_where_it_crosses():
    assert _search(1.0, 0, 0.95)[:3] == (2.0, True, 1)  # first result: above the target, grow
    assert _search(2.0, 1, 0.9)[:3] == (4.0, True, 1)
    assert _search(1.0, 0, 0.2)[:3] == (0.5, True, -1)  # below: shrink
    assert _search(0.5, -1, 0.5)[:3] == (0.25, True, -1)
    eps, active, direction, da_state = _search(0.25, -1, 0.9)  # crossed: stop at the step size just tried
    assert (0.25, False, 0) == (eps, active, direction)
    assert np.isclose(float(da_state.mu), np.log(10 * 0.25), rtol=1e-6)  # dual averaging starts from it
    assert _search(4.0, 1, 0.1)[:3] == (4.0, False, 0)
    eps, active, direction, _ = _search(1e10, 1, 0.99)  # a flat density: inf, where no chain moves
    assert eps == np.inf and (active, direction) == (False, 0)
    assert _search(2.0**-125, -1, 0.1)[:3] == (2.0**-126, True, -1)  # down to the smallest normal float32
    assert _search(2.0**-126, -1, 0.1)[2:3] == (0,)


def test_a_badly_scaled_posterior_is_found_by_halving_with_one_leapfrog_step():
    """N(0, (1e-3)^2 I) from the default first step size 1.0: the warm-up's first iterations take one
    leapfrog step at 1, 1/2, 1/4, ... until the chains accept, then dual averaging starts near the scale
    (without any search it started at 1.0 and spent three times the warm-up's gradients on posteriordb's
    earnings: docs/decisions.md, "The initial step-size search stays")."""
    scale = 1e-3

    def logdensity(x):
        return -0.5 * jnp.sum((x / scale) ** 2)

    positions = scale * jax.random.normal(jax.random.key(3), (4, 5))
    _, info = run_chains(jax.random.key(0), logdensity, positions, 200, 10)
    info = time_major(info)
    steps, eps = np.asarray(info.num_integration_steps), np.asarray(info.step_size)[:, 0]
    searched = int(np.argmax(steps.max(axis=1) > 1))  # the first iteration past the search
    assert 9 <= searched <= 13  # 1 / 2^10 is about the scale
    assert (steps[:searched] == 1).all()
    np.testing.assert_allclose(eps[:searched], 0.5 ** np.arange(searched))
    assert scale / 8 < eps[searched] < 8 * scale
