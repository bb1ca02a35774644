"""The one configuration object: defaults, validation, the paper's preset, the JSON round trip, the docs."""

import math
from pathlib import Path

import pytest

from ahmc.core import Config
from ahmc.core.config import options_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_flat_options_round_trip_through_groups_and_json():
    config = Config().replace(round_length=20, dense_mass="auto", step_size_bounds=(0.01, 0.3),
                              num_steps_bounds=(2, 40), freeze_after="warmup")
    assert config.schedule.round_length == 20 and config.warmup.dense_mass == "auto"
    assert config.box.num_steps_bounds == (2, 40)
    assert Config.from_json(config.to_json()) == config
    assert config.changed() == {"round_length": 20, "dense_mass": "auto", "step_size_bounds": (0.01, 0.3),
                                "num_steps_bounds": (2, 40), "freeze_after": "warmup"}
    assert Config.from_options(config.options()) == config


def test_unknown_option_names_the_nearest_valid_one():
    with pytest.raises(ValueError, match="did you mean 'round_length'"):
        Config().replace(round_lenght=3)
    with pytest.raises(ValueError, match="AdaptiveHMC: unknown option 'capacty'; did you mean 'capacity'"):
        Config.from_options({"capacty": 3}, owner="AdaptiveHMC")


@pytest.mark.parametrize("options, message", [
    ({"num_steps_bounds": (1, 2.5)}, "num_steps_bounds must be a pair of whole numbers"),
    ({"step_size_bounds": (0.1, 0.2)}, "needs num_steps_bounds"),
    ({"step_size_factors": (2.0, 0.5)}, "reversed"),
    ({"round_length": 0}, "round_length must be a whole number > 0"),
    ({"schedule": "linear"}, "schedule must be one of"),
    ({"dense_mass": "yes"}, "dense_mass must be True, False or 'auto'"),
    ({"metric_fraction": 1.0}, "metric_fraction must be in"),
    ({"objective": "ess"}, "objective must be one of"),
    ({"jump_estimate": "proposal"}, "jump_estimate must be 'trajectory'"),
    ({"delta": 1.5}, "delta must be in"),
    ({"freeze_after": -1}, "freeze_after must be"),
    ({"max_integration_time": math.inf}, "max_integration_time must be a finite number"),
])
def test_bad_values_are_refused_with_the_option_named(options, message):
    with pytest.raises(ValueError, match=message):
        Config().replace(**options)


def test_paper_preset_is_algorithm_2_as_published():
    config = Config.paper((0.01, 0.2), (1, 50))
    assert config.box.step_size_bounds == (0.01, 0.2) and config.box.num_steps_bounds == (1, 50)
    assert config.box.log_step_size is False and config.warmup.adapt_mass_matrix is False
    assert config.schedule.k == 100 and config.reward.divergence_penalty == 0.0 and config.gp.alpha == 4.0
    assert config.reward.jump_estimate == "transition" and config.reward.divergence_retry is None


def test_noise_variance_default_follows_the_route():
    assert Config().gp.resolved_noise_variance(one_chain_rounds=False) == 0.1
    assert Config().gp.resolved_noise_variance(one_chain_rounds=True) == 0.5
    assert Config().replace(noise_variance=0.3).gp.resolved_noise_variance(one_chain_rounds=True) == 0.3


def test_a_callable_objective_cannot_be_stored_as_json():
    with pytest.raises(ValueError, match="callable objective"):
        Config().replace(objective=lambda stats, max_num_steps: 1.0).to_json()


def test_options_reference_is_generated_from_the_config():
    assert (ROOT / "docs" / "options.md").read_text() == options_markdown(), (
        "docs/options.md is stale: ./dev run python -m ahmc.core.config > docs/options.md")
    for name in Config.option_names():
        assert f"| `{name}` |" in options_markdown()
