"""The warm-up plan every adapter reads: Stan's windows as BlackJAX builds them, the metric phase, k, freezing."""

import math

import numpy as np
import pytest

from ahmc.core.schedule import automatic_box, plan_warmup, stan_schedule, steps_for, warmup_num_steps


@pytest.mark.parametrize("n", [0, 5, 19, 20, 21, 60, 149, 150, 151, 175, 200, 285, 333, 445, 500, 705, 1000, 1345, 1999])
def test_stan_schedule_is_blackjaxs(n):
    from blackjax.adaptation.window_adaptation import build_schedule

    expected = np.asarray(build_schedule(n)).reshape(-1, 2).astype(bool)
    is_slow, is_end = stan_schedule(n)
    np.testing.assert_array_equal(is_slow, expected[:, 0])
    np.testing.assert_array_equal(is_end, expected[:, 1])


def test_plan_of_the_default_warmup():
    plan = plan_warmup(1000, metric_fraction=0.5, round_length=10, adapt_mass_matrix=True, auto_box=True)
    assert (plan.metric_phase_length, plan.num_warmup_rounds, plan.k, plan.freeze_rounds) == (500, 50, 50, None)
    # Stan's 500-iteration windows: buffer 75, slow windows 25, 50, 100, 200 (the last stretched to 250).
    assert np.flatnonzero(plan.is_window_end).tolist() == [99, 149, 249, 449]
    assert plan.first_window_end == 99
    assert plan.is_check[74] and plan.is_check[99] and plan.is_check.sum() == 5
    assert plan_warmup(1000, metric_fraction=0.5, round_length=10, adapt_mass_matrix=True, auto_box=True,
                       freeze_after="warmup").freeze_rounds == 51  # round 50 (warm-up's last) still adapts


def test_plan_without_a_metric_phase_and_its_errors():
    paper = plan_warmup(1000, metric_fraction=0.5, round_length=10, adapt_mass_matrix=False, auto_box=False, k=100)
    assert (paper.metric_phase_length, paper.num_warmup_rounds, paper.k, paper.first_window_end) == (0, 100, 100, -1)
    # A fixed metric still gets a dual-averaging phase when the box is automatic, without windows.
    fixed = plan_warmup(200, metric_fraction=0.5, round_length=10, adapt_mass_matrix=False, auto_box=True)
    assert fixed.metric_phase_length == 100 and not fixed.is_window_end.any() and fixed.is_check.any()
    assert plan_warmup(1, metric_fraction=0.4, round_length=10, adapt_mass_matrix=True,
                       auto_box=True).metric_phase_length == 0  # the JAX engine refuses it, PyMC's tune=0 starts the rounds
    with pytest.raises(ValueError, match="freeze_after must be"):
        plan_warmup(100, metric_fraction=0.5, round_length=10, adapt_mass_matrix=True, auto_box=True,
                    freeze_after="tune!")


def test_step_counts_and_the_automatic_box():
    assert warmup_num_steps(np.asarray([0.1, 1e-6, np.nan, 10.0]), 1.0, 256).tolist() == [10, 256, 1, 1]
    eps_box, upper = automatic_box(np.float32(0.5), (0.5, 2.0), 4 * math.pi, 1024)
    np.testing.assert_allclose(eps_box, [0.25, 1.0])
    assert int(upper) == math.ceil(4 * math.pi / 0.5)
    assert int(automatic_box(np.float32(10.0), (0.5, 2.0), 1.0, 1024)[1]) == 2  # L's upper end is at least 2
    assert int(automatic_box(np.float32(1e-4), (0.5, 2.0), 1.0, 1024, max_num_steps=59)[1]) == 59
    assert (steps_for(1.0, 0.1, 50), steps_for(1.0, 1e-9, 50), steps_for(1.0, 0.0, 50)) == (10, 50, 1)


def test_the_metric_phase_caps_l_until_the_first_window_closes():
    """Core's rule for every route: EARLY_MAX_STEPS up to the plan's first window end, the route's cap after."""
    from ahmc.core.schedule import EARLY_MAX_STEPS, metric_phase_max_steps

    plan = plan_warmup(1000, metric_fraction=0.5, round_length=10, adapt_mass_matrix=True, auto_box=True)
    end = plan.first_window_end
    assert end > 0
    assert [int(metric_phase_max_steps(plan, i, 256)) for i in (0, end, end + 1)] == [EARLY_MAX_STEPS, EARLY_MAX_STEPS, 256]
    assert int(metric_phase_max_steps(plan, 0, 8)) == 8  # a smaller route cap stays
    fixed = plan_warmup(1000, metric_fraction=0.5, round_length=10, adapt_mass_matrix=False, auto_box=True)
    assert int(metric_phase_max_steps(fixed, 0, 256)) == 256  # no mass-matrix windows: no early cap
