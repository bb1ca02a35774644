"""One configuration for every route: the same defaults, ``config=`` and flat options agree, the paper's preset."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

pytest.importorskip("numpyro")
pytest.importorskip("pymc")
import jax.numpy as jnp  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
import pymc as pm  # noqa: E402

from ahmc.adapters import _jax_engine  # noqa: E402
from ahmc.adapters import numpyro as ahmc_numpyro  # noqa: E402
from ahmc.adapters import pymc as ahmc_pymc  # noqa: E402
from ahmc.core import Config  # noqa: E402


def logdensity(x):
    return -0.5 * jnp.sum(x**2)


def test_the_jax_engine_takes_its_defaults_from_the_config():
    defaults = {name: p.default for name, p in inspect.signature(_jax_engine.build_engine).parameters.items()}
    for name, value in Config().options().items():
        assert defaults[name] == value, f"build_engine's default of {name} is {defaults[name]!r}, the Config's {value!r}"


def test_config_and_flat_options_build_the_same_jax_engine():
    flat = _jax_engine.build_engine(logdensity, num_warmup=500, round_length=7, metric_fraction=0.4)
    config = _jax_engine.build_engine(logdensity, num_warmup=500,
                                      config=Config().replace(round_length=7, metric_fraction=0.4))
    assert flat.config._replace(objective=None) == config.config._replace(objective=None)
    assert flat.config.round_length == 7
    assert flat.config.metric_phase_length == 200
    both = _jax_engine.build_engine(logdensity, num_warmup=500, config=Config().replace(round_length=7),
                                    round_length=5)
    assert both.config.round_length == 5  # a flat option overrides the config's


def test_paper_preset_in_the_jax_engine():
    engine = _jax_engine.build_engine(logdensity, num_warmup=500, paper_preset=True, step_size_bounds=(0.05, 0.5),
                                      num_steps_bounds=(1, 20))
    assert engine.config.metric_phase_length == 0 and engine.config.k == 100
    assert engine.config.jump_estimate == "transition" and not engine.config.adapt_mass_matrix
    assert not engine.tuner.space.log_step_size


def test_pymc_step_reads_config_and_flat_options_alike():
    with pm.Model():
        pm.Normal("x", 0.0, 1.0, shape=2)
        flat = ahmc_pymc.AdaptiveHMC(round_length=7, noise_variance=0.3, target_acceptance_rate=0.9)
        config = ahmc_pymc.AdaptiveHMC(config=Config().replace(round_length=7, noise_variance=0.3,
                                                               target_acceptance_rate=0.9))
        default = ahmc_pymc.AdaptiveHMC()
        paper = ahmc_pymc.AdaptiveHMC(paper_preset=True, step_size_bounds=(0.05, 0.5), num_steps_bounds=(1, 20))
        with pytest.raises(ValueError, match="paper_preset=True needs step_size_bounds"):
            ahmc_pymc.AdaptiveHMC(paper_preset=True)
        with pytest.raises(ValueError, match="restart_lost_chains is not available in PyMC"):
            ahmc_pymc.AdaptiveHMC(restart_lost_chains=False)
        columns = ahmc_pymc.AdaptiveHMC(num_num_steps=8, log_num_steps=False)
        given = ahmc_pymc.AdaptiveHMC(num_num_steps=8, num_steps_bounds=(2, 20))
        with pytest.raises(ValueError, match="num_num_steps must be a whole number > 0"):
            ahmc_pymc.AdaptiveHMC(num_num_steps=0)
    assert columns._l_columns == (8, False) and given._l_columns == (None, False)  # a given range: every L
    assert default._l_columns == (Config().box.num_num_steps, True)  # the JAX routes' automatic box
    for step in (flat, config):
        assert step._round_length == 7 and step._tuner_options["noise_variance"] == 0.3
        assert step.target_accept == 0.9
    assert default._tuner_options["noise_variance"] == 0.5  # one chain's rounds: the Config's rule
    assert default._round_length == Config().schedule.round_length
    assert paper._metric_fraction == 0.0 and paper._k == 100 and paper._jump_estimate == "transition"
    assert not paper._log_step_size and paper._objective is not default._objective  # no divergence penalty


def test_numpyro_kernel_takes_a_config():
    def model():
        numpyro.sample("x", dist.Normal(0.0, 1.0).expand([2]))

    kernel = ahmc_numpyro.AdaptiveHMC(model, config=Config().replace(round_length=7))
    with pytest.raises(ValueError, match="did you mean 'round_length'"):
        ahmc_numpyro.AdaptiveHMC(model, round_lenght=7)
    engine = kernel._build_engine(logdensity, num_warmup=100, **kernel._options)
    assert engine.config.round_length == 7
    assert np.isclose(Config.from_json(Config().replace(round_length=7).to_json()).schedule.round_length, 7)
