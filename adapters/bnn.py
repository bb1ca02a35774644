"""Bayesian neural networks in NumPyro, in the style of Neal (1992, 1996).

Feed-forward networks with ``tanh`` hidden layers.  Every weight group (the
weights into a layer, that layer's biases, the output weights, the output
biases) has its own precision ``tau_g ~ Gamma(a, b)`` and Gaussian weights
``w ~ N(0, 1 / tau_g)``; the weights into the output layer are further scaled
by the number of hidden units feeding them (Neal's scaling, so the prior on
the function stays sensible as the layer widens).  Regression adds Gaussian
noise whose precision has a Gamma prior; classification has a Bernoulli
output with the network's output as logit.

The weights are written non-centred (``w = z / sqrt(tau_g)``, ``z ~ N(0, 1)``):
HMC then samples weights and precisions jointly without the funnel that the
centred form creates (Neal alternated HMC on the weights with Gibbs updates of
the precisions instead).  Inputs are best standardized.

Models take ``(X, y=None)`` and observe ``"y"``; use them with
:func:`ahmc.adapters.numpyro.cross_validate`, ``NUTS``, or ``AdaptiveHMC``.
"""

from __future__ import annotations

from functools import partial

from ._extras import require

require("numpyro", "numpyro")
import jax.numpy as jnp  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402

__all__ = ["bnn_regression", "bnn_classification", "network", "make_bnn"]


def _group(name, shape, precision_prior, fan_in=1):
    """One weight group: a precision and non-centred Gaussian weights, scaled by ``1/sqrt(fan_in)``."""
    a, b = precision_prior
    tau = numpyro.sample(f"{name}_precision", dist.Gamma(a, b))
    z = numpyro.sample(f"{name}_z", dist.Normal(0.0, 1.0).expand(shape).to_event(len(shape)))
    return z / jnp.sqrt(tau * fan_in)


def network(X, hidden, num_outputs, precision_prior):
    """Sample the weights and return the network's output ``(n, num_outputs)``."""
    h = jnp.asarray(X)
    width = h.shape[-1]
    for layer, units in enumerate(hidden, start=1):
        W = _group(f"W{layer}", (width, units), precision_prior)
        b = _group(f"b{layer}", (units,), precision_prior)
        h = jnp.tanh(h @ W + b)
        width = units
    W = _group("W_out", (width, num_outputs), precision_prior, fan_in=width)
    b = _group("b_out", (num_outputs,), precision_prior)
    return h @ W + b


def bnn_regression(X, y=None, *, hidden=(16,), num_outputs=1, precision_prior=(1.0, 1.0),
                   noise_precision_prior=(1.0, 0.01)):
    """Regression BNN: ``y ~ N(f(x), 1 / noise_precision)`` per output; ``y`` is ``(n, num_outputs)``.

    ``precision_prior`` / ``noise_precision_prior``: ``(concentration, rate)`` of the Gamma priors.
    The default noise prior (mean precision 100, wide) suits standardized targets.
    """
    out = network(X, hidden, num_outputs, precision_prior)
    a, b = noise_precision_prior
    noise_precision = numpyro.sample("noise_precision", dist.Gamma(a, b))
    sigma = 1.0 / jnp.sqrt(noise_precision)
    numpyro.sample("y", dist.Normal(out, sigma).to_event(1), obs=y)


def bnn_classification(X, y=None, *, hidden=(20, 8), precision_prior=(1.0, 1.0)):
    """Binary classification BNN: ``y ~ Bernoulli(sigmoid(f(x)))``, ``y`` of shape ``(n,)`` in {0, 1}."""
    out = network(X, hidden, 1, precision_prior)[..., 0]
    numpyro.sample("y", dist.Bernoulli(logits=out), obs=y)


def make_bnn(kind: str = "regression", **settings):
    """A model ``(X, y=None)`` with fixed settings, e.g. ``make_bnn("regression", hidden=(16,), num_outputs=2)``."""
    if kind not in ("regression", "classification"):
        raise ValueError(f"kind must be 'regression' or 'classification'; got {kind!r}.")
    hidden = settings.get("hidden", (16,) if kind == "regression" else (20, 8))
    if not hidden or any(int(h) < 1 for h in hidden):
        raise ValueError(f"hidden must be a non-empty sequence of positive layer widths; got {hidden!r}.")
    return partial(bnn_regression if kind == "regression" else bnn_classification, **settings)
