"""Predictive adaptation: GP-UCB tuning of HMC with a cross-validation reward.

Wang's thesis (2012, chapters 3-4) and section 5.4 of the ICML 2013 paper tune
HMC for what the model is for -- prediction.  n-fold cross-validation runs as
n chains, chain ``c`` conditioned on every fold but ``c``.  All chains share
one arm ``(step-size factor, L)`` of one GP-UCB tuner.  After every round each
chain predicts its own held-out fold, averaging its predictions over the
*round's* draws only; the loss of those predictions, averaged over the folds,
is the round's cost ``L``.  The tuner receives a positive decreasing function
of it, ``2 L_ref / (L_ref + L)`` (:func:`reward_from_loss`; it ranks arms like
``-L``), as one GP observation of weight ``num_chains``.

Framework-free apart from JAX/BlackJAX: the model enters as two functions of
the flattened unconstrained position ``x``::

    logdensity_fn(x, train_mask) -> log prior + sum_i train_mask[i] * log p(y_i | x)
    predict_fn(x) -> (mean, log_prob)

``mean`` (shape ``(n, ...)``) is the predictive mean of every training case
given ``x`` and ``log_prob`` (shape ``(n,)``) the log density of each case's
target.  A chain only ever calls ``logdensity_fn`` with its own training mask,
and its reward only looks at the cases of its held-out fold.
:func:`ahmc.adapters.numpyro.cross_validate` builds both from a NumPyro model.

Losses.  A loss maps the round's *predictive* quantities to one loss per case:
``loss(mean, log_density, y) -> (n,)``, where ``mean`` is the predictive mean
averaged over the round's draws and ``log_density`` the log of the averaged
predictive density (log-mean-exp of ``log_prob``).  Shipped:
``"mse"`` (squared error summed over output dimensions),
``"classification_error"`` (0/1 error of the averaged class probability:
threshold 0.5 for a Bernoulli mean, argmax over a trailing class axis
otherwise) and ``"nlpd"`` (negative log predictive density).

Schedule.  Warm-up starts with BlackJAX's Stan-style ``window_adaptation``
(NUTS) on every fold for ``metric_fraction`` of warm-up: it gives each fold a
diagonal mass matrix and a step size ``eps*_c``.  The GP then searches a
step-size *factor* ``f`` in ``step_size_factors`` (fold ``c`` runs with
``f * eps*_c``) and ``L`` in ``[1, ceil(max_integration_time / median eps*)]``;
each transition draws its number of leapfrog steps uniformly from ``{1..L}``.
The remaining warm-up and all of sampling are rounds; the adaptation
probability is 1 during warm-up and decays as ``(i - k + 1)^(-1/2)`` after it.

Engine.  The GP rounds run on the shared JAX engine
(:func:`ahmc.adapters._jax_engine.build_engine`), not a driver of their own:
the folds' training masks are its ``chain_data``, :func:`predictive_reward`
is its round-end hook (it sees a buffer of the round's positions) and
``super_transitions`` its option of the same name.  Each fold runs in its own
whitened coordinates ``z = x / (eps*_c sqrt(imm_c))``, so the engine's step
size *is* the shared factor ``f`` and its unit mass matrix the fold's own.

Super-transitions (thesis section 3.2, after Neal).  With
``super_transitions=B`` every round spends the same leapfrog budget instead of
the same number of iterations: a round with maximum ``L`` makes
``B / E[L_t] = 2 B / (L + 1)`` transitions (``L_t ~ U{1..L}``; stochastic
rounding to an integer, ``L`` capped at ``2 B - 1``), decided at the round
start from the arm alone.  Every arm's reward is then the loss reached with,
in expectation, exactly ``B`` gradient evaluations per chain, so arms with
large ``L`` are not favoured merely for spending more computation per round.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import blackjax
from blackjax.adaptation.base import get_filter_adapt_info_fn

from ._jax_engine import build_engine

__all__ = [
    "LOSSES",
    "get_loss",
    "squared_error",
    "classification_error",
    "negative_log_predictive_density",
    "fold_masks",
    "predictive_loss",
    "reward_from_loss",
    "predictive_reward",
    "PredictiveHookState",
    "CrossValidationRun",
    "run_cross_validation",
]


# ---------------------------------------------------------------- losses


def squared_error(mean, log_density, y):
    """Squared error of the predictive mean, summed over output dimensions: shape (n,)."""
    err = jnp.reshape(jnp.asarray(y, mean.dtype) - mean, (mean.shape[0], -1))
    return jnp.sum(err * err, axis=1)


def classification_error(mean, log_density, y):
    """0/1 error of the predictive class: ``mean > 0.5`` (Bernoulli) or argmax of a trailing class axis."""
    y = jnp.asarray(y)
    if mean.ndim == y.ndim:
        predicted = (mean > 0.5).astype(y.dtype)
    else:
        predicted = jnp.argmax(mean, axis=-1).astype(y.dtype)
    wrong = jnp.reshape(predicted != y, (mean.shape[0], -1))
    return jnp.mean(wrong.astype(mean.dtype), axis=1)


def negative_log_predictive_density(mean, log_density, y):
    """Minus the log of the draw-averaged predictive density of each case: shape (n,)."""
    return -log_density


LOSSES: dict[str, Callable] = {
    "mse": squared_error,
    "classification_error": classification_error,
    "nlpd": negative_log_predictive_density,
}


def get_loss(loss: str | Callable) -> Callable:
    """Resolve a loss name or a callable ``(mean, log_density, y) -> per-case loss (n,)``."""
    if callable(loss):
        return loss
    if loss not in LOSSES:
        raise ValueError(
            f"loss must be one of {sorted(LOSSES)} or a callable (mean, log_density, y) -> "
            f"per-case losses of shape (n,); got {loss!r}."
        )
    return LOSSES[loss]


def fold_masks(num_cases: int, num_folds: int, seed: int = 0) -> np.ndarray:
    """Held-out masks ``(num_folds, num_cases)`` of a random partition into near-equal folds."""
    if not isinstance(num_folds, (int, np.integer)) or num_folds < 2:
        raise ValueError(f"num_folds must be an integer >= 2; got {num_folds!r}.")
    if num_cases < num_folds:
        raise ValueError(f"num_folds={num_folds} exceeds the number of cases ({num_cases}); use fewer folds.")
    order = np.random.default_rng(seed).permutation(num_cases)
    masks = np.zeros((num_folds, num_cases), bool)
    for fold, cases in enumerate(np.array_split(order, num_folds)):
        masks[fold, cases] = True
    return masks


def predictive_loss(loss_fn, mean_sum, log_density_sum, num_draws, y, case_weights):
    """Weighted mean loss of draw-averaged predictions (sums over ``num_draws`` draws)."""
    mean = mean_sum / num_draws
    log_density = log_density_sum - jnp.log(num_draws * 1.0)
    per_case = loss_fn(mean, log_density, y)
    return jnp.sum(per_case * case_weights) / jnp.sum(case_weights)


# ---------------------------------------------------------------- the run


class CrossValidationRun(NamedTuple):
    """What :func:`run_cross_validation` returns (NumPy arrays).

    positions : (C, S, D)     sampling-phase draws of every fold chain (flat, unconstrained)
    held_out : (C, n) bool    held-out fold of every chain
    history : dict            one entry per GP round: ``step_size_factor``, ``num_steps`` (L),
                              ``num_iterations``, ``loss`` (fold mean), ``reward`` (the tuner's),
                              ``fold_losses`` (R, C),
                              ``num_gradients`` (per chain), ``acceptance_rate``,
                              ``num_divergent``, ``is_warmup``, ``arm_changed``
    step_size : (C,)          warm-up step size ``eps*`` of every fold
    inverse_mass_matrix : (C, D)
    num_gradients : dict      gradient evaluations per chain: ``metric_phase``, ``gp_warmup``, ``sampling``
    tuner_state               final tuner state (``tuner.surrogate(state)`` for plots)
    tuner                     the core tuner (``tuner.space`` in factor / L units)
    """

    positions: Any
    held_out: Any
    history: dict
    step_size: Any
    inverse_mass_matrix: Any
    num_gradients: dict
    tuner_state: Any
    tuner: Any


class PredictiveHookState(NamedTuple):
    """State of :func:`predictive_reward`'s round-end hook (lives in ``EngineState.round_end_state``).

    reference_loss : float, ()   the first positive round loss (NaN before it)
    fold_losses : float, (C,)    the latest round's held-out loss of every fold
    reward : float, ()           the latest reward
    """

    reference_loss: Any
    fold_losses: Any
    reward: Any


def predictive_reward(predict_fn, loss, y, held_out, to_position=None, dtype=jnp.float32):
    """The engine's round-end hook for a cross-validation reward: ``(round_end_fn, round_end_state)``.

    At a round's end, every chain ``c`` predicts the training cases from each of the round's
    draws (``predict_fn``, after ``to_position(draw, c)`` maps the engine's coordinates back),
    the predictions are averaged over those draws only, and the loss is taken on chain ``c``'s
    held-out cases (``held_out[c]``).  The round's loss ``L`` is the mean over folds and the
    reward :func:`reward_from_loss` of it, one scalar for the pooled tuner.  Predictions are
    made for the round's ``num_draws`` draws only (a ``fori_loop`` with a traced bound).
    """
    loss_fn = get_loss(loss)
    y = jnp.asarray(y)
    case_weights = jnp.asarray(held_out, dtype)
    num_chains = case_weights.shape[0]
    to_position = to_position or (lambda draws, chain: draws)
    chains = jnp.arange(num_chains)

    def round_end_fn(draws, num_draws, hook: PredictiveHookState):
        def predict(i):
            x = jax.vmap(to_position)(jax.tree.map(lambda d: d[:, i], draws), chains)
            return jax.vmap(predict_fn)(x)

        mean0, logp0 = jax.eval_shape(predict, 0)
        acc0 = (jnp.zeros(mean0.shape, mean0.dtype), jnp.full(logp0.shape, -jnp.inf, logp0.dtype))

        def add(i, acc):
            mean, logp = predict(i)
            return acc[0] + mean, jnp.logaddexp(acc[1], logp)

        mean_sum, logp_sum = jax.lax.fori_loop(0, num_draws, add, acc0)
        fold_losses = jax.vmap(lambda m, lp, w: predictive_loss(loss_fn, m, lp, num_draws, y, w))(
            mean_sum, logp_sum, case_weights).astype(dtype)
        round_loss = jnp.mean(fold_losses)
        reference = jnp.where(jnp.isnan(hook.reference_loss) & (round_loss > 0), round_loss, hook.reference_loss)
        reward = jnp.where(jnp.isnan(reference), 2.0, 2.0 * reference / (reference + round_loss)).astype(dtype)
        return reward, PredictiveHookState(reference, fold_losses, reward)

    nan = jnp.asarray(jnp.nan, dtype)
    return round_end_fn, PredictiveHookState(nan, jnp.zeros((num_chains,), dtype), nan)


def run_cross_validation(
    rng_key,
    logdensity_fn: Callable,
    predict_fn: Callable,
    y,
    held_out,
    initial_positions,
    *,
    num_warmup: int = 1000,
    num_samples: int = 1000,
    loss: str | Callable = "mse",
    round_length: int = 10,
    super_transitions: int | None = None,
    metric_fraction: float = 0.5,
    step_size_factors: tuple[float, float] = (0.5, 3.0),
    max_integration_time: float = 4 * math.pi,
    num_steps_cap: int = 1024,
    target_acceptance_rate: float = 0.8,
    max_tree_depth: int = 10,
    num_step_sizes: int = 50,
    capacity: int = 64,
    lengthscale: float = 0.2,
    noise_variance: float = 0.1,
    alpha: float = 4.0,
    delta: float = 0.1,
    keep_warmup: bool = False,
    divergence_threshold: float = 1000.0,
) -> CrossValidationRun:
    """Run n-fold cross-validated adaptive HMC (one chain per fold, one shared tuner).

    A thin wrapper of the JAX engine (:func:`ahmc.adapters._jax_engine.build_engine`):
    per-fold window adaptation, then the engine with the folds' training masks as
    ``chain_data``, :func:`predictive_reward` as its round-end hook and, optionally,
    ``super_transitions``; one jitted call per round.

    Parameters
    ----------
    logdensity_fn, predict_fn
        See the module docstring; ``x`` is a flat vector of shape ``(D,)``.
    y
        Targets of the ``n`` training cases (leading axis ``n``).
    held_out
        Boolean ``(C, n)``: the held-out fold of each of the ``C`` chains (see :func:`fold_masks`).
    initial_positions
        ``(C, D)`` starting points, one per fold.
    num_warmup
        Warm-up iterations: ``metric_fraction`` of them NUTS window adaptation,
        the rest GP rounds of ``round_length`` iterations (``ceil`` of the ratio).
    num_samples
        Sampling iterations, in ``ceil(num_samples / round_length)`` rounds.
        With ``super_transitions`` the rounds have a leapfrog budget instead and
        the number of draws depends on the arms chosen.
    loss
        ``"mse"``, ``"classification_error"``, ``"nlpd"`` or a callable
        ``(mean, log_density, y) -> (n,)`` per-case losses.
    super_transitions
        Leapfrog budget per chain and round (see the module docstring), or
        ``None`` for rounds of ``round_length`` iterations.
    max_tree_depth
        Maximum number of NUTS doublings in the metric phase (BlackJAX's default 10).
    keep_warmup
        Also return the GP-warm-up draws (prepended to ``positions``).
    """
    held_out, x0, (lo_f, hi_f) = _check_cross_validation_inputs(
        y, held_out, initial_positions, loss, num_warmup, num_samples, round_length, super_transitions,
        metric_fraction, step_size_factors)
    dtype = x0.dtype
    train_masks = jnp.asarray(~held_out, dtype)
    metric_steps = max(1, int(round(metric_fraction * num_warmup)))
    num_warmup_rounds = max(1, math.ceil((num_warmup - metric_steps) / round_length))
    num_sampling_rounds = math.ceil(num_samples / round_length)
    key_warm, key_init, key_rounds = jax.random.split(rng_key, 3)

    # 1. Metric phase: Stan-style window adaptation (BlackJAX, NUTS) on every fold.
    positions, eps_star, imm, warm_grads = _window_adaptation(
        key_warm, logdensity_fn, x0, train_masks, metric_steps, target_acceptance_rate, max_tree_depth)
    _check_finite_warmup(eps_star)
    eps_ref = float(np.median(eps_star))
    l_hi = _longest_arm(eps_ref, max_integration_time, num_steps_cap, super_transitions)

    # 2. GP rounds on the engine.  Each fold runs in its own whitened coordinates
    # z = x / (eps*_c sqrt(imm_c)): HMC on z with unit mass and step size f is HMC on x with
    # step size f eps*_c and the fold's mass matrix, so the engine's shared arm (f, L) in the
    # box f in step_size_factors is the shared step-size *factor* of every fold.
    scales, whitened_logdensity, to_position = _whitened(logdensity_fn, eps_star, imm, dtype)
    hook, hook_state = predictive_reward(predict_fn, loss, y, held_out, to_position, dtype)
    engine = build_engine(
        whitened_logdensity, num_warmup=num_warmup_rounds * round_length, step_size_bounds=(lo_f, hi_f),
        num_steps_bounds=(1, l_hi), adapt_mass_matrix=False, round_length=round_length,
        num_step_sizes=num_step_sizes, log_step_size=True, initial_arm=(1.0, max(1, math.ceil(1.5 / eps_ref))),
        capacity=capacity, lengthscale=lengthscale, noise_variance=noise_variance, alpha=alpha, delta=delta,
        divergence_threshold=divergence_threshold, chain_data=(train_masks, scales), round_end_fn=hook,
        round_end_state=hook_state, super_transitions=super_transitions)
    state = engine.init(positions / scales, key_init)
    state, rows, kept = _run_rounds(engine, state, key_rounds, num_warmup_rounds, num_sampling_rounds, scales,
                                    keep_warmup)
    return _cross_validation_run(engine, state, rows, kept, held_out, eps_star, imm, warm_grads)


def _whitened(logdensity_fn, eps_star, imm, dtype):
    """``(scales, log density of z with data (mask, scale), z -> x of a chain)`` for ``x = scale * z``."""
    scales = jnp.asarray(eps_star, dtype)[:, None] * jnp.sqrt(jnp.asarray(imm, dtype))

    def whitened_logdensity(z, data):
        mask, scale = data
        return logdensity_fn(scale * z, mask)

    def to_position(z, chain):
        return scales[chain] * z

    return scales, whitened_logdensity, to_position


def _longest_arm(eps_ref, max_integration_time, num_steps_cap, super_transitions) -> int:
    """The box's largest ``L``: the integration time at the folds' median step size, capped (with
    ``super_transitions``, so that every arm fits one transition)."""
    l_hi = int(min(max(math.ceil(max_integration_time / eps_ref), 2), num_steps_cap))
    if super_transitions is not None:
        l_hi = max(2, min(l_hi, 2 * int(super_transitions) - 1))
    return l_hi


def _cross_validation_run(engine, state, rows, kept, held_out, eps_star, imm, warm_grads) -> CrossValidationRun:
    """The result: the rounds' draws (chains first), their history and the gradients of each phase."""
    history = {name: np.asarray([row[name] for row in rows]) for name in rows[0]}
    gp_grads = history["num_gradients"]
    return CrossValidationRun(
        positions=np.swapaxes(np.concatenate(kept, axis=0), 0, 1), held_out=held_out, history=history,
        step_size=np.asarray(eps_star), inverse_mass_matrix=np.asarray(imm),
        num_gradients={"metric_phase": float(np.mean(warm_grads)),
                       "gp_warmup": float(np.sum(gp_grads[history["is_warmup"]])),
                       "sampling": float(np.sum(gp_grads[~history["is_warmup"]]))},
        tuner_state=state.tuner, tuner=engine.tuner,
    )


def _check_cross_validation_inputs(y, held_out, initial_positions, loss, num_warmup, num_samples, round_length,
                                   super_transitions, metric_fraction, step_size_factors):
    """:func:`run_cross_validation`'s checks, before anything runs: ``(held_out, x0, step_size_factors)``."""
    get_loss(loss)
    held_out = np.asarray(held_out, bool)
    x0 = jnp.asarray(initial_positions)
    if held_out.ndim != 2:
        raise ValueError(f"held_out must be a boolean array (num_chains, num_cases); got shape {held_out.shape}.")
    num_chains, num_cases = held_out.shape
    if x0.ndim != 2 or x0.shape[0] != num_chains:
        raise ValueError(
            f"initial_positions must have shape (num_chains={num_chains}, dim); got {tuple(x0.shape)}.")
    if np.shape(y)[0] != num_cases:
        raise ValueError(f"y has {np.shape(y)[0]} cases but held_out has {num_cases}.")
    if not held_out.any(axis=1).all():
        raise ValueError("every chain needs a non-empty held-out fold (a row of held_out is all False).")
    for name, value in (("num_warmup", num_warmup), ("num_samples", num_samples), ("round_length", round_length)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value!r}.")
    if super_transitions is not None and (not isinstance(super_transitions, (int, np.integer))
                                          or super_transitions < 1):
        raise ValueError(
            f"super_transitions must be None or a positive integer leapfrog budget per round; got {super_transitions!r}.")
    if not 0.0 < metric_fraction < 1.0:
        raise ValueError(f"metric_fraction must be in (0, 1); got {metric_fraction!r}.")
    lo_f, hi_f = (float(v) for v in step_size_factors)
    if not 0 < lo_f <= 1.0 <= hi_f:
        raise ValueError(f"step_size_factors must satisfy 0 < lower <= 1 <= upper; got {step_size_factors!r}.")
    return held_out, x0, (lo_f, hi_f)


def _run_rounds(engine, state, rng_key, num_warmup_rounds, num_sampling_rounds, scales, keep_warmup):
    """The GP rounds, one jitted call each: ``(state, rows, kept draws)``, a row of the history per round."""
    run_round = jax.jit(functools.partial(_run_round, engine.step))
    parameters = jax.jit(engine.parameters)
    rows, kept = [], []
    for r, key in enumerate(jax.random.split(rng_key, num_warmup_rounds + num_sampling_rounds)):
        is_warmup = r < num_warmup_rounds
        arm = parameters(state)
        factor, num_steps = float(arm["step_size"]), int(arm["num_integration_steps"])
        previous_arm = int(state.tuner.arm)
        state, stats = run_round(state, key)
        num_iterations = int(stats["num_iterations"])
        if keep_warmup or not is_warmup:
            draws = np.asarray(stats["draws"][:, :num_iterations] * scales[:, None])
            kept.append(np.swapaxes(draws, 0, 1))
        hook_out = state.round_end_state
        fold_losses = np.asarray(hook_out.fold_losses)
        rows.append(dict(step_size_factor=factor, num_steps=num_steps, num_iterations=num_iterations,
                         loss=float(np.mean(fold_losses)), reward=float(hook_out.reward), fold_losses=fold_losses,
                         num_gradients=float(np.mean(np.asarray(stats["num_gradients"]))),
                         acceptance_rate=float(np.mean(np.asarray(stats["acceptance"]))) / num_iterations,
                         num_divergent=int(np.sum(np.asarray(stats["num_divergent"]))),
                         is_warmup=is_warmup, arm_changed=int(state.tuner.arm) != previous_arm))
    return state, rows, kept


def _run_round(step, state, rng_key):
    """Engine iterations until the tuner has taken this round's reward: the state, per-chain sums
    of the round and its draws (recorded here, apart from the hook's buffer, so tests can check one
    against the other)."""
    first_round = state.tuner.round
    num_chains = state.logdensity.shape[0]
    stats0 = {"num_iterations": jnp.asarray(0, jnp.int32), "num_gradients": jnp.zeros((num_chains,), jnp.int32),
              "acceptance": jnp.zeros((num_chains,), state.logdensity.dtype),
              "num_divergent": jnp.zeros((num_chains,), jnp.int32), "draws": jnp.zeros_like(state.round_draws)}

    def body(carry):
        state, key, stats = carry
        key, key_step = jax.random.split(key)
        state, info = step(key_step, state)
        stats = {"draws": stats["draws"].at[:, stats["num_iterations"]].set(state.position),
                 "num_iterations": stats["num_iterations"] + 1,
                 "num_gradients": stats["num_gradients"] + info.num_gradient_evals,
                 "acceptance": stats["acceptance"] + jnp.nan_to_num(info.acceptance_rate),
                 "num_divergent": stats["num_divergent"] + info.is_divergent.astype(jnp.int32)}
        return state, key, stats

    state, _, stats = jax.lax.while_loop(lambda c: c[0].tuner.round == first_round, body,
                                         (state, rng_key, stats0))
    return state, stats


def reward_from_loss(loss, reference_loss):
    """The tuner's reward for a round's cross-validation loss: ``2 L_ref / (L_ref + L)``.

    Any decreasing function of the loss ranks arms like ``-L``; this one is positive, 1
    at the reference loss ``L_ref`` (the first positive round loss), 2 at zero loss.
    Positive rewards matter: the GP's prior mean is 0 and the tuner rescales rewards so
    that the best is ``alpha``, so with ``-L`` every visited arm would look worse than
    any unvisited one and the tuner would only explore.  With positive rewards an
    unvisited arm is worth only its exploration bonus, as with the paper's ESJD.
    """
    if reference_loss is None:  # every round so far had zero loss
        return 2.0
    return 2.0 * reference_loss / (reference_loss + loss)


def _check_finite_warmup(eps_star):
    eps_star = np.asarray(eps_star)
    if not np.all(np.isfinite(eps_star) & (eps_star > 0)):
        raise ValueError(
            f"Window adaptation gave non-finite step sizes {eps_star.tolist()}; check that the log "
            "density is finite at the initial positions, or start closer to the bulk.")


def _window_adaptation(rng_key, logdensity_fn, x0, train_masks, num_steps, target_acceptance_rate,
                       max_tree_depth):
    """BlackJAX NUTS window adaptation on every fold: positions, step sizes, diagonal imm, gradients."""
    info_fn = get_filter_adapt_info_fn(info_keys={"num_integration_steps"})

    def one(key, x, mask):
        warmup = blackjax.window_adaptation(
            blackjax.nuts, lambda z: logdensity_fn(z, mask), target_acceptance_rate=target_acceptance_rate,
            adaptation_info_fn=info_fn, max_num_doublings=max_tree_depth)
        (state, parameters), info = warmup.run(key, x, num_steps=num_steps)
        return (state.position, parameters["step_size"], parameters["inverse_mass_matrix"],
                jnp.sum(info.info.num_integration_steps))

    keys = jax.random.split(rng_key, x0.shape[0])
    return jax.jit(jax.vmap(one))(keys, x0, train_masks)
