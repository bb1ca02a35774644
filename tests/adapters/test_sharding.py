"""Chains sharded over devices: the same run, the output sharded, no forced rematerialization.

JAX fixes its device count when it starts, so the runs happen in a subprocess
(``sharding_worker.py``) with 8 simulated CPU devices; the multi-host test starts two
``jax.distributed`` processes on localhost (CPU collectives over gloo), one device each.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ahmc.adapters._jax_sharding import check_chains_divide
from tests.reference import assert_moments_match

WORKER = Path(__file__).with_name("sharding_worker.py")
ROOT = Path(__file__).resolve().parents[2]
SCALES = np.arange(1.0, 6.0)


def _start(out, *extra):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, str(WORKER), str(out), *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(process, timeout=600):
    log, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, log[-3000:]
    return log


@pytest.fixture(scope="module")
def eight_devices(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharding") / "runs.json"
    log = _finish(_start(out))
    return json.loads(out.read_text()), log


def _arrays(run):
    return [np.asarray(a) for a in run[0]]  # samples (chains, draws, d), step size and L (chains, iterations)


def test_two_devices_give_the_unsharded_run(eight_devices):
    runs, _ = eight_devices
    (samples_one, eps_one, steps_one), (samples_two, eps_two, steps_two) = _arrays(runs["one"]), _arrays(runs["two"])
    np.testing.assert_array_equal(steps_two, steps_one)  # the same arms, iteration by iteration
    # float32 (JAX's default): the two programs' fusions round differently in the last bits, and the chains
    # carry that on for 700 iterations (up to 2e-4 seen); in float64 the runs are equal to the bit (checked
    # with JAX_ENABLE_X64=1). A different run would differ by the posterior's scale, 0.1-5
    np.testing.assert_allclose(eps_two, eps_one, rtol=1e-4)
    np.testing.assert_allclose(samples_two, samples_one, rtol=0, atol=2e-3)


def test_output_stays_sharded_along_the_chain_axis(eight_devices):
    runs, _ = eight_devices
    assert runs["one"][1] == ["unsharded", "unsharded"]
    assert runs["all"][1] == ["P('chains',)", "P('chains',)"]


def test_numpyro_vectorized_chains_stay_sharded(eight_devices):
    runs, _ = eight_devices
    assert runs["numpyro"] == ["P('chains',)", "P('chains',)", [16, 100, 5]]


def test_rmhmc_chains_and_the_adaptation_routine_stay_sharded(eight_devices):
    runs, _ = eight_devices
    assert runs["adaptation"] == "P('chains',)"  # gpucb_adaptation(...).run's final positions
    spec, sds = runs["rmhmc"]
    assert spec == "P('chains',)"
    np.testing.assert_allclose(sds, SCALES, rtol=0.35)  # 16 x 100 draws: a coarse check that it samples


def test_eight_devices_sample_the_target(eight_devices):
    """Over 8 devices (2 chains each) the chain sums group differently, so the floats, and after a few
    iterations the chaotic chains, part from the unsharded run's; the first iterations agree, and the
    draws have the target's moments."""
    runs, _ = eight_devices
    one, every = _arrays(runs["one"]), _arrays(runs["all"])
    np.testing.assert_allclose(every[1][:, :3], one[1][:, :3], rtol=1e-5)
    assert_moments_match(every[0], 0.0, SCALES)


def test_no_forced_rematerialization(eight_devices):
    _, log = eight_devices
    assert "Involuntary full rematerialization" not in log


def test_chain_count_must_divide_over_the_devices(eight_devices):
    runs, _ = eight_devices
    assert "6 chains do not divide over 8 devices" in runs["error"]
    with pytest.raises(ValueError, match=r"run_chains: 10 chains do not divide over 4 devices.*e\.g\. 8 or 12"):
        check_chains_divide(10, 4, "run_chains")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_give_the_one_process_run(eight_devices, tmp_path):
    """Two ``jax.distributed`` processes, one device and 8 chains each: one tuner (each process's copy equal)
    and the draws of the single-process run over two devices."""
    out = tmp_path / "hosts.json"
    address = f"localhost:{_free_port()}"
    workers = [_start(out, "--devices", "1", "--process-id", str(i), "--coordinator", address) for i in (0, 1)]
    for worker in workers:
        _finish(worker)
    hosts = json.loads(out.read_text())
    other = json.loads(Path(f"{out}.1").read_text())
    for a, b in zip(hosts["tuner"], other["tuner"]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert hosts["all"][1] == ["P('chains',)", "P('chains',)"]
    for single, multi in zip(_arrays(eight_devices[0]["two"]), _arrays(hosts["all"])):
        np.testing.assert_allclose(multi, single, rtol=0, atol=1e-5)


def _gaussian(x):
    import jax.numpy as jnp

    return -0.5 * jnp.sum((x / jnp.asarray(SCALES[:3])) ** 2)


def test_many_short_chains_sample_the_target():
    """8 superchains x 16 chains x (300 warm-up + 100 draws), from dispersed starts: the superchains agree
    (nested R-hat) and the draws have the target's moments."""
    import jax

    from ahmc.adapters.blackjax import run_many_chains

    starts = 3.0 * jax.random.normal(jax.random.key(3), (8, 3))
    samples, info, rhat = run_many_chains(jax.random.key(0), _gaussian, starts, 16, 300, 100)
    assert samples.shape == (128, 100, 3) and info.step_size.shape == (128, 400)
    assert rhat.shape == (3,) and np.all(rhat < 1.05), rhat
    assert_moments_match(samples, 0.0, SCALES[:3], max_rhat=1.05)


@pytest.mark.slow  # keeps the default suite under 15 minutes; the agreeing direction runs by default
def test_nested_rhat_flags_superchains_in_different_modes():
    """Two modes 20 sds apart, half the superchains started in each: no chain crosses, and nested R-hat says so."""
    import jax
    import jax.numpy as jnp

    from ahmc.adapters.blackjax import run_many_chains

    def two_modes(x):
        return jnp.logaddexp(-0.5 * jnp.sum((x - 10.0) ** 2), -0.5 * jnp.sum((x + 10.0) ** 2))

    starts = jnp.repeat(jnp.array([[10.0, 10.0], [-10.0, -10.0]]), 2, axis=0)
    _, _, rhat = run_many_chains(jax.random.key(0), two_modes, starts, 8, 200, 50, restart_lost_chains=False)
    assert np.all(rhat > 1.5), rhat


def test_many_chains_refuses_bad_layouts():
    from ahmc.adapters.blackjax import run_many_chains

    with pytest.raises(ValueError, match="chains_per_superchain must be a positive integer"):
        run_many_chains(None, _gaussian, np.zeros((4, 3)), 0)
    with pytest.raises(ValueError, match="starts has 1 superchain"):
        run_many_chains(None, _gaussian, np.zeros((1, 3)), 4)
