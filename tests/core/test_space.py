import numpy as np
import pytest

from ahmc.core.space import check_min_steps_fraction, min_num_steps
from ahmc.core import search_space


def test_grid_shape_and_end_points():
    space = search_space((1e-3, 1.0), (1, 100))
    assert space.shape == (200, 100)
    assert space.num_arms == 20_000
    assert space.step_sizes[0] == 1e-3 and space.step_sizes[-1] == 1.0
    assert np.all(np.diff(space.step_sizes) > 0)
    np.testing.assert_array_equal(space.num_steps, np.arange(1, 101))
    assert space.num_steps.dtype == np.int32


def test_log_grid_is_linear_in_log_and_linear_grid_is_linear():
    log_space = search_space((1e-3, 1.0), (1, 5), num_step_sizes=7)
    np.testing.assert_allclose(np.diff(np.log(log_space.step_sizes)), np.log(10) / 2, rtol=1e-12)
    lin_space = search_space((0.1, 0.7), (1, 5), num_step_sizes=7, log_step_size=False)
    np.testing.assert_allclose(np.diff(lin_space.step_sizes), 0.1, rtol=1e-12)


def test_unit_coordinates_span_the_box():
    space = search_space((0.01, 1.0), (3, 7), num_step_sizes=11)
    np.testing.assert_allclose(space.step_size_unit, np.linspace(0, 1, 11))
    np.testing.assert_allclose(space.num_steps_unit, [0, 0.25, 0.5, 0.75, 1.0])


def test_equal_bounds_fix_a_coordinate():
    space = search_space((0.1, 0.1), (10, 10))
    assert space.shape == (1, 1)
    np.testing.assert_array_equal(space.step_size_unit, [0.0])


def test_arm_index_round_trip():
    space = search_space((1e-3, 1.0), (1, 100))
    a = space.arm_index(space.step_sizes[37], 42)
    assert a // 100 == 37 and space.num_steps[a % 100] == 42
    assert space.arm_index(100.0, 1000) == space.num_arms - 1  # clipped to the box


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(step_size=(1.0, 0.1), num_steps=(1, 10)), "step_size bounds are reversed"),
        (dict(step_size=(0.0, 0.1), num_steps=(1, 10)), "step_size bounds must be > 0"),
        (dict(step_size=(-1.0, 0.1), num_steps=(1, 10)), "step_size bounds must be > 0"),
        (dict(step_size=(0.1, np.inf), num_steps=(1, 10)), "step_size upper bound must be a finite"),
        (dict(step_size=(np.nan, 1.0), num_steps=(1, 10)), "step_size lower bound must be a finite"),
        (dict(step_size=(0.1, 1.0), num_steps=(10, 1)), "num_steps bounds are reversed"),
        (dict(step_size=(0.1, 1.0), num_steps=(0, 10)), "num_steps lower bound must be >= 1"),
        (dict(step_size=(0.1, 1.0), num_steps=(1.5, 10)), "num_steps bounds must be integers"),
        (dict(step_size=0.1, num_steps=(1, 10)), "step_size must be a pair"),
        (dict(step_size=(0.1, 1.0), num_steps=(1, 10), num_step_sizes=0), "num_step_sizes"),
    ],
)
def test_bad_bounds_raise_value_error_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        search_space(**kwargs)


def test_min_num_steps_gives_the_lower_end_of_the_jitter():
    max_steps = np.arange(1, 11)
    np.testing.assert_array_equal(min_num_steps(max_steps, 0.0), np.ones(10))  # the paper's U{1..L}
    np.testing.assert_array_equal(min_num_steps(max_steps, 0.5), [1, 1, 2, 2, 3, 3, 4, 4, 5, 5])  # ceil(L/2)
    np.testing.assert_array_equal(min_num_steps(max_steps, 1.0), max_steps)  # fixed L
    assert int(min_num_steps(np.int64(10), 0.3)) == 3  # 0.3 * 10 = 3.0000000000000004 must not round up
    assert min_num_steps(max_steps.astype(np.int32), 0.5).dtype == np.int32


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan"), "half", None, True])
def test_bad_min_steps_fraction_names_the_argument(value):
    with pytest.raises(ValueError, match=r"min_steps_fraction must be a number in \[0, 1\]"):
        check_min_steps_fraction(value)
    assert check_min_steps_fraction(np.float32(0.5)) == 0.5


def test_automatic_box_columns_of_l_log_spaced_or_even():
    """The automatic box's fixed number of ``L`` columns: log-spaced, they run every L of 1-4 (where a cheap
    model's best arm lies) whatever the box's top; evenly spaced, the old mapping; the inverse finds a column."""
    from ahmc.core.space import grid_num_steps, unit_of_num_steps

    unit = np.linspace(0.0, 1.0, 32)
    for top in (13, 200, 1024):
        log_l = grid_num_steps(unit, 1, top, log=True)
        assert log_l[0] == 1 and log_l[-1] == top and np.all(np.diff(log_l) >= 0)
        assert {1, 2, 3, 4} <= set(log_l.tolist())
        even = grid_num_steps(unit, 1, top, log=False)
        np.testing.assert_array_equal(even, np.maximum(np.round(1 + unit * (top - 1)), 1))
        for num_steps in (1, 2, 7, top):
            for log in (True, False):
                column = int(np.argmin(np.abs(unit - unit_of_num_steps(num_steps, 1, top, log=log))))
                values = grid_num_steps(unit, 1, top, log=log)
                assert abs(int(values[column]) - num_steps) <= max(1, 0.12 * num_steps) * (1 if log else top / 31)
    assert {2, 3} & set(grid_num_steps(unit, 1, 1024, log=False).tolist()) == set()  # even columns skip them


def test_search_space_with_columns_is_the_automatic_box_grid():
    """``num_num_steps`` columns: the GP's unit coordinates are the columns', each runs grid_num_steps; a
    first arm by ``arm_index`` takes the first column of its L (where columns repeat one)."""
    from ahmc.core.space import grid_num_steps

    for log in (True, False):
        space = search_space((0.1, 1.0), (1, 13), num_step_sizes=5, num_num_steps=32, log_num_steps=log)
        assert space.shape == (5, 32) and space.num_steps.dtype == np.int32
        np.testing.assert_array_equal(space.num_steps_unit, np.linspace(0.0, 1.0, 32))
        np.testing.assert_array_equal(space.num_steps, grid_num_steps(space.num_steps_unit, 1, 13, log=log))
        column = space.arm_index(0.1, 2) % 32
        assert space.num_steps[column] == 2 and (column == 0 or space.num_steps[column - 1] == 1)
    assert np.sum(space.num_steps == 1) == 2  # evenly spaced: 32 columns over 13 values
    every = search_space((0.1, 1.0), (1, 13), num_num_steps=None)
    np.testing.assert_array_equal(every.num_steps, np.arange(1, 14))
    with pytest.raises(ValueError, match="num_num_steps must be a whole number > 0"):
        search_space((0.1, 1.0), (1, 13), num_num_steps=-3)
