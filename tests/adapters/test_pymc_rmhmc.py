"""AdaptiveRMHMC (Riemann-manifold HMC tuned by GP-UCB) as a PyMC step method.

The integrator is checked on its own (SoftAbs derivative, dH/dx, reversibility, volume),
then the sampler against exact moments (a 2-d Gaussian with correlation 0.99, Neal's funnel)
and a long NUTS run (Pima logistic regression with the Fisher metric).
"""

from __future__ import annotations

import numpy as np
import pytest

pm = pytest.importorskip("pymc")

from pymc.step_methods.hmc.quadpotential import QuadPotentialFull  # noqa: E402

from ahmc.adapters import _riemann  # noqa: E402
from ahmc.adapters.diagnostics import history_from_datatree  # noqa: E402
from ahmc.adapters.pymc import (  # noqa: E402
    RMHMC_STATS,
    STATS,
    AdaptiveHMC,
    AdaptiveRMHMC,
    constant_metric,
    fisher_logistic_metric,
)
from ahmc.core.diagnostics import replay  # noqa: E402
from tests.reference import (  # noqa: E402
    assert_moments_match,
    bulk_ess,
    load_pima_logistic_reference,
    split_rhat,
    zscores_against_reference,
)

from ..core.test_diagnostics import assert_same_tuner  # noqa: E402

RHO = 0.99
COV = np.array([[1.0, RHO], [RHO, 1.0]])
FUNNEL_DIM = 10  # v and 9 x's
QUIET = dict(progressbar=False, compute_convergence_checks=False)


def correlated_gaussian():
    with pm.Model() as model:
        pm.MvNormal("x", np.zeros(2), COV)
    return model


def funnel():
    """Neal's funnel: v ~ N(0, sd 3), x_i | v ~ N(0, sd exp(v / 2)), i = 1..9."""
    with pm.Model() as model:
        v = pm.Normal("v", 0.0, 3.0)
        pm.Normal("x", 0.0, pm.math.exp(v / 2), shape=FUNNEL_DIM - 1)
    return model


def funnel_draws(rng, chains):
    """Exact draws, as starting points: PyMC does not jitter the start of a user-given step, and
    the funnel's default start x = 0 sits where its Hessian is singular (SoftAbs metric ~ 1/alpha)."""
    points = []
    for _ in range(chains):
        v = rng.normal(0.0, 3.0)
        points.append({"v": v, "x": rng.normal(0.0, np.exp(v / 2), size=FUNNEL_DIM - 1)})
    return points


# ---- the integrator --------------------------------------------------------------------------

@pytest.mark.parametrize("soften", ["softabs", "diagonal_softabs"])
@pytest.mark.parametrize("alpha", [2.0, 1e6])
def test_softabs_derivative_matches_finite_differences(alpha, soften):
    rng = np.random.default_rng(0)
    d = 4
    base, slopes = rng.normal(size=(d, d)), rng.normal(size=(d, d, d))
    base, slopes = base + base.T, slopes + slopes.transpose(0, 2, 1)  # H(x) = base + sum_k x_k slopes_k

    def metric(x):
        return getattr(_riemann, soften)(base + np.tensordot(x, slopes, 1), slopes, alpha)

    x = rng.normal(size=d) * 0.1
    G, dG = metric(x)
    hessian = base + np.tensordot(x, slopes, 1)
    lam = np.diag(hessian) if soften == "diagonal_softabs" else np.linalg.eigvalsh(hessian)
    assert np.all(np.linalg.eigvalsh(G) > 0)
    if soften == "diagonal_softabs":
        assert np.count_nonzero(G - np.diag(np.diag(G))) == 0 and np.any(lam < 0)
    if alpha == 1e6:  # far from lam = 0, SoftAbs is |H| (of the diagonal: |H_ii|)
        np.testing.assert_allclose(np.sort(np.linalg.eigvalsh(G)), np.sort(np.abs(lam)), rtol=1e-8)
    h = 1e-6
    numeric = np.stack([(metric(x + h * e)[0] - metric(x - h * e)[0]) / (2 * h) for e in np.eye(d)])
    np.testing.assert_allclose(dG, numeric, atol=1e-6 * max(1.0, np.abs(numeric).max()))


@pytest.fixture(scope="module")
def one_iteration_funnel_step():
    """A funnel step allowed a single fixed-point iteration (compiled once for this module)."""
    with funnel() as model:
        step = AdaptiveRMHMC(max_fixed_point_iterations=1)
    return model, step


@pytest.fixture(scope="module")
def funnel_evaluate(one_iteration_funnel_step):
    """The compiled SoftAbs geometry of the funnel (PyTensor derivatives up to third order)."""
    return one_iteration_funnel_step[1].integrator._evaluate


def start_point(evaluate, seed):
    rng = np.random.default_rng(seed)
    (point,) = funnel_draws(rng, 1)
    geom = evaluate(np.concatenate([[point["v"]], point["x"]]))
    return geom, _riemann.sample_momentum(geom, rng)


def test_position_force_is_the_gradient_of_the_hamiltonian(funnel_evaluate):
    geom, p = start_point(funnel_evaluate, 1)
    h = 1e-6
    numeric = np.array([(_riemann.hamiltonian(funnel_evaluate(geom.position + h * e), p)
                         - _riemann.hamiltonian(funnel_evaluate(geom.position - h * e), p)) / (2 * h)
                        for e in np.eye(FUNNEL_DIM)])
    np.testing.assert_allclose(_riemann.position_force(geom, p), numeric, rtol=1e-5, atol=1e-6)


def leapfrog(evaluate, geom, p, eps, steps, tol=1e-12):
    for _ in range(steps):
        result = _riemann.generalized_leapfrog(evaluate, geom, p, eps, tol, 100)
        assert result.converged
        geom, p = result.geometry, result.momentum
    return geom, p


def test_position_solve_uses_the_cached_derivative_and_finds_the_plain_solution(funnel_evaluate):
    geom, p = start_point(funnel_evaluate, 4)
    direction, h = np.linspace(-1.0, 1.0, FUNNEL_DIM), 1e-6
    numeric = (_riemann.velocity(funnel_evaluate(geom.position + h * direction), p)
               - _riemann.velocity(funnel_evaluate(geom.position - h * direction), p)) / (2 * h)
    derivative = _riemann.velocity_derivative(geom, _riemann.velocity(geom, p), direction)
    np.testing.assert_allclose(derivative, numeric, rtol=1e-5, atol=1e-7)
    chord_total = plain_total = 0
    for seed in range(5, 15):
        geom, p = start_point(funnel_evaluate, seed)
        result = _riemann.generalized_leapfrog(funnel_evaluate, geom, p, 0.2, 1e-10, 100)
        # the plain iteration x' <- x + eps/2 (G(x)^-1 + G(x')^-1) p' from x, with the same p'
        p_half = p - 0.1 * _riemann.position_force(geom, p)
        for _ in range(200):
            p_half = p - 0.1 * _riemann.position_force(geom, p_half)
        guess, plain_evaluations = geom.position, 0
        for _ in range(100):
            plain_evaluations += 1
            update = geom.position + 0.1 * (_riemann.velocity(geom, p_half)
                                            + _riemann.velocity(funnel_evaluate(guess), p_half))
            if np.max(np.abs(update - guess)) < 1e-12:
                break
            guess = update
        assert result.converged
        np.testing.assert_allclose(result.geometry.position, guess, atol=1e-8)
        chord_total, plain_total = chord_total + result.num_evaluations, plain_total + plain_evaluations
    assert chord_total < 0.75 * plain_total, (chord_total, plain_total)


def test_generalized_leapfrog_is_reversible(funnel_evaluate):
    geom, p = start_point(funnel_evaluate, 2)
    end, q = leapfrog(funnel_evaluate, geom, p, 0.1, 10)
    assert np.abs(end.position - geom.position).max() > 0.05  # it went somewhere
    back, r = leapfrog(funnel_evaluate, end, -q, 0.1, 10)
    np.testing.assert_allclose(back.position, geom.position, atol=1e-8)
    np.testing.assert_allclose(-r, p, atol=1e-8 * max(1.0, np.abs(p).max()))
    # and it nearly conserves H (second-order integrator): the error shrinks ~4x when eps halves
    h0 = _riemann.hamiltonian(geom, p)
    errors = [abs(_riemann.hamiltonian(*leapfrog(funnel_evaluate, geom, p, eps, int(round(0.4 / eps)))) - h0)
              for eps in (0.05, 0.025)]
    assert errors[1] < errors[0] / 2.5


def test_generalized_leapfrog_preserves_volume(funnel_evaluate):
    geom, p = start_point(funnel_evaluate, 3)
    d, h = FUNNEL_DIM, 1e-5

    def flow(z):
        end, q = leapfrog(funnel_evaluate, funnel_evaluate(z[:d]), z[d:], 0.1, 3)
        return np.concatenate([end.position, q])

    z = np.concatenate([geom.position, p])
    jac = np.stack([(flow(z + h * e) - flow(z - h * e)) / (2 * h) for e in np.eye(2 * d)], axis=1)
    sign, logdet = np.linalg.slogdet(jac)
    assert sign == 1 and abs(logdet) < 1e-4


# ---- correctness -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gaussian_run():
    """Two chains on the 2-d Gaussian with correlation 0.99, warm-up kept (SoftAbs metric)."""
    with correlated_gaussian():
        step = AdaptiveRMHMC()
        tree = pm.sample(tune=1000, draws=2000, chains=2, cores=1, step=step, random_seed=7,
                         discard_tuned_samples=False, **QUIET)
    return tree, step


def test_correlated_gaussian_moments(gaussian_run):
    tree, _ = gaussian_run
    x = tree.posterior["x"].values
    # the coordinates and the principal axes (sd sqrt(1.99) and sqrt(0.01)): checks the correlation too
    rotated = np.stack([x[..., 0] + x[..., 1], x[..., 0] - x[..., 1]], axis=-1) / np.sqrt(2)
    values = np.concatenate([x, rotated], axis=-1)
    assert_moments_match(values, np.zeros(4), np.sqrt([1.0, 1.0, 1 + RHO, 1 - RHO]))


def test_stats_and_tuning_history_from_the_datatree(gaussian_run):
    tree, step = gaussian_run
    stats = tree.sample_stats
    for name, dtype, _, _ in STATS + RMHMC_STATS:
        if name == "warning":
            continue
        name = {"model_logp": "lp"}.get(name, name)
        assert name in stats and stats[name].dtype == np.dtype(dtype), name
    assert stats["fixed_point_converged"].values.all()  # a constant Hessian: G is exact, nothing to solve
    # every leapfrog step evaluates once (the fixed point in x converges at its first iterate), and the
    # draw's geometry is kept for the next iteration
    np.testing.assert_array_equal(stats["n_grad_evals"].values, stats["n_steps"].values)
    history = history_from_datatree(tree)
    assert history.num_tuners == 2 and history.warmup_known and not history.pooled
    assert_same_tuner(replay(history, tuner=1), step._tuner_state)  # the last chain's tuner, rebuilt


def funnel_values(tree):
    """v and, for each x_i, sign(x_i) |x_i|^(1/2): E[x_i^2] = E[exp(v)] has a heavy tail (its MCSE
    is unreliable), while sign(x)|x|^(1/2) has mean 0 and variance E|x| = sqrt(2/pi) exp(9/8)."""
    x = tree.posterior["x"].values
    return tree.posterior["v"].values, np.sign(x) * np.sqrt(np.abs(x))


FUNNEL_ROOT_SD = np.sqrt(np.sqrt(2 / np.pi) * np.exp(9 / 8))


# Slow (42 s with SoftAbs; the suite neared 15 min): the default run samples the funnel through the JAX adapters
# (the funnel example) and PyMC's SoftAbs on the correlated Gaussian; the long run below is slow too.
@pytest.mark.slow
@pytest.mark.parametrize("metric", [None, "diagonal_softabs"])
def test_funnel_short_run(metric):
    """Default-run funnel check, 2 chains x 800 draws: the same z-scores (ESS-based standard
    errors, |z| < 4.5) as the slow test, with ESS >= 30 and R-hat < 1.2 as the bar against stuck
    chains (a short run's R-hat is noisy; the slow test asks for 200 and 1.01). Seeds 11-20 of
    this run gave a bulk ESS of v of 43-132 (a stuck chain gives a few). The diagonal SoftAbs
    (slow: the default run checks its metric against finite differences) samples the same way."""
    rng = np.random.default_rng(11)
    with funnel():
        tree = pm.sample(tune=200, draws=800, chains=2, cores=2, step=AdaptiveRMHMC(metric=metric), random_seed=11,
                         initvals=funnel_draws(rng, 2), **QUIET)
    v, root_x = funnel_values(tree)
    assert_moments_match(v, 0.0, 3.0, min_ess=30, max_rhat=1.2)
    assert_moments_match(root_x, 0.0, FUNNEL_ROOT_SD, min_ess=30, max_rhat=1.2)


@pytest.mark.slow
def test_funnel_long_run():
    rng = np.random.default_rng(12)
    with funnel():
        tree = pm.sample(tune=1000, draws=2000, chains=4, cores=2, step=AdaptiveRMHMC(), random_seed=12,
                         initvals=funnel_draws(rng, 4), **QUIET)
    v, root_x = funnel_values(tree)
    assert_moments_match(v, 0.0, 3.0)
    # The x's inherit v's slow mixing in their tails: rank-normalized (folded) R-hat was 1.011-1.012 on
    # four of them at this length with every |z| < 4.5 and ESS >= 200, so the bar there is 1.02.
    assert_moments_match(root_x, 0.0, FUNNEL_ROOT_SD, max_rhat=1.02)


def pima():
    from benchmarks.models import PRIOR_VARIANCE, load_pima, standardize
    from benchmarks.pymc_models import build

    X, _, _ = load_pima()
    design = np.column_stack([np.ones(len(X)), standardize(np.asarray(X, dtype=float))])  # logits = design @ x
    return build("pima"), fisher_logistic_metric(design, prior_variance=PRIOR_VARIANCE)


@pytest.mark.slow  # 2026-12-05: the default suite took 18-22 min on this host; a default test covers most of it
def test_pima_logistic_fisher_metric_matches_nuts():
    ref = load_pima_logistic_reference()
    model, metric = pima()
    with model:
        tree = pm.sample(tune=300, draws=500, chains=4, cores=2, step=AdaptiveRMHMC(metric=metric), random_seed=5,
                         **QUIET)
    draws = {"x": tree.posterior["x"].values}
    for moment in ("mean", "mean_squared"):
        z = zscores_against_reference(draws, ref, moment=moment)
        assert max(abs(v) for v in z.values()) < 4.5, (moment, z)
    assert bulk_ess(draws["x"]).min() >= 200 and split_rhat(draws["x"]).max() < 1.01
    assert tree.sample_stats["fixed_point_converged"].values.mean() > 0.9


# ---- constant metric and fixed-point failures ------------------------------------------------

def test_constant_metric_is_plain_hmc_with_a_dense_mass_matrix():
    matrix = np.linalg.inv(COV)
    runs = []
    for make in (lambda: AdaptiveRMHMC(metric=constant_metric(matrix)),
                 lambda: AdaptiveHMC(potential=QuadPotentialFull(np.linalg.inv(matrix)))):
        with correlated_gaussian():
            step = make()
            runs.append(pm.sample(tune=100, draws=100, chains=1, step=step, random_seed=3, **QUIET))
        if isinstance(step, AdaptiveRMHMC):
            assert isinstance(step.potential, QuadPotentialFull)
    np.testing.assert_array_equal(runs[0].posterior["x"].values, runs[1].posterior["x"].values)
    stats = runs[0].sample_stats
    # one model call per leapfrog step: each trajectory starts where the last one left its density
    np.testing.assert_array_equal(stats["n_grad_evals"].values, stats["n_steps"].values)


def test_a_compound_partner_moving_a_variable_gives_a_fresh_start_geometry():
    """In a compound step another step can change the density at an unchanged position: the
    iteration's start geometry is evaluated afresh then, never taken from the previous iteration."""
    with pm.Model() as model:
        k = pm.Bernoulli("k", 0.5)
        x = pm.Normal("x", 20.0 * k, 1.0, shape=2)  # a flip of k moves the density far from any draw
        step = AdaptiveRMHMC(vars=[x])
    logp = model.compile_logp()
    step.setup_chain(np.random.default_rng(0), tune=10, draws=0)
    moved, _ = step.step(model.initial_point() | {"k": np.array(0), "x": np.zeros(2)})  # at k = 0's mode
    flipped = moved | {"k": np.array(1)}
    step.step(flipped)
    assert step.integrator.start.logp == pytest.approx(logp(flipped), rel=1e-12)
    assert logp(flipped) < logp(moved) - 1  # the flip did change the density there


def test_unconverged_fixed_point_is_reported_and_rejected(one_iteration_funnel_step):
    model, step = one_iteration_funnel_step  # one iterate: the fixed points never meet the tolerance
    (point,) = funnel_draws(np.random.default_rng(4), 1)
    point = model.initial_point() | {"v": np.asarray(point["v"]), "x": point["x"]}
    step.setup_chain(np.random.default_rng(0), tune=10, draws=0)
    for _ in range(3):
        new, (stats,) = step.step(point)
        assert not stats["fixed_point_converged"] and stats["accepted"] == 0.0 and stats["diverging"]
        assert stats["n_grad_evals"] >= 1
        np.testing.assert_array_equal(new["x"], point["x"])


def test_a_diagonal_metric_is_its_diagonal_matrix():
    """A (d,) vector from metric= is diag(vector): the same chain as the (d, d) matrix, draw for draw."""
    def diagonal(x):
        return pm.math.stack([1.0 + x[0] ** 2, pm.math.exp(0.3 * x[0])])

    draws = []
    for metric in (diagonal, lambda x: pm.math.diag(diagonal(x))):
        with correlated_gaussian():
            tree = pm.sample(tune=30, draws=20, chains=1, step=AdaptiveRMHMC(metric=metric), random_seed=3,
                             **QUIET)
        draws.append(tree.posterior["x"].values)
    assert np.ptp(draws[0]) > 0
    np.testing.assert_array_equal(draws[0], draws[1])


# ---- bad input -------------------------------------------------------------------------------

def test_bad_user_metric_raises_before_sampling():
    with correlated_gaussian():
        with pytest.raises(ValueError, match="metric at the initial point is not symmetric"):
            AdaptiveRMHMC(metric=lambda x: pm.math.stack([[1.0 + x[0] ** 2, 0.5], [0.0, 1.0]]))
        with pytest.raises(ValueError, match="not positive definite"):
            AdaptiveRMHMC(metric=lambda x: pm.math.stack([[1.0 + x[0] ** 2, 0.0], [0.0, -1.0]]))
        with pytest.raises(ValueError, match=r"\(2, 2\) matrix"):
            AdaptiveRMHMC(metric=lambda x: 1.0 + x[0] ** 2 * pm.math.ones((3, 3)))
        with pytest.raises(ValueError, match="diagonal with non-positive"):
            AdaptiveRMHMC(metric=lambda x: pm.math.stack([1.0 + x[0] ** 2, -1.0]))
        with pytest.raises(ValueError, match=r"\(2,\) vector"):
            AdaptiveRMHMC(metric=lambda x: 1.0 + x[0] ** 2 * pm.math.ones(3))
        with pytest.raises(ValueError, match="3 x 3.*2 coordinates"):
            AdaptiveRMHMC(metric=constant_metric(np.eye(3)))


@pytest.mark.parametrize("kwargs, match", [
    (dict(softabs_alpha=0.0), "softabs_alpha"),
    (dict(fixed_point_tolerance=0.0), "fixed_point_tolerance"),
    (dict(max_fixed_point_iterations=0), "max_fixed_point_iterations"),
    (dict(metric="softabs"), "metric must be"),
    (dict(metric="diagonal"), "metric must be"),
    (dict(adapt_mass_matrix=True), "adapt_mass_matrix"),
    (dict(dense_mass=True), "AdaptiveRMHMC takes no dense_mass"),
    (dict(round_length=0), "round_length"),
    (dict(objective="esjd_moments"), "esjd_moments.*adapted mass matrix"),
    (dict(jump_estimate="trajectory"), "jump_estimate='transition' only"),
])
def test_bad_options_raise(kwargs, match):
    with correlated_gaussian(), pytest.raises(ValueError, match=match):
        AdaptiveRMHMC(**kwargs)


def test_bad_metric_helpers_and_discrete_variables():
    with pytest.raises(ValueError, match="positive definite"):
        constant_metric(np.diag([1.0, -1.0]))
    with pytest.raises(ValueError, match="symmetric"):
        constant_metric(np.array([[1.0, 0.5], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="prior_variance"):
        fisher_logistic_metric(np.ones((3, 2)), prior_variance=0.0)
    with pytest.raises(ValueError, match="2-d design matrix"):
        fisher_logistic_metric(np.ones(3))
    with pm.Model():
        pm.Normal("x", 0, 1)
        k = pm.Poisson("k", 3)
        with pytest.raises(ValueError, match=r"AdaptiveRMHMC needs gradients.*\['k'\]"):
            AdaptiveRMHMC(vars=[k])
