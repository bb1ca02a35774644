"""Cross-validated adaptive HMC for NumPyro models (thesis chapters 3-4).

``cross_validate(model, X, y, num_folds=8, loss="mse", ...)`` splits the cases
into folds, runs one chain per fold conditioned on the other folds, and tunes
their shared ``(step size, L)`` with GP-UCB on minus the held-out loss of each
round's draws (:mod:`ahmc.adapters.predictive`).

The model is called ``model(X, y)`` (``y=None`` to predict) and must observe
the targets at one sample site (``obs_site``, default ``"y"``) whose batch
shape starts with the case axis (a ``plate`` over cases, or ``.to_event`` for
per-case output vectors).  NumPyro supplies the potential, the constraining
transforms and the initial points; the fold's training mask is applied to that
site's log density with ``Distribution.mask``, so a chain never sees the
likelihood of its held-out cases.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from ._extras import require

require("numpyro", "numpyro")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402
from jax.scipy.special import logsumexp  # noqa: E402
from numpyro import handlers  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402
from numpyro.infer.initialization import init_to_uniform  # noqa: E402
from numpyro.infer.util import constrain_fn, initialize_model, potential_energy  # noqa: E402
from numpyro.primitives import Messenger  # noqa: E402

from .predictive import CrossValidationRun, fold_masks, get_loss, predictive_loss, run_cross_validation  # noqa: E402

__all__ = ["cross_validate", "CrossValidation", "predictive_average", "nuts_at_budget"]


class _MaskSite(Messenger):
    """Multiply the log density of one site's cases by a 0/1 mask (leading case axis)."""

    def __init__(self, fn, site, mask):
        self.site, self.mask = site, mask
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["name"] == self.site:
            batch_ndim = len(msg["fn"].batch_shape)
            if batch_ndim == 0 or msg["fn"].batch_shape[0] != self.mask.shape[0]:
                raise ValueError(
                    f"The observed site {self.site!r} must have a batch shape starting with the "
                    f"{self.mask.shape[0]} cases (use a plate over cases, or .to_event() for "
                    f"per-case vectors); its batch shape is {msg['fn'].batch_shape}.")
            mask = jnp.reshape(self.mask > 0, self.mask.shape + (1,) * (batch_ndim - 1))
            msg["fn"] = msg["fn"].mask(mask)


def _observation(model, params, X, y, obs_site):
    """The distribution of the observed site given constrained ``params`` (a trace of the model)."""
    tr = handlers.trace(handlers.substitute(handlers.seed(model, 0), data=params)).get_trace(X, y)
    if obs_site not in tr:
        raise ValueError(f"obs_site={obs_site!r} is not a sample site of the model; its sites: {list(tr)}.")
    return tr[obs_site]["fn"]


def _case_log_prob(dist, y):
    lp = dist.log_prob(y)
    return jnp.sum(jnp.reshape(lp, (lp.shape[0], -1)), axis=1) if lp.ndim > 1 else lp


def predictive_average(model, samples: dict, X, y=None, *, obs_site: str = "y", batch_size: int = 64):
    """Predictive mean (and log predictive density of ``y``) averaged over draws.

    ``samples``: constrained draws with one leading draw axis (as from ``MCMC.get_samples()``).
    Returns ``(mean, log_density)``, ``log_density`` ``None`` without ``y``.
    """
    num_draws = jax.tree.leaves(samples)[0].shape[0]
    fn = _averager(model, obs_site, y is not None, min(batch_size, num_draws))
    mean, log_density = fn(samples, X, y)
    return mean, (log_density if y is not None else None)


@functools.lru_cache(maxsize=32)
def _averager(model, obs_site, with_y, batch_size):
    """One jitted draw-average per (model, site, mode): folds and repeated calls reuse its compilation."""
    def one(params, X, y):
        dist = _observation(model, params, X, y, obs_site)
        return dist.mean, (_case_log_prob(dist, y) if with_y else jnp.zeros(dist.batch_shape[:1]))

    @jax.jit
    def average(samples, X, y):
        means, logps = jax.lax.map(lambda p: one(p, X, y), samples, batch_size=batch_size)
        num_draws = means.shape[0]
        return jnp.mean(means, axis=0), logsumexp(logps, axis=0) - jnp.log(num_draws)

    return average


@dataclass
class CrossValidation:
    """Result of :func:`cross_validate`.

    samples : dict     constrained draws per site, leading axes ``(num_folds, num_draws)``
    run : CrossValidationRun   flat draws, tuning history per round, gradient counts, tuner
    held_out : (num_folds, n) bool   each chain's held-out fold
    cv_loss : float    held-out loss of each fold's predictions averaged over *all* its
                       sampling draws, averaged over folds (the final cross-validation estimate)
    fold_cv_losses : (num_folds,)
    """

    samples: dict
    run: CrossValidationRun
    held_out: Any
    cv_loss: float
    fold_cv_losses: Any
    model: Callable
    obs_site: str

    @property
    def history(self) -> dict:
        return self.run.history

    @property
    def num_gradients(self) -> dict:
        return self.run.num_gradients

    def predict(self, X_new, y_new=None):
        """Per-fold predictive means ``(num_folds, n_new, ...)`` (and log densities) on new inputs."""
        out = [predictive_average(self.model, jax.tree.map(lambda v: v[c], self.samples), X_new, y_new,
                                  obs_site=self.obs_site)
               for c in range(self.held_out.shape[0])]
        means = jnp.stack([m for m, _ in out])
        return means, (jnp.stack([lp for _, lp in out]) if y_new is not None else None)


def cross_validate(
    model: Callable,
    X,
    y,
    *,
    rng_key,
    num_folds: int = 8,
    loss: str | Callable = "mse",
    num_warmup: int = 1000,
    num_samples: int = 1000,
    obs_site: str = "y",
    fold_seed: int = 0,
    init_strategy=init_to_uniform,
    **options,
) -> CrossValidation:
    """n-fold cross-validated adaptive HMC of a NumPyro model (one chain per fold).

    Parameters
    ----------
    model
        ``model(X, y=None)`` with the targets observed at ``obs_site``.
    X, y
        Training inputs and targets (leading case axis).
    rng_key
        A JAX PRNG key.
    num_folds
        Number of folds = number of chains (random near-equal split, ``fold_seed``).
    loss
        ``"mse"``, ``"classification_error"``, ``"nlpd"`` or a callable
        ``(mean, log_density, y) -> (n,)``; see :mod:`ahmc.adapters.predictive`.
    num_warmup, num_samples, **options
        Passed to :func:`ahmc.adapters.predictive.run_cross_validation`
        (``round_length``, ``super_transitions``, ``metric_fraction``, ...).
    """
    if not callable(model):
        raise ValueError("model must be a NumPyro model callable model(X, y=None).")
    get_loss(loss)
    X, y = jnp.asarray(X), jnp.asarray(y)
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X and y must have the same number of cases; got {X.shape[0]} and {y.shape[0]}.")
    held_out = fold_masks(X.shape[0], num_folds, fold_seed)
    key_init, key_run = jax.random.split(rng_key)

    # Initial points from NumPyro (one per fold), flattened.
    flats = []
    for key in jax.random.split(key_init, num_folds):
        info = initialize_model(key, model, model_args=(X, y), init_strategy=init_strategy)[0]
        flat, unravel = ravel_pytree(info.z)
        flats.append(flat)
    x0 = jnp.stack(flats)

    def logdensity_fn(x, train_mask):
        masked = _MaskSite(model, obs_site, train_mask)
        return -potential_energy(masked, (X, y), {}, unravel(x))

    def constrained(x):
        return constrain_fn(model, (X, y), {}, unravel(x), return_deterministic=True)

    def predict_fn(x):
        dist = _observation(model, constrained(x), X, y, obs_site)
        return dist.mean, _case_log_prob(dist, y)

    run = run_cross_validation(key_run, logdensity_fn, predict_fn, y, held_out, x0, num_warmup=num_warmup,
                               num_samples=num_samples, loss=loss, **options)
    draws = jnp.asarray(run.positions)
    samples = jax.jit(jax.vmap(jax.vmap(constrained)))(draws)

    # The final CV estimate: each fold's predictions averaged over all its draws.
    loss_fn = get_loss(loss)
    fold_losses = []
    for c in range(num_folds):
        mean, logd = predictive_average(model, jax.tree.map(lambda v: v[c], samples), X, y, obs_site=obs_site)
        fold_losses.append(float(predictive_loss(loss_fn, mean, logd, 1, y, jnp.asarray(held_out[c], mean.dtype))))
    fold_losses = np.asarray(fold_losses)
    return CrossValidation(samples=samples, run=run, held_out=held_out, cv_loss=float(np.mean(fold_losses)),
                           fold_cv_losses=fold_losses, model=model, obs_site=obs_site)


def nuts_at_budget(model, X, y, *, rng_key, num_chains: int, num_warmup: int, num_gradients: float,
                   budget_includes_warmup: bool = False, max_tree_depth: int = 10, max_samples: int = 100_000):
    """NumPyro NUTS baseline with (about) a given number of gradient evaluations per chain.

    Runs ``num_chains`` vectorized chains on all of ``(X, y)``: warm-up first, then as many
    draws as the budget left (``num_gradients``, minus the warm-up's gradients when
    ``budget_includes_warmup``) divided by the mean tree size of the last half of warm-up
    (at least 10 draws).
    Returns ``(samples, gradients)``: constrained draws (chains flattened) and a dict of the
    gradient evaluations per chain in ``warmup`` and ``sampling``.
    """
    mcmc = MCMC(NUTS(model, max_tree_depth=max_tree_depth), num_warmup=num_warmup, num_samples=1,
                num_chains=num_chains, chain_method="vectorized", progress_bar=False)
    key_warm, key_run = jax.random.split(rng_key)
    mcmc.warmup(key_warm, X, y, extra_fields=("num_steps",), collect_warmup=True)
    warm_steps = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["num_steps"], float)
    per_draw = float(np.mean(warm_steps[:, warm_steps.shape[1] // 2:]))
    if budget_includes_warmup:
        num_gradients = num_gradients - float(np.mean(warm_steps.sum(axis=1)))
    num_draws = int(min(max(round(num_gradients / per_draw), 10), max_samples))
    mcmc.num_samples = num_draws
    mcmc.run(key_run, X, y, extra_fields=("num_steps",))
    steps = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["num_steps"], float)
    gradients = {"warmup": float(np.mean(warm_steps.sum(axis=1))), "sampling": float(np.mean(steps.sum(axis=1))),
                 "num_draws": num_draws}
    return mcmc.get_samples(), gradients
