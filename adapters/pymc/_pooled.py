"""``PooledAdaptiveHMC``: one tuner for all chains, a population step method that PyMC steps in lockstep."""

from __future__ import annotations

import copy
import logging
import pickle
import warnings
import weakref

import numpy as np
from pymc.step_methods.arraystep import PopulationArrayStepShared
from pymc.progress_bar.rich_progress import CustomProgress
from pymc.sampling import population
from pymc.step_methods.step_sizes import DualAverageAdaptation
from rich.progress import ProgressColumn
from rich.text import Text

from ahmc.core.snapshot import check_fit

from ._step import AdaptiveHMC, _LeapfrogReusingStart, _samples_every_variable, _WarmupDiagAdapt


class _ChainPool:
    """What the chains of a pooled run share: the tuner state, the warm-up's step sizes, the round's rewards."""

    def __init__(self):
        self.reset(0, None)

    def reset(self, num_chains, rng):
        self.num_chains, self.rng = num_chains, rng  # rng: the uniforms of the tuner's adapt decisions
        self.tuner_state = self.search_box = None
        self.eps_star = {}  # chain -> its dual-averaged step size at the end of the metric phase
        self.round_rewards, self.round_stats = [], []  # this round's, in chain order
        self.progress = {}  # the progress bar's columns: divergences per chain, the shared arm
        self.checks, self.check_report = [], None  # warm_start: the chains' checks, then their pooled verdict


#: The pool of the pooled run about to sample: linked by chain 0, taken by the next progress bar.
_LIVE_POOL: list = [None]


class _PoolColumn(ProgressColumn):
    """A progress-bar column read off the running pooled step: PyMC's population sampler draws a bare bar
    (description, bar, time) and passes no stats to it."""

    def __init__(self, pool, text):
        super().__init__()
        self.pool, self.text = pool, text

    def render(self, task):
        return Text(self.text(self.pool.progress) if self.pool.progress else "")


def _population_progress(*args, **kwargs):
    """PyMC's population progress bar, with NUTS's columns (divergences, step size) and the arm's ``L`` while
    a pooled ahmc step samples."""
    pool, _LIVE_POOL[0] = _LIVE_POOL[0], None
    if pool is None:
        return CustomProgress(*args, **kwargs)
    columns = (*CustomProgress.get_default_columns(),
               _PoolColumn(pool, lambda p: f"divergences {sum(p['divergences'].values())}"),
               _PoolColumn(pool, lambda p: f"step size {p['step_size']:.3f}"),
               _PoolColumn(pool, lambda p: f"L {p['max_steps']}"))
    return CustomProgress(*columns, *args, **kwargs)


class _SharedDualAverage(DualAverageAdaptation):
    """PyMC's dual averaging of the step size, shared by lockstep chains: one update per iteration,
    with the chains' mean acceptance (the JAX engine's pooled dual averaging)."""

    num_chains = 1

    def reset(self):
        super().reset()
        self._pending = []

    def update(self, accept_stat, tune):
        if not tune:
            return super().update(accept_stat, tune)
        self._pending.append(accept_stat)
        if len(self._pending) >= self.num_chains:
            mean, self._pending = float(np.mean(self._pending)), []
            super().update(mean, tune)


class _SharedDiagAdapt(_WarmupDiagAdapt):
    """PyMC's diagonal mass-matrix adaptation shared by lockstep chains: every chain's draw enters the
    variance estimate, and the windows advance once per iteration (the JAX engine's pooled Welford)."""

    num_chains = 1

    def reset(self):
        super().reset()
        self._calls = 0

    def update(self, sample, grad, tune):
        self.metric_moved = False
        if not (tune and self.is_adapting):
            return
        self._calls += 1
        if self._calls % self.num_chains == 0:  # the iteration's last chain: PyMC's update moves the windows on
            return super().update(sample, grad, tune)
        if self._n_samples > self._discard_window:  # the others only add their draws, as that update does
            self._foreground_var.add_sample(sample)
            self._background_var.add_sample(sample)
            self._add_to_windows(sample, grad)


POOLED_CORES_MESSAGE = ("PooledAdaptiveHMC steps the chains together in one process with one shared tuner, so "
                        "cores does not apply; pooled=False gives each chain its own tuner, in parallel processes.")


_POOLED_STEPS: "weakref.WeakSet" = weakref.WeakSet()  # live PooledAdaptiveHMC steps


class _PooledCoresAdvice(logging.Filter):
    """PyMC's population sampler advises ``cores=n`` for chains stepped in one process; pooled chains must
    stay in one process, so while a pooled step exists that advice is replaced by what is true for it."""

    def filter(self, record):
        if _POOLED_STEPS and str(record.msg).startswith("Chains are not parallelized"):
            record.msg, record.args = POOLED_CORES_MESSAGE, ()
        return True


class _PooledChains:
    """``PooledAdaptiveHMC``: one tuner, one step-size adaptation and one diagonal mass matrix
    for all chains.

    PyMC steps the chains of a population step method in lockstep (iteration ``t`` of every chain,
    then ``t + 1``), from shallow copies of the step, which therefore share ``self._pool``.  The
    last chain to finish a round gives the chains' mean reward to the tuner; the other chains'
    stats of that iteration are still PyMC's to record (it records after stepping every chain),
    so they get the pooled reward too and the DataTree reads as one pooled tuner.  In warm-up the
    chains share the dual averaging (mean acceptance) and the diagonal mass-matrix estimate (every
    chain's draws), as the JAX engine pools them; a dense mass matrix (``dense_mass``) stays per chain.
    Integrator and leapfrog-count draws are per chain; momenta come from the shared metric's generator.
    """

    def __init__(self, *args, **kwargs):
        self._pool = _ChainPool()
        super().__init__(*args, **kwargs)
        _POOLED_STEPS.add(self)
        if not _samples_every_variable(self):
            # PyMC steps a population step's chains from shallow copies of every step of the compound, so a
            # partner step (Metropolis, ...) would share its tuning state between the chains and stop moving.
            others = sorted(v.name for v in getattr(self._logp_dlogp_func, "_extra_vars", []))
            raise ValueError(
                f"PooledAdaptiveHMC must sample every free variable of the model, but its log density "
                f"also reads {others}, which another step would sample. PyMC would then share that step's tuning "
                f"between the chains, and it stops moving. In a compound step use AdaptiveHMC(pooled=False) (the "
                f"default), or give PooledAdaptiveHMC every variable.")
        adapt = self.step_adapt
        shared_adapt = _SharedDualAverage(float(adapt._initial_step), adapt._target, adapt._gamma, adapt._k,
                                          adapt._t0)
        potential = self.potential
        if type(potential) is _WarmupDiagAdapt:
            potential = _SharedDiagAdapt(potential._n, np.zeros(potential._n), np.ones(potential._n), 10,
                                         rng=potential.rng, fisher=potential.fisher)
            self._shared_potential = True
        else:  # dense adaptation or a fixed metric: one copy per chain
            self._shared_potential = False
        self._pristine = (potential, shared_adapt)

    def __copy__(self):
        copied = object.__new__(type(self))
        copied.__dict__.update(self.__dict__)
        return copied

    def __getstate__(self):
        if self.population is not None:
            # PyMC's population sampling with cores > 1 pickles each chain's step into its own process,
            # where the chains could no longer share the tuner; refusing makes PyMC step them in this one.
            warnings.warn("PooledAdaptiveHMC shares one tuner between the chains, so PyMC steps them in "
                          "one process: cores > 1 does not parallelize them (pooled=False does).",
                          UserWarning, stacklevel=2)
            raise pickle.PicklingError("PooledAdaptiveHMC steps its chains in one process")
        return self.__dict__

    def setup_chain(self, rng, tune, draws):
        # The copies share every attribute: the pooled adaptations stay shared, the rest is this chain's own.
        potential, self.step_adapt = self._pristine
        self.potential = potential if self._shared_potential else copy.deepcopy(potential)
        self.integrator = _LeapfrogReusingStart(self.potential, self._logp_dlogp_func, _samples_every_variable(self))
        super().setup_chain(rng, tune, draws)

    def link_population(self, population, chain_index):
        # PopulationArrayStepShared's own check asks for 3 chains (DEMetropolis's need); any number works here.
        self.population, self.this_chain = population, chain_index
        self.other_chains = [c for c in range(len(population)) if c != chain_index]
        if chain_index == 0:  # a new run: chain 0 is linked first
            self._pool.reset(len(population), self.rng.spawn(1)[0])
            _LIVE_POOL[0] = self._pool
        self.step_adapt.num_chains = len(population)
        if self._shared_potential:
            self.potential.num_chains = len(population)

    @property
    def _tuner_state(self):
        return self._pool.tuner_state

    @_tuner_state.setter
    def _tuner_state(self, value):
        self._pool.tuner_state = value

    def _eps_star(self):
        steps = list(self._pool.eps_star.values())
        return float(np.exp(np.mean(np.log(steps)))) if steps else super()._eps_star()

    def _start_rounds(self):
        pool = self._pool
        if pool.search_box is None:  # the first chain to get here sets up the shared tuner
            super()._start_rounds()
            pool.search_box = self._search_box
        else:
            self._search_box = pool.search_box
            self._begin_rounds()

    def _end_check(self):
        """warm_start, pooled: one verdict from every chain's check (the chains share the mass matrix, the
        step size and the tuner), given when the last chain ends its check; each chain applies it at its
        next iteration, which in lockstep comes after every chain's check."""
        if self.population is None:
            return super()._end_check()
        check, self._check = self._check, None
        pool = self._pool
        pool.checks.append(check)
        self._verdict_pending, self._check_tune = True, check["tune"]
        if len(pool.checks) == pool.num_chains:
            draws = np.stack([np.asarray(c["draws"]) for c in pool.checks])
            accept = float(np.nanmean([a for c in pool.checks for a in c["accept"]]))
            pool.check_report, pool.checks = check_fit(self._snapshot, draws, accept), []

    def _take_verdict(self, q0):
        """This chain's side of the pooled verdict; the first chain also restarts the shared adaptation."""
        self._verdict_pending = False
        first = self.this_chain == 0
        self._apply_verdict(self._pool.check_report, self._check_tune, q0.data,
                            restart_potential=first or not self._shared_potential, restart_step_size=first,
                            warn=first)

    def astep(self, q0):
        if getattr(self, "_verdict_pending", False):
            self._take_verdict(q0)
        result = super().astep(q0)
        if self.population is not None:
            if self._chain_iteration == self._num_warmup:  # the metric phase ended
                self._pool.eps_star[self.this_chain] = float(self.step_adapt.current(False))
            stats = result[1][0]
            progress = self._pool.progress.setdefault("divergences", {})
            progress[self.this_chain] = int(stats["divergences"])
            self._pool.progress.update(step_size=float(stats["step_size"]), max_steps=int(stats["max_steps"]))
        return result

    def _end_round(self, reward, stats):
        if self.population is None:  # stepped on its own, outside PyMC's population sampling: one chain
            return super()._end_round(reward, stats)
        pool = self._pool
        pool.round_rewards.append(reward)
        pool.round_stats.append(stats)
        if len(pool.round_rewards) < pool.num_chains:
            return
        mean = float(np.mean(pool.round_rewards))
        scored = self._score(mean, pool.rng.uniform(), weight=float(pool.num_chains))
        for chain_stats in pool.round_stats:
            chain_stats.update(scored)
        pool.round_rewards, pool.round_stats = [], []


class PooledAdaptiveHMC(_PooledChains, AdaptiveHMC, PopulationArrayStepShared):
    """:class:`AdaptiveHMC` with one tuner for all chains: ``pm.sample(step=PooledAdaptiveHMC())``.

    Takes every option of :class:`AdaptiveHMC`.  A population step method: PyMC steps its chains in
    lockstep in one process (``cores`` does not apply)."""

    pooled_step = True

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("pooled", True)
        super().__init__(*args, **kwargs)


logging.getLogger("pymc.sampling.population").addFilter(_PooledCoresAdvice())
# PyMC's population sampler builds its bar from this name; the factory adds the columns only while a
# pooled ahmc run samples (DEMetropolis and other population steps keep PyMC's bar).
population.CustomProgress = _population_progress
