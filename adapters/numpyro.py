"""NumPyro kernel: ``MCMC(AdaptiveHMC(model), ...)``, a drop-in beside ``NUTS``.

A thin :class:`numpyro.infer.mcmc.MCMCKernel` over the shared JAX engine
(:mod:`ahmc.adapters._jax_engine`): NumPyro supplies the model's potential,
initial values and constraining transforms (``initialize_model``); the engine
makes the BlackJAX transitions and runs the GP-UCB tuner.

Chains and pooling.  NumPyro runs ``chain_method="sequential"`` and
``"parallel"`` chains as separate programs, so each chain has its own tuner.
With ``chain_method="vectorized"`` the kernel receives all chains at once and
they share one tuner: the chain-mean reward enters the GP once per round
(``pooled=False`` gives independent tuners there too).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from ._extras import require

require("numpyro", "numpyro")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402
from numpyro.handlers import seed, trace  # noqa: E402
from numpyro.infer.initialization import init_to_uniform  # noqa: E402
from numpyro.infer.mcmc import MCMCKernel  # noqa: E402
from numpyro.infer.util import initialize_model  # noqa: E402
from numpyro.util import identity, is_prng_key  # noqa: E402

from ahmc.core.snapshot import metric_name  # noqa: E402

from ._jax_engine import EngineState, build_engine  # noqa: E402
from ._jax_run import compiled_data_init, traced  # noqa: E402
from ._jax_snapshot import engine_snapshot, load_snapshot, prepare_warm_start  # noqa: E402
from ._jax_sharding import chain_mesh, set_mesh, shard_chains, traced_mesh_context  # noqa: E402
from ._jax_metrics import DEFAULT_SOFTABS_ALPHA, constant_metric, fisher_logistic_metric  # noqa: E402
from ._jax_rmhmc import DEFAULT_MAX_FIXED_POINT_ITERATIONS, build_rmhmc_engine, kernel_for  # noqa: E402
from ._numpyro_fisher import fisher_from_model, model_fisher_metric  # noqa: E402

__all__ = ["AdaptiveHMC", "AdaptiveHMCState", "AdaptiveRMHMC", "AdaptiveRMHMCState", "constant_metric",
           "fisher_logistic_metric", "model_fisher_metric", "shard_chains", "tuning_snapshot"]

#: The key of the warm-start check under ``chain_method="parallel"``, whose traced keys it cannot use.
PARALLEL_CHECK_SEED = 20130617

# Metrics read off the model's sites (``_numpyro_fisher``): they need ``model``, not ``potential_fn``.
MODEL_METRICS = ("fisher", "diagonal_fisher")


def _is_model_metric(metric) -> bool:
    return isinstance(metric, str) and metric in MODEL_METRICS


class AdaptiveHMCState(NamedTuple):
    """State of :class:`AdaptiveHMC` (batched over chains when vectorized).

    i                  iteration index (warm-up while ``i < num_warmup``)
    z                  unconstrained position (the sample field)
    potential_energy   minus the log density at ``z``
    energy             total energy (potential + kinetic) of the state after the transition, as in
                       NumPyro's ``HMCState``: the proposal's if accepted, else the starting point's
    num_steps          leapfrog steps taken this iteration (gradient evaluations), a retry's included
    accept_prob        Metropolis acceptance probability
    mean_accept_prob   running mean of ``accept_prob`` over the current phase (warm-up, then draws), as
                       NumPyro's ``HMCState`` keeps it
    diverging          whether the transition diverged
    step_size          step size used
    max_steps          the tuner's arm ``L`` (steps are drawn from ``{1..L}``, or from
                       ``{ceil(f L)..L}`` with ``min_steps_fraction=f``)
    reward             reward fed to the tuner at a round's end, else NaN
    tuning_round       GP round of this iteration (0 before the GP phase)
    arm_changed        whether the tuner moved the arm after this iteration
    adapt_probability  the annealed probability ``p_i`` in effect
    restarted          the chain was lost in warm-up and restarted from another chain's position
    retried            the trajectory diverged and the transition retried with a finer step
                       (``divergence_retry``); ``diverging`` is then whether the retry diverged too
    engine             the engine's state (tuner, mass matrix, round sums)
    rng_key            random key

    Read like NumPyro's ``HMCState`` too (properties, so ``extra_fields=("adapt_state.step_size",)`` and
    the like work as with ``NUTS``): ``adapt_state`` (``step_size``: this iteration's;
    ``inverse_mass_matrix``: the flattened position's, diagonal or dense, one for all vectorized chains),
    ``z_grad`` (gradient of the potential energy at ``z``) and ``trajectory_length`` (``step_size *
    num_steps``, the integration time run).
    """

    i: Any
    z: Any
    potential_energy: Any
    energy: Any
    num_steps: Any
    accept_prob: Any
    mean_accept_prob: Any
    diverging: Any
    step_size: Any
    max_steps: Any
    reward: Any
    tuning_round: Any
    arm_changed: Any
    adapt_probability: Any
    restarted: Any
    retried: Any
    engine: EngineState
    rng_key: Any


TUNER_FIELDS = ("step_size", "max_steps", "num_steps", "accept_prob", "reward", "tuning_round",
                "arm_changed", "adapt_probability", "restarted", "retried", "potential_energy", "energy")


class AdaptState(NamedTuple):
    """``state.adapt_state``: the fields of NumPyro's ``HMCAdaptState`` that have a meaning here."""

    step_size: Any
    inverse_mass_matrix: Any


def _per_chain(state, value):
    """An engine-wide value (one for all vectorized chains) with the state's chain axis, as NumPyro's
    vectorized ``HMCState`` fields have it; a single chain's as it is."""
    batch = jnp.shape(state.i)
    return jnp.broadcast_to(value, batch + jnp.shape(value)) if batch else value


def _engine_chains(state, tree):
    """A chain-batched engine field for the state's chains (a single chain's engine keeps an axis of 1)."""
    return tree if jnp.ndim(state.i) else jax.tree.map(lambda x: x[0], tree)


def _adapt_state(state):
    return AdaptState(state.step_size, _per_chain(state, state.engine.inverse_mass_matrix))


def _z_grad(state):
    return jax.tree.map(jnp.negative, _engine_chains(state, state.engine.logdensity_grad))


def _trajectory_length(state):
    return state.step_size * state.num_steps


class AdaptiveHMC(MCMCKernel):
    """Adaptive HMC: GP-UCB tuning of step size and path length (Wang et al. 2013).

    Parameters
    ----------
    model
        A NumPyro model with continuous latent sites.
    potential_fn
        Instead of ``model``: the potential energy (minus log density) of an
        unconstrained position pytree; then ``init_params`` must be given to
        ``MCMC.run``.
    init_strategy
        NumPyro initialisation strategy for ``model`` (default ``init_to_uniform``).
    **options
        Tuning knobs, the same names and defaults as the BlackJAX routine
        (:func:`ahmc.adapters.blackjax.gpucb_adaptation`): ``step_size_bounds``,
        ``num_steps_bounds``, ``adapt_mass_matrix``, ``dense_mass`` (``True``: a dense mass matrix, as
        NumPyro's NUTS option; one matrix over all sites; ``"auto"``: dense only where the warm-up
        finds correlations beyond estimation noise), ``round_length``,
        ``objective``, ``divergence_penalty``, ``jump_estimate``, ``min_steps_fraction``, ``shared_num_steps`` (default True;
        with ``chain_method="vectorized"`` all chains take the same number of leapfrog steps each iteration),
        ``schedule``, ``k``,
        ``freeze_after`` (rounds, or ``"warmup"``), ``pooled`` (vectorized chains only), and the GP settings
        ``capacity``, ``lengthscale``, ``noise_variance``, ``alpha``, ``delta``.
        ``restart_lost_chains`` (default True): with 3+ vectorized chains the
        warm-up restarts a chain lost far below the others from another
        chain's position; a chain still lost or stuck at the end of warm-up
        gets a ``UserWarning``.
        ``sequential_chains`` (vectorized chains): their transitions run one after another inside the
        compiled step instead of ``vmap``-ed; :class:`AdaptiveRMHMC`'s default with SoftAbs (its
        implicit solves take a different number of iterations on each chain, and ``vmap``-ed chains
        wait for the slowest).
        ``warm_start``: a :func:`tuning_snapshot` of an earlier fit (or the path it was saved to).  ``init``
        first checks it on a short run; when it fits, the warm-up starts from its mass matrix, step size,
        GP evidence and positions, so ``num_warmup`` of a few hundred does.  When it does not, a
        ``WarmStartWarning`` says why and the tuner starts cold (give ``num_warmup=1000`` then).
        Every ``chain_method``; with ``"parallel"`` the check runs while NumPyro traces ``init``.

    Examples
    --------
    >>> mcmc = MCMC(AdaptiveHMC(model), num_warmup=1000, num_samples=1000)  # doctest: +SKIP
    >>> mcmc.run(jax.random.key(0), data)                                    # doctest: +SKIP
    """

    sample_field = "z"
    _state_class = AdaptiveHMCState

    def __init__(self, model=None, potential_fn=None, *, init_strategy: Callable = init_to_uniform, **options):
        if (model is None) == (potential_fn is None):
            raise ValueError("Give exactly one of `model` or `potential_fn`.")
        self._model = model
        self._potential_fn = potential_fn
        self._init_strategy = init_strategy
        self._warm_start = None if options.get("warm_start") is None else load_snapshot(options["warm_start"])
        self._options = {name: value for name, value in options.items() if name != "warm_start"}
        self._run_options = self._options
        self._num_warmup = None
        self._potential_fn_gen = None
        self._postprocess_fn = None
        self._sample_fn = None
        self._vectorized = False
        self._mesh = None  # the chains' device mesh, set by init when they are sharded
        self._unravel = None
        self._build_engine(lambda x: -jnp.sum(x**2), num_warmup=100, **self._options)  # validate knobs now

    @property
    def model(self):
        return self._model

    @property
    def default_fields(self):
        return ("z", "diverging") + TUNER_FIELDS

    def get_diagnostics_str(self, state):
        return "{} steps of size {:.2e} (L={}). acc. prob={:.2f}".format(
            int(state.num_steps), float(state.step_size), int(state.max_steps), float(state.mean_accept_prob)
        )

    def postprocess_fn(self, model_args, model_kwargs):
        if self._postprocess_fn is None:
            return identity
        return self._postprocess_fn(*model_args, **model_kwargs)

    # -- construction -------------------------------------------------------------------------

    def _logdensity_fn(self, model_args, model_kwargs):
        if self._potential_fn_gen is not None:
            potential = self._potential_fn_gen(*model_args, **model_kwargs)
        else:
            potential = self._potential_fn
        return lambda z: -potential(z)

    def _engine(self, model_args, model_kwargs):
        # Built inside NumPyro's jitted loop (model args may be traced): the engine's static
        # schedules must stay concrete NumPy values.
        with jax.ensure_compile_time_eval():
            return self._build_engine(self._logdensity_fn(model_args, model_kwargs), num_warmup=self._num_warmup,
                                      **self._run_options)

    def _check_warm_start(self, positions, rng_key, model_args, model_kwargs):
        """``(positions, rng_key)`` after the ``warm_start`` check; sets the options the engine is built with.

        Without ``warm_start`` nothing changes (the same key, so the same draws)."""
        self._run_options = self._options
        if self._warm_start is None:
            return positions, rng_key
        if isinstance(rng_key, jax.core.Tracer):
            return self._check_warm_start_traced(positions, rng_key, model_args, model_kwargs)
        rng_key, check_key = jax.random.split(rng_key)
        # Sequential chains each start from another of the snapshot's chains.
        first_row = 0 if self._vectorized else int(jax.random.randint(check_key, (), 0, 1 << 20))
        _, positions = self._prepare_warm_start(positions, check_key, first_row, model_args, model_kwargs)
        return positions, rng_key

    def _prepare_warm_start(self, positions, check_key, first_row, model_args, model_kwargs):
        """:func:`prepare_warm_start` for this kernel and the model's arguments; sets the engine's options."""
        kernel, metric = self._check_kernel(model_args, model_kwargs)
        snapshot, positions, _ = prepare_warm_start(
            self._logdensity_fn(model_args, model_kwargs), positions, self._warm_start, check_key,
            name=type(self).__name__, first_row=first_row, kernel=kernel, metric=metric,
            data_logdensity=(lambda data: self._logdensity_fn(*data), (model_args, model_kwargs)),
            fallback=f"The tuner starts cold within num_warmup={self._num_warmup} (a cold warm-up wants about 1000)")
        self._run_options = {**self._options, "warm_start": snapshot}
        return snapshot, positions

    def _check_warm_start_traced(self, positions, rng_key, model_args, model_kwargs):
        """``chain_method="parallel"``: NumPyro traces ``init`` once for every chain (``pmap``), so the check
        runs while tracing, on concrete values: the snapshot's rows are its chains (with a key of its own),
        and each chain starts from the row its own traced key picks."""
        if traced(model_args, model_kwargs):
            raise ValueError("AdaptiveHMC(warm_start=...) with chain_method='parallel' checks the snapshot while "
                             "NumPyro traces init, which needs the model's arguments concrete, and here they are "
                             "traced; use chain_method='vectorized'.")
        rows = self._warm_start.positions.shape[0]
        with jax.ensure_compile_time_eval():
            stand_in = jax.tree.map(lambda x: jnp.zeros((rows,) + jnp.shape(x)[1:], jnp.result_type(x)), positions)
            snapshot, checked = self._prepare_warm_start(stand_in, jax.random.key(PARALLEL_CHECK_SEED), 0,
                                                         model_args, model_kwargs)
        if snapshot is None:
            return positions, rng_key
        rng_key, row_key = jax.random.split(rng_key)
        row = jax.random.randint(row_key, (), 0, rows)
        return jax.tree.map(lambda x: x[row][None], checked), rng_key

    def _check_kernel(self, model_args, model_kwargs):
        """``(kernel, metric name)`` of the warm-start check: BlackJAX's HMC kernel, no metric."""
        return None, ""

    def _init_engine(self, positions, rng_key, model_args, model_kwargs):
        """The engine's initial state: vectorized chains compile it as one program whose arguments include the
        model's (:func:`compiled_data_init`, which builds the engine inside it); sequential chains each build
        their own engine, so op by op, whose small programs the next chain reuses."""
        if not self._vectorized:
            return self._engine(model_args, model_kwargs).init(positions, rng_key)
        # NumPyro's initialize_model found the start with a finite potential and gradient (else it raised):
        # no second check. A given init_params, a potential_fn or a warm start's positions are checked.
        return compiled_data_init(lambda data: self._engine(*data), lambda data: self._logdensity_fn(*data),
                                  (model_args, model_kwargs), positions, rng_key, check=not self._start_checked)

    @staticmethod
    def _build_engine(logdensity_fn, **options):
        return build_engine(logdensity_fn, **options)

    def _extra_fields(self, info, batch, dtype):
        """Per-draw fields a subclass adds to the state (``info`` is None at init)."""
        return {}

    def _discrete_sites(self, rng_key, model_args, model_kwargs):
        """Names of latent sites with a discrete support (best effort: improper priors cannot be traced)."""
        try:
            model_trace = trace(seed(self._model, rng_key)).get_trace(*model_args, **model_kwargs)
        except Exception:  # noqa: BLE001 -- e.g. ImproperUniform cannot be sampled
            return []
        return [
            name for name, site in model_trace.items()
            if site["type"] == "sample" and not site["is_observed"]
            and getattr(site["fn"], "support", None) is not None and site["fn"].support.is_discrete
        ]

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs={}):
        self._num_warmup = int(num_warmup)
        self._vectorized = not is_prng_key(rng_key)
        if self._vectorized:
            keys = jax.vmap(lambda k: jax.random.split(k, 3))(rng_key)
            rng_key, model_key, engine_key = keys[:, 0], keys[:, 1], keys[0, 2]
            first_key = model_key[0]
        else:
            rng_key, model_key, engine_key = jax.random.split(rng_key, 3)
            first_key = model_key
        # NumPyro's initialize_model checks the start it finds; a given one (or a warm start's) is ahmc's to check.
        self._start_checked = self._model is not None and init_params is None and self._warm_start is None
        if self._model is not None:
            try:
                info = initialize_model(model_key, self._model, dynamic_args=True,
                                        init_strategy=self._init_strategy,
                                        model_args=model_args, model_kwargs=model_kwargs)
            except (ImportError, RuntimeError) as error:  # NumPyro cannot enumerate these sites
                discrete = self._discrete_sites(first_key, model_args, model_kwargs)
                if not discrete:
                    raise
                raise ValueError(
                    f"AdaptiveHMC samples continuous latent sites only; the model has discrete latent "
                    f"site(s) {discrete}. Marginalize them out in the model, or install `funsor` so that "
                    "NumPyro enumerates them in the potential (as it does for NUTS; sites with finite support only)."
                ) from error
            self._potential_fn_gen = info.potential_fn
            self._postprocess_fn = info.postprocess_fn
            if init_params is None:
                init_params = info.param_info.z
        elif init_params is None:
            raise ValueError("With `potential_fn`, pass `init_params` to MCMC.run (an unconstrained position).")

        if not jax.tree.leaves(init_params):
            raise ValueError(
                "AdaptiveHMC: the model has no latent sample sites (every sample site is observed), so there is "
                "nothing to sample or tune. Add an unobserved numpyro.sample site, or use numpyro.infer.Predictive "
                "to draw from a model without latent variables." if self._model is not None else
                "AdaptiveHMC: init_params is an empty pytree; give the unconstrained position to start from.")
        positions = init_params if self._vectorized else jax.tree.map(lambda x: jnp.asarray(x)[None], init_params)
        _, self._unravel = ravel_pytree(jax.tree.map(lambda x: x[0], positions))
        positions, engine_key = self._check_warm_start(positions, engine_key, model_args, model_kwargs)
        self._mesh = chain_mesh(positions, type(self).__name__) if self._vectorized else None
        with set_mesh(self._mesh):
            engine_state = self._init_engine(positions, engine_key, model_args, model_kwargs)
        self._sample_fn = self._sample
        batch = engine_state.logdensity.shape
        nan = jnp.full(batch, jnp.nan, engine_state.logdensity.dtype)
        state = self._state_class(
            i=jnp.zeros(batch, jnp.int32), z=positions, potential_energy=-engine_state.logdensity, energy=nan,
            num_steps=jnp.zeros(batch, jnp.int32), accept_prob=nan,
            mean_accept_prob=jnp.zeros(batch, engine_state.logdensity.dtype), diverging=jnp.zeros(batch, bool),
            step_size=nan, max_steps=jnp.zeros(batch, jnp.int32), reward=nan,
            tuning_round=jnp.zeros(batch, jnp.int32), arm_changed=jnp.zeros(batch, bool),
            adapt_probability=jnp.ones(batch, engine_state.logdensity.dtype),
            restarted=jnp.zeros(batch, bool), retried=jnp.zeros(batch, bool), engine=engine_state,
            rng_key=rng_key, **self._extra_fields(None, batch, engine_state.logdensity.dtype),
        )
        return state if self._vectorized else _unbatch(state)

    # -- one iteration -------------------------------------------------------------------------

    def _sample(self, state, model_args, model_kwargs):
        engine = self._engine(model_args, model_kwargs)
        if self._vectorized:
            keys = jax.vmap(jax.random.split)(state.rng_key)
            rng_key, step_key = keys[:, 0], keys[0, 1]
        else:
            rng_key, step_key = jax.random.split(state.rng_key)
        # MCMC drives warm-up and draws through this one function, and compiles it anew on every run: one
        # step with the warm-up masked after it, rather than a branch per phase, compiles in a quarter less
        # time (4.7 -> 3.5 s on eight schools), which at 1000 + 1000 draws is most of the wall time; the
        # masked warm-up costs microseconds per iteration (docs/decisions.md, "NumPyro kernel: one step").
        with traced_mesh_context(self._mesh):  # positions sharded over devices
            engine_state, info = engine.step(step_key, state.engine)
        new = self._state_class(
            i=(state.i + 1) if self._vectorized else (state.i + 1)[None], z=engine_state.position,
            potential_energy=-info.logdensity, energy=info.energy, num_steps=info.num_integration_steps,
            accept_prob=info.acceptance_rate, mean_accept_prob=self._mean_accept_prob(state, info),
            diverging=info.is_divergent, step_size=info.step_size,
            max_steps=info.num_steps, reward=info.reward, tuning_round=info.round, arm_changed=info.arm_changed,
            adapt_probability=info.adapt_probability, restarted=info.restarted, retried=info.retried,
            engine=engine_state,
            rng_key=rng_key,
            **self._extra_fields(info, info.logdensity.shape, info.logdensity.dtype),
        )
        return new if self._vectorized else _unbatch(new)

    def sample(self, state, model_args, model_kwargs):
        return self._sample_fn(state, model_args, model_kwargs)

    def _mean_accept_prob(self, state, info):
        """NumPyro's running mean of the acceptance probability, restarted when the draws begin."""
        i = state.i if self._vectorized else state.i[None]
        count = jnp.where(i < self._num_warmup, i + 1, i + 1 - self._num_warmup).astype(info.acceptance_rate.dtype)
        accept = jnp.nan_to_num(info.acceptance_rate, nan=0.0)
        previous = state.mean_accept_prob if self._vectorized else state.mean_accept_prob[None]
        return previous + (accept - previous) / count


def tuning_snapshot(mcmc):
    """The tuning of a finished ``MCMC(AdaptiveHMC(...))`` run, for the next fit's ``warm_start``.

    Reads ``mcmc.last_state``; with several sequential chains (one tuner each) the GP and mass matrix are
    chain 0's and the positions every chain's.  ``snapshot.save(path)`` keeps it beside the draws."""
    kernel, state = getattr(mcmc, "sampler", None), getattr(mcmc, "last_state", None)
    if type(kernel) not in (AdaptiveHMC, AdaptiveRMHMC):
        raise ValueError("tuning_snapshot needs an MCMC run with AdaptiveHMC or AdaptiveRMHMC.")
    if state is None:
        raise ValueError("tuning_snapshot: the MCMC has not run yet; call mcmc.run(...) first.")
    engine = state.engine
    positions = engine.position
    if mcmc.num_chains > 1 and mcmc.chain_method != "vectorized":  # chains stacked ahead of the engine's axes
        positions = jax.tree.map(lambda x: jnp.reshape(x, (-1,) + jnp.shape(x)[2:]), positions)
        engine = jax.tree.map(lambda x: x[0], engine)
    metric = metric_name(kernel._options["metric"]) if type(kernel) is AdaptiveRMHMC else ""
    options = {name: value for name, value in kernel._options.items() if name != "metric"}
    return engine_snapshot(engine._replace(position=positions), state.step_size, state.max_steps,
                           options=options, source="numpyro", metric=metric)


def _unbatch(state):
    """A single chain: drop the engine's chain axis of size 1 everywhere but in the engine state."""
    fields = {name: jax.tree.map(lambda x: x[0], value) for name, value in state._asdict().items()
              if name not in ("engine", "rng_key", "i")}
    i = state.i[0] if jnp.ndim(state.i) else state.i
    return type(state)(i=i, engine=state.engine, rng_key=state.rng_key, **fields)


class AdaptiveRMHMCState(NamedTuple):
    """State of :class:`AdaptiveRMHMC`: the fields of :class:`AdaptiveHMCState` plus

    fixed_point_converged  every implicit solve of the transition converged (else it was rejected)
    num_gradient_evals     log-density gradients + metric evaluations of the transition
    """

    i: Any
    z: Any
    potential_energy: Any
    energy: Any
    num_steps: Any
    accept_prob: Any
    mean_accept_prob: Any
    diverging: Any
    step_size: Any
    max_steps: Any
    reward: Any
    tuning_round: Any
    arm_changed: Any
    adapt_probability: Any
    restarted: Any
    retried: Any
    engine: EngineState
    rng_key: Any
    fixed_point_converged: Any
    num_gradient_evals: Any


for _state in (AdaptiveHMCState, AdaptiveRMHMCState):  # NumPyro's HMCState names, read from the fields
    _state.adapt_state = property(_adapt_state, doc="NumPyro's ``adapt_state``: :class:`AdaptState`.")
    _state.z_grad = property(_z_grad, doc="Gradient of the potential energy at ``z``.")
    _state.trajectory_length = property(_trajectory_length, doc="``step_size * num_steps``.")


class AdaptiveRMHMC(AdaptiveHMC):
    """Adaptive Riemann-manifold HMC (ARMHMC): GP-UCB tuning of ``(eps, L)`` for RMHMC.

    Same knobs as :class:`AdaptiveHMC` (except ``adapt_mass_matrix`` and
    ``inverse_mass_matrix``: the metric replaces them), plus

    metric
        ``"softabs"`` (default): SoftAbs of the Hessian of the potential
        (Betancourt 2013); ``"diagonal_softabs"``: SoftAbs of the Hessian's diagonal
        (a diagonal metric: cheap, blind to correlations); ``"fisher"``: the model's
        expected Fisher information, built site by site from its distributions
        (:func:`model_fisher_metric`; the paper's logistic-regression metric, the
        funnel's), and ``"diagonal_fisher"`` its diagonal (needs ``model``); a callable ``flat_position -> (d, d)`` metric of the
        flattened unconstrained position (sites in sorted-name order, as
        ``jax.flatten_util.ravel_pytree`` flattens the dict), or ``-> (d,)`` for a
        diagonal metric (elementwise algebra: far cheaper than its matrix); e.g.
        ``fisher_logistic_metric(X)``; or ``constant_metric(G)`` (plain HMC
        with the dense inverse mass matrix ``G^{-1}``, no implicit solver).
    softabs_alpha
        SoftAbs softness, default 1e6 (eigenvalues below ~1/alpha are lifted to 1/alpha).
    max_integration_time
        The automatic box's longest trajectory, ``L <= ceil(max_integration_time / eps*)``:
        default 2 pi with ``fisher_logistic_metric`` (it nearly whitens the posterior), else 4 pi.
    fixed_point_tolerance, max_fixed_point_iterations
        Implicit-midpoint solver: max-abs change of the iterates (default 1e-6
        in float64, 1e-4 in float32) and iteration cap (30).  A solve that does
        not converge rejects the proposal; ``fixed_point_converged`` says so per draw.

    Extra fields: ``fixed_point_converged`` and ``num_gradient_evals``.

    Examples
    --------
    >>> mcmc = MCMC(AdaptiveRMHMC(model), num_warmup=500, num_samples=1000)  # doctest: +SKIP
    """

    _state_class = AdaptiveRMHMCState

    def __init__(self, model=None, potential_fn=None, *, init_strategy: Callable = init_to_uniform,
                 metric: Any = "softabs", softabs_alpha: float = DEFAULT_SOFTABS_ALPHA,
                 fixed_point_tolerance: float | None = None,
                 max_fixed_point_iterations: int = DEFAULT_MAX_FIXED_POINT_ITERATIONS, **options):
        if _is_model_metric(metric) and model is None:
            raise ValueError(f"metric={metric!r} reads the model's sample sites, so it needs `model`; with "
                             "`potential_fn`, pass a metric callable or 'softabs'.")
        super().__init__(model, potential_fn, init_strategy=init_strategy, metric=metric,
                         softabs_alpha=softabs_alpha, fixed_point_tolerance=fixed_point_tolerance,
                         max_fixed_point_iterations=max_fixed_point_iterations, **options)

    @staticmethod
    def _build_engine(logdensity_fn, **options):
        if _is_model_metric(options.get("metric")):  # only when validating the knobs, before the model is known
            options["metric"] = "diagonal_softabs"
        return build_rmhmc_engine(logdensity_fn, **options)

    def _metric(self, model_args, model_kwargs):
        """The metric argument: a model metric ("fisher", "diagonal_fisher") read off the model's sites."""
        metric = self._options.get("metric")
        if not _is_model_metric(metric):
            return metric
        return fisher_from_model(self._model, model_args, model_kwargs, self._unravel,
                                 diagonal=metric == "diagonal_fisher")

    def _engine(self, model_args, model_kwargs):
        if not _is_model_metric(self._options.get("metric")):
            return super()._engine(model_args, model_kwargs)
        fisher = self._metric(model_args, model_kwargs)
        with jax.ensure_compile_time_eval():
            return build_rmhmc_engine(self._logdensity_fn(model_args, model_kwargs), num_warmup=self._num_warmup,
                                      **{**self._run_options, "metric": fisher})

    def _init_engine(self, positions, rng_key, model_args, model_kwargs):
        # Op by op: the metric's checks at the start need concrete values.
        return self._engine(model_args, model_kwargs).init(positions, rng_key)

    def _check_kernel(self, model_args, model_kwargs):
        """The run's RMHMC transition, and its metric's name (the snapshot's must be the same)."""
        return kernel_for(self._metric(model_args, model_kwargs), self._options), metric_name(self._options["metric"])

    @property
    def default_fields(self):
        return super().default_fields + ("fixed_point_converged", "num_gradient_evals")

    def _extra_fields(self, info, batch, dtype):
        if info is None:
            return {"fixed_point_converged": jnp.ones(batch, bool), "num_gradient_evals": jnp.zeros(batch, jnp.int32)}
        return {"fixed_point_converged": info.fixed_point_converged, "num_gradient_evals": info.num_gradient_evals}


# Cross-validated (predictive) adaptation lives in its own module; re-exported here for users.
from .numpyro_predictive import CrossValidation, cross_validate  # noqa: E402,F401
