"""The expected Fisher information of a PyMC model, variable by variable, as an RMHMC metric (PyTensor).

The construction of ``_numpyro_fisher`` (see its docstring) on a PyMC model's graph: every random
variable adds, for each parameter of its distribution that moves with the position, that
parameter's Fisher information through the chain rule, and a free variable its own expected
curvature in the sampler's coordinate (``log value`` for positive variables, the log-odds of the
position in the interval for Beta and Uniform).  A location-scale
variable enters through its residual ``value - loc``.  The metric is ``diag(own) + J^T diag(w) J``;
the parts are PyTensor expressions of the model's value variables, which the RMHMC step joins
into its flat position with the log density, so PyTensor's autodiff gives the derivatives.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import pytensor.tensor as pt
from pymc.logprob.transforms import IntervalTransform, LogOddsTransform, LogTransform
from pytensor.scalar.math import Sigmoid
from pytensor.tensor.elemwise import DimShuffle, Elemwise
from pytensor.tensor.special import Softmax

try:  # PyTensor >= 2.31
    from pytensor.graph.traversal import ancestors
except ImportError:  # pragma: no cover
    from pytensor.graph.basic import ancestors

__all__ = ["FisherParts", "fisher_parts", "assemble_fisher", "flatten_parts", "unflatten_parts"]

REAL = ("NormalRV", "CauchyRV", "StudentTRV", "LaplaceRV", "MvNormalRV")
POSITIVE = ("HalfNormalRV", "HalfCauchyRV", "ExponentialRV", "LogNormalRV", "GammaRV", "InvGammaRV")
INTERVAL = ("BetaRV", "UniformRV")  # sampled in the log-odds of the position in the interval
LATENT_ONLY = ("UniformRV",)  # an observed Uniform's bounds have no regular Fisher information
# The sampler's coordinate each family's own term is written in: its default transform.
TRANSFORMS = {**dict.fromkeys(REAL, type(None)), **dict.fromkeys(POSITIVE, LogTransform),
              "BetaRV": LogOddsTransform, "UniformRV": IntervalTransform}
BLOCK = "block"  # the offset of a term that carries a (k, k) Fisher block over k stacked parameters
RESIDUAL_BLOCK = "residual block"  # the same over a residual value - loc: a free variable's own term
COVARIANCE = "covariance"  # a precision P with its covariance S: 1/2 tr(P dS_i P dS_j)
OBSERVED_ONLY = ("BernoulliRV", "BinomialRV", "PoissonRV", "CategoricalRV", "MultinomialRV")


class FisherParts(NamedTuple):
    """Expressions in the value variables: the own terms' diagonal over ``vars`` (flattened in their
    order), the quantities with their weights for the Jacobian part, and the multi-parameter blocks, one
    per variable that has them: ``(n, k)`` parameters with their ``(n, k, k)`` Fisher matrices (the
    gammas' and Beta's k = 2, a Categorical's k = its number of categories), and the covariances that
    move with the position, ``(n, k, k)`` each with its precision matrices (an MvNormal's)."""

    own_diagonal: Any
    quantities: Any
    weights: Any
    block_quantities: tuple = ()
    blocks: tuple = ()
    covariances: tuple = ()
    precisions: tuple = ()


def flatten_parts(parts: FisherParts) -> list:
    """The parts as one list of tensors (to join them into the flat position with the log density)."""
    return [parts.own_diagonal, parts.quantities, parts.weights, *parts.block_quantities, *parts.blocks,
            *parts.covariances, *parts.precisions]


def unflatten_parts(tensors, like: FisherParts) -> FisherParts:
    """The inverse of :func:`flatten_parts`, for parts shaped ``like`` (the same numbers of groups)."""
    own_diagonal, quantities, weights, *rest = tensors
    groups, start = [], 0
    for field in (like.block_quantities, like.blocks, like.covariances, like.precisions):
        groups.append(tuple(rest[start:start + len(field)]))
        start += len(field)
    return FisherParts(own_diagonal, quantities, weights, *groups)


def _logit_of(p):
    """``eta`` where ``p = sigmoid(eta)`` in the graph (through dimension shuffles), else None: the
    Fisher weight of a logit, ``p (1 - p)``, stays finite where ``1 / (p (1 - p))`` would not."""
    shuffles = []
    while p.owner is not None and isinstance(p.owner.op, DimShuffle):
        shuffles.append(p.owner.op)
        p = p.owner.inputs[0]
    if p.owner is None or not (isinstance(p.owner.op, Elemwise) and isinstance(p.owner.op.scalar_op, Sigmoid)):
        return None
    eta = p.owner.inputs[0]
    for op in reversed(shuffles):
        eta = op(eta)
    return eta


def _softmax_logits(p):
    """Logits of category probabilities ``p``: the softmax's input when the graph has one over the last
    axis (through dimension shuffles; finite where ``log p`` would not be), else ``log p``."""
    shuffles, inner, last_kept = [], p, True
    while inner.owner is not None and isinstance(inner.owner.op, DimShuffle):
        op, inner = inner.owner.op, inner.owner.inputs[0]
        last_kept &= op.new_order[-1] == inner.ndim - 1  # the category axis stays the last one
        shuffles.append(op)
    if not last_kept or inner.owner is None or not isinstance(inner.owner.op, Softmax):
        return pt.log(p)
    axis = inner.owner.op.axis
    if tuple(a % inner.ndim for a in (axis if isinstance(axis, tuple | list) else (axis,))) != (inner.ndim - 1,):
        return pt.log(p)
    eta = inner.owner.inputs[0]
    for op in reversed(shuffles):
        eta = op(eta)
    return eta


def _softmax_block(p, count=1.0):
    """``count (diag(p) - p p^T)``: the Fisher information of the logits of a k-category draw."""
    count = pt.as_tensor_variable(count)[..., None, None]
    return count * (p[..., :, None] * pt.eye(p.shape[-1]) - p[..., :, None] * p[..., None, :])


def _probability_term(p, count=1.0):
    eta = _logit_of(p)
    if eta is not None:
        return (count * p * (1.0 - p), eta)
    return (count / (p * (1.0 - p)), p)


def _block(a, b, fisher_aa, fisher_ab, fisher_bb):
    """A two-parameter Fisher block over the stacked parameters (a, b)."""
    fisher = pt.stack([pt.stack([fisher_aa, fisher_ab], axis=-1), pt.stack([fisher_ab, fisher_bb], axis=-1)],
                      axis=-2)
    return (fisher, pt.stack([a, b], axis=-1), BLOCK)


def _terms(kind, params, value, log_value):
    """[(weight, quantity, offset)] of one variable.  ``offset`` is False for a parameter's term; for
    the variable's own term it is None (``log_value``, the value variable of a free variable sampled in
    a transformed coordinate: the identity Jacobian) or the location of the residual ``value - loc``
    (the identity too unless the location moves with the position)."""
    if kind == "NormalRV":
        mu, sigma = params
        return [(1.0 / sigma**2, value - mu, mu), (2.0 / sigma**2, sigma, False)]
    if kind == "CauchyRV":
        alpha, beta = params
        return [(0.5 / beta**2, value - alpha, alpha), (0.5 / beta**2, beta, False)]
    if kind == "StudentTRV":
        nu, mu, sigma = params
        return [((nu + 1.0) / ((nu + 3.0) * sigma**2), value - mu, mu),
                (2.0 * nu / ((nu + 3.0) * sigma**2), sigma, False)]
    if kind == "LogNormalRV":  # in log(value) a Normal: residual and scale as for the Normal
        mu, sigma = params
        log_value = pt.log(value) if log_value is None else log_value
        return [(1.0 / sigma**2, log_value - mu, mu), (2.0 / sigma**2, sigma, False)]
    if kind == "MvNormalRV":  # the precision P over the residual, and 1/2 tr(P dS_i P dS_j) for the covariance S
        mu, cov = params
        precision = pt.linalg.solve(cov, pt.eye(cov.shape[-1]), assume_a="pos")
        return [(precision, value - mu, RESIDUAL_BLOCK), (precision, cov, COVARIANCE)]
    if kind == "LaplaceRV":
        mu, b = params
        return [(1.0 / b**2, value - mu, mu), (1.0 / b**2, b, False)]
    if kind == "GammaRV":  # PyTensor's (shape a, scale t): Fisher [[trigamma(a), 1/t], [1/t, a/t^2]]
        a, t = pt.broadcast_arrays(*params)
        terms = [_block(a, t, pt.tri_gamma(a), 1.0 / t, a / t**2)]
        if log_value is not None:  # in log(value) the curvature of -log p is value / t, expectation a
            terms.append((a, log_value, None))
        return terms
    if kind == "InvGammaRV":  # (a, b), 1 / value ~ Gamma(a, rate b): Fisher [[trigamma(a), -1/b], [-1/b, a/b^2]]
        a, b = pt.broadcast_arrays(*params)
        terms = [_block(a, b, pt.tri_gamma(a), -1.0 / b, a / b**2)]
        if log_value is not None:  # in log(value) the curvature of -log p is b / value, expectation a
            terms.append((a, log_value, None))
        return terms
    if kind == "BetaRV":  # Fisher [[trigamma(a) - t, -t], [-t, trigamma(b) - t]], t = trigamma(a + b)
        a, b = pt.broadcast_arrays(*params)
        t = pt.tri_gamma(a + b)
        terms = [_block(a, b, pt.tri_gamma(a) - t, -t, pt.tri_gamma(b) - t)]
        if log_value is not None:  # in log-odds: curvature (a + b) value (1 - value), expectation a b / (a + b + 1)
            terms.append((a * b / (a + b + 1.0), log_value, None))
        return terms
    if kind == "UniformRV":  # free only, fixed bounds (checked by the caller): curvature 2 s (1 - s), expectation 1/3
        return [(pt.as_tensor_variable(1.0 / 3.0), log_value, None)]
    if kind in POSITIVE:
        # (scale's Fisher coefficient c: weight c / scale^2; the curvature of -log p in log(value))
        coefficient, curvature = {"HalfNormalRV": (2.0, 2.0), "HalfCauchyRV": (0.5, 0.5),
                                  "ExponentialRV": (1.0, 1.0)}[kind]
        scale = params[-1]  # HalfNormal (loc, sigma), HalfCauchy (beta), Exponential (scale)
        terms = [(coefficient / scale**2, scale, False)]
        if log_value is not None:
            terms.append((pt.as_tensor_variable(curvature), log_value, None))
        return terms
    if kind == "BernoulliRV":
        return [(*_probability_term(params[0]), False)]
    if kind == "BinomialRV":
        n, p = params
        return [(*_probability_term(p, n), False)]
    if kind == "PoissonRV":
        return [(1.0 / params[0], params[0], False)]
    if kind == "CategoricalRV":
        p = params[0]
        return [(_softmax_block(p), _softmax_logits(p), BLOCK)]
    if kind == "MultinomialRV":
        n, p = params
        return [(_softmax_block(p, n), _softmax_logits(p), BLOCK)]
    raise AssertionError(kind)


def _per_draw(x, draws, tail):
    """``x`` broadcast to ``draws + tail`` and flattened to ``(n, *tail)``, one row per draw, in float64."""
    return pt.cast(pt.broadcast_to(x, (*draws, *tail)).reshape((-1, *tail)), "float64")


def _depends_on(expression, variables) -> bool:
    wanted = set(variables)
    return any(v in wanted for v in ancestors([pt.as_tensor_variable(expression)]))


def fisher_parts(model, vars) -> FisherParts:
    """The metric's parts for the step's value variables ``vars`` of ``model``; a ``ValueError`` names
    any variable whose distribution (or transform) the metric has no Fisher information for."""
    own = {v: None for v in vars}
    covered = set()  # variables whose own term is in (on the diagonal, or with the Jacobian terms)
    weights, quantities, blocks, block_quantities, covariances, precisions = [], [], [], [], [], []
    for rv in model.free_RVs + model.observed_RVs:
        kind = type(rv.owner.op).__name__
        free = rv in model.free_RVs
        transform = model.rvs_to_transforms.get(rv)
        supported = ((kind in REAL + POSITIVE + INTERVAL and (free or kind not in LATENT_ONLY))
                     or (kind in OBSERVED_ONLY and not free))
        if not supported or (free and not isinstance(transform, TRANSFORMS[kind])):
            what = "distribution" if not supported else f"transform {type(transform).__name__}"
            raise ValueError(
                f"metric='fisher' has no Fisher information for {'free' if free else 'observed'} variable "
                f"{rv.name!r} ({kind}, {what}); it supports Normal, Cauchy, StudentT, Laplace, HalfNormal, "
                "HalfCauchy, Exponential, LogNormal, Gamma, InverseGamma, Beta and MvNormal variables and free "
                "Uniform ones, with their default transforms, and observed Bernoulli, Binomial, Poisson, "
                "Categorical and Multinomial. Use metric=None (SoftAbs) or pass your own metric callable."
            )
        params = model.replace_rvs_by_values(rv.owner.op.dist_params(rv.owner))
        if kind == "UniformRV" and _depends_on(pt.stack(pt.broadcast_arrays(*params)), vars):
            raise ValueError(f"metric='fisher' needs the bounds of the Uniform variable {rv.name!r} fixed: they "
                             "move with the position, and a moving support has no Fisher information. Use "
                             "metric=None (SoftAbs) or pass your own metric callable.")
        value = model.rvs_to_values[rv]
        shape = tuple(pt.as_tensor_variable(value).shape)  # not rv.shape: that graph holds the random variable
        draws = shape[:len(shape) - rv.owner.op.ndim_supp]  # one block per draw (a Multinomial's is a vector)
        transformed = free and kind in POSITIVE + INTERVAL
        for weight, quantity, offset in _terms(kind, params, value, value if transformed else None):
            if isinstance(offset, str) and offset == COVARIANCE:
                if _depends_on(quantity, vars):
                    k = quantity.shape[-1]
                    covariances.append(_per_draw(quantity, draws, (k, k)))
                    precisions.append(_per_draw(weight, draws, (k, k)))
                continue
            if isinstance(offset, str) and offset in (BLOCK, RESIDUAL_BLOCK):
                if offset == RESIDUAL_BLOCK and free:
                    covered.add(value)
                if _depends_on(quantity, vars):
                    k = quantity.shape[-1]
                    blocks.append(_per_draw(weight, draws, (k, k)))
                    block_quantities.append(_per_draw(quantity, draws, (k,)))
                continue
            weight = pt.broadcast_to(pt.as_tensor_variable(weight), shape)
            if free and offset is not False and value in own:  # the variable's own term
                covered.add(value)
                if offset is None or not _depends_on(offset, vars):  # its Jacobian is the identity
                    own[value] = weight if own[value] is None else own[value] + weight
                    continue
            if not _depends_on(quantity, vars):
                continue  # a fixed parameter: zero Jacobian rows
            weights.append(weight.ravel())
            quantities.append(pt.broadcast_to(pt.as_tensor_variable(quantity), shape).ravel())
    missing = [v.name for v in vars if v not in covered]
    if missing:  # every supported free variable has an own term; this guards the metric's definiteness
        raise ValueError(f"metric='fisher' found no own term for {missing}.")
    own_diagonal = pt.concatenate([pt.zeros_like(v, dtype="float64").ravel() if own[v] is None
                                   else pt.cast(pt.broadcast_to(own[v], v.shape), "float64").ravel() for v in vars])
    def joined(pieces, empty_shape):
        if not pieces:
            return pt.zeros(empty_shape, dtype="float64")
        return pt.cast(pt.concatenate(pieces), "float64")

    return FisherParts(own_diagonal, joined(quantities, (0,)), joined(weights, (0,)), tuple(block_quantities),
                       tuple(blocks), tuple(covariances), tuple(precisions))


def assemble_fisher(parts: FisherParts, flat, jacobian, diagonal: bool):
    """``diag(own) + J^T diag(w) J + sum_n J_n^T F_n J_n`` (or its diagonal) from the parts as functions of
    the flat position (``jacobian(expression, flat)``: the Jacobian of a vector expression)."""
    metric = parts.own_diagonal if diagonal else pt.diag(parts.own_diagonal)
    if parts.quantities.type.shape[0] != 0:
        J = jacobian(parts.quantities, flat)  # (M, d)
        metric = metric + (pt.sum(parts.weights[:, None] * J**2, axis=0) if diagonal
                           else J.T @ (parts.weights[:, None] * J))
    for quantities, blocks in zip(parts.block_quantities, parts.blocks, strict=True):
        k = quantities.shape[-1]
        J = jacobian(quantities.ravel(), flat).reshape((-1, k, flat.shape[0]))  # (n, k, d)
        FJ = pt.sum(blocks[:, :, :, None] * J[:, None, :, :], axis=2)  # (n, k, d): F_n J_n
        metric = metric + (pt.sum(J * FJ, axis=(0, 1)) if diagonal else pt.tensordot(J, FJ, axes=[[0, 1], [0, 1]]))
    for covariances, precisions in zip(parts.covariances, parts.precisions, strict=True):
        n, k, d = covariances.shape[0], covariances.shape[-1], flat.shape[0]
        J = jacobian(covariances.ravel(), flat).reshape((n, k, k * d))  # dS/du as (n, k, k d)
        A = pt.matmul(precisions, J).reshape((n, k, k, d))  # P dS/du_i
        At = A.transpose(0, 2, 1, 3)  # 1/2 tr(P dS_i P dS_j) = 1/2 sum over (n, a, b) of A[n,a,b,i] A[n,b,a,j]
        metric = metric + 0.5 * (pt.sum(A * At, axis=(0, 1, 2)) if diagonal
                                 else pt.tensordot(A, At, axes=[[0, 1, 2], [0, 1, 2]]))
    return metric
