"""One configuration for every tuning option, with one set of defaults (no framework imported).

:class:`Config` groups the options the way the algorithm uses them: the search box, the Gaussian
process, the schedule of rounds and annealing, the warm-up, and the reward. Every adapter takes it
(``config=``) and takes the same options as flat keyword arguments (``AdaptiveHMC(round_length=20)``),
checked against it before anything compiles: an unknown name fails with the nearest valid one.
Settings of how a framework executes the chains (``pooled``, ``shared_num_steps``, the integrator,
RMHMC's metric) stay adapter arguments.

>>> from ahmc.core import Config
>>> config = Config().replace(round_length=20, dense_mass="auto")
>>> config.schedule.round_length, config.warmup.dense_mass
(20, 'auto')
>>> Config.from_json(config.to_json()) == config
True
>>> Config.paper((0.01, 0.2), (1, 50)).reward.divergence_penalty
0.0

A default of ``None`` is resolved by the route, by a rule stated in the option's text (e.g.
``noise_variance``: 0.1 for tuners that pool chains, 0.5 for the PyMC step's one-chain rounds).
``python -m ahmc.core.config`` prints the reference, ``docs/options.md``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .mass_matrix import resolve_metric_recipe
from .objectives import DEFAULT_DIVERGENCE_PENALTY, OBJECTIVES
from .options import check_option_names, whole_number_pair
from .space import NUM_STEPS_CAP
from .tuner import SCHEDULES as SCHEDULE_NAMES

__all__ = ["Config", "SearchBoxConfig", "GPConfig", "ScheduleConfig", "WarmupConfig", "RewardConfig",
           "options_markdown"]

DEFAULT_DIVERGENCE_RETRY = 8  # docs/decisions.md, "Divergences: a finer retry"
PYMC_STEP_NOISE_VARIANCE = 0.5  # one chain's 10-iteration round (docs/decisions.md)
POOLED_NOISE_VARIANCE = 0.1
JUMP_ESTIMATES = ("trajectory", "transition")


def _option(default, doc: str):
    return field(default=default, metadata={"doc": doc})


def _positive(name: str, value, *, integer: bool = False, allow_none: bool = False, allow_zero: bool = False) -> None:
    if value is None and allow_none:
        return
    ok = (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
          and (value > 0 or (allow_zero and value == 0)))
    if integer:
        ok = ok and int(value) == value
    if not ok:
        kind = "a whole number" if integer else "a finite number"
        raise ValueError(f"{name} must be {kind} {'>=' if allow_zero else '>'} 0{' or None' if allow_none else ''}; "
                         f"got {value!r}.")


def _pair(name: str, value, *, integer: bool = False) -> tuple | None:
    if value is None:
        return None
    try:
        lo, hi = value
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (lower, upper); got {value!r}.") from None
    for v in (lo, hi):
        _positive(name, v, integer=integer)
    if lo > hi:
        raise ValueError(f"{name.removesuffix('_bounds')} bounds are reversed (lower must be <= upper); got {value!r}.")
    return (int(lo), int(hi)) if integer else (float(lo), float(hi))


def _choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}.")


@dataclass(frozen=True)
class SearchBoxConfig:
    """The grid of arms ``(eps, L)`` the GP searches."""

    step_size_bounds: tuple | None = _option(
        None, "Box of step sizes `(lo, hi)`. Default: `eps* x step_size_factors`, `eps*` the dual-averaging step "
              "size at the end of the metric phase. Needs `num_steps_bounds` too.")
    num_steps_bounds: tuple | None = _option(
        None, "Range of `L` `(lo, hi)`. Default: `1..ceil(max_integration_time / eps*)`, capped at "
              "`num_steps_cap`. Alone, it keeps the automatic step sizes (e.g. `(2, 16)` rules out single steps).")
    step_size_factors: tuple = _option((0.5, 2.0), "The automatic step-size box, as multiples of `eps*`.")
    max_integration_time: float = _option(
        4 * math.pi, "Longest trajectory of the automatic box, `eps* x L`, in the mass matrix's whitened units "
                     "(RMHMC with `fisher_logistic_metric`: `2 pi`).")
    num_steps_cap: int = _option(NUM_STEPS_CAP, "Largest `L` of the automatic box (NUTS's default tree depth).")
    num_step_sizes: int = _option(100, "Step sizes on the grid.")
    num_num_steps: int = _option(32, "Values of `L` on the automatic box's grid (every integer of a given box).")
    log_step_size: bool = _option(True, "Log-spaced step sizes (`False`: linear, the paper's).")
    log_num_steps: bool = _option(
        True, "The automatic box's `num_num_steps` values of `L`, log-spaced from 1 to its top (`False`: "
              "evenly spaced). A given `num_steps_bounds` has every integer.")
    min_steps_fraction: float = _option(
        0.0, "Each iteration draws its leapfrog steps from `{max(1, ceil(f L))..L}`; 0 is the paper's `{1..L}`. "
             "0.5 helps means and hurts variances.")

    def __post_init__(self):
        object.__setattr__(self, "step_size_bounds", _pair("step_size_bounds", self.step_size_bounds))
        if self.num_steps_bounds is not None:
            whole_number_pair("num_steps_bounds", self.num_steps_bounds)  # its message names whole leapfrog steps
        object.__setattr__(self, "num_steps_bounds", _pair("num_steps_bounds", self.num_steps_bounds, integer=True))
        object.__setattr__(self, "step_size_factors", _pair("step_size_factors", self.step_size_factors))
        if self.step_size_bounds is not None and self.num_steps_bounds is None:
            raise ValueError("step_size_bounds needs num_steps_bounds=(lo, hi) too: the automatic L range is set "
                             "from the warm-up's step size, which a step-size box replaces.")
        _positive("max_integration_time", self.max_integration_time)
        for name in ("num_steps_cap", "num_step_sizes", "num_num_steps"):
            _positive(name, getattr(self, name), integer=True)
        if not (isinstance(self.min_steps_fraction, numbers.Real) and 0.0 <= self.min_steps_fraction <= 1.0):
            raise ValueError(f"min_steps_fraction must be a number in [0, 1]; got {self.min_steps_fraction!r}.")


@dataclass(frozen=True)
class GPConfig:
    """The Gaussian process over the grid and its upper confidence bound."""

    capacity: int = _option(64, "Distinct arms the GP keeps (the least visited is forgotten exactly); an update "
                                "costs O(capacity^3).")
    lengthscale: float = _option(0.2, "Squared-exponential length scale, as a fraction of the box per coordinate.")
    noise_variance: float | None = _option(
        None, f"Observation noise relative to the unit prior variance. `None`: {POOLED_NOISE_VARIANCE} for tuners "
              f"that pool chains (JAX routes, RMHMC), {PYMC_STEP_NOISE_VARIANCE} for the PyMC step's one-chain rounds.")
    alpha: float = _option(8.0, "Scale of the mean, `s = alpha / |best reward|` (the paper's: 4; 8 explores less "
                                "and measured 1.16x strict ESS per gradient, docs/decisions.md).")
    delta: float = _option(0.1, "Confidence of GP-UCB's `beta_i = 2 log(i^(d/2+2) pi^2 / (3 delta))`.")
    initial_design: int = _option(
        3, "The first GP rounds' arms spread over the box's `L` at the first arm's step size, before the UCB "
           "chooses (an initial design, as Bayesian optimisation starts): with `alpha=8` the UCB explores only "
           "near its best arm, and a run could settle on short trajectories that never meet the posterior's "
           "long directions. 0: the UCB from the first round, the paper's (docs/decisions.md, \"An initial "
           "design for the GP: the default\").")

    def __post_init__(self):
        _positive("capacity", self.capacity, integer=True)
        _positive("initial_design", self.initial_design, integer=True, allow_zero=True)
        for name in ("lengthscale", "alpha"):
            _positive(name, getattr(self, name))
        _positive("noise_variance", self.noise_variance, allow_none=True)
        if not (isinstance(self.delta, numbers.Real) and 0.0 < self.delta < 1.0):
            raise ValueError(f"delta must be in (0, 1); got {self.delta!r}.")

    def resolved_noise_variance(self, one_chain_rounds: bool) -> float:
        """``noise_variance``, or its route's default when it is None."""
        if self.noise_variance is not None:
            return float(self.noise_variance)
        return PYMC_STEP_NOISE_VARIANCE if one_chain_rounds else POOLED_NOISE_VARIANCE


@dataclass(frozen=True)
class ScheduleConfig:
    """Rounds, and the annealed probability of moving the arm."""

    round_length: int = _option(10, "Iterations per GP round (the paper's `m`).")
    schedule: str = _option("inverse_sqrt", "`p_i = max(i - k + 1, 1)^(-1/2)` (the paper's), or "
                                            "`\"exponential\"`: `exp(-decay (i - 1))` (the thesis's).")
    k: int | None = _option(None, "Rounds before `p_i` starts to fall. `None`: the GP rounds of warm-up, so "
                                  "`p_i = 1` in warm-up (`paper_preset`: 100).")
    decay: float = _option(0.01, "`lambda` of the exponential schedule.")
    freeze_after: int | str | None = _option(
        None, "The arm stops moving from this round on; `\"warmup\"` (PyMC: `\"tune\"`) after warm-up. `None`: "
              "adapt forever with a vanishing probability (valid: the paper's section 4).")
    exploit_after_warmup: bool = _option(True, "At the end of warm-up, jump to the best arm of the GP mean.")

    def __post_init__(self):
        _positive("round_length", self.round_length, integer=True)
        _choice("schedule", self.schedule, SCHEDULE_NAMES)
        _positive("k", self.k, integer=True, allow_none=True)
        _positive("decay", self.decay)
        if not (self.freeze_after is None or self.freeze_after in ("warmup", "tune")
                or (isinstance(self.freeze_after, numbers.Integral) and not isinstance(self.freeze_after, bool)
                    and self.freeze_after >= 0)):
            raise ValueError(f"freeze_after must be None, 'warmup' or a round number >= 0; got {self.freeze_after!r}.")


@dataclass(frozen=True)
class WarmupConfig:
    """The metric phase before the GP rounds: mass matrix, step size, lost chains."""

    metric_fraction: float | None = _option(
        None, "Share of warm-up spent estimating the mass matrix and `eps*`. `None`: 0.5 (the PyMC step with a "
              "dense matrix: 0.9, one chain's estimate needs more draws; a given box and metric: 0).")
    adapt_mass_matrix: bool = _option(True, "Estimate the inverse mass matrix in Stan's windows (`False`: identity "
                                            "or the one given).")
    dense_mass: bool | str = _option(False, "`True`: a dense mass matrix; `\"auto\"`: dense where the warm-up's "
                                            "correlations stand out from their noise, diagonal above d = 200.")
    metric_recipe: str | None = _option(
        None, "The mass-matrix estimator, by its name in BlackJAX's `metric_recipes`: `\"welford_diag\"` (Stan's), "
              "`\"welford_dense\"`, `\"fisher_diag\"` or `\"fisher_low_rank\"` (nutpie's, from draws and "
              "gradients; carried as a dense matrix; the JAX routes end with a diagonal of the last window's "
              "draws' variances, at least the estimate's, when they spread past 2.5x a Fisher estimate). "
              "`None`: `\"fisher_low_rank\"` up to d = 200 and "
              "`\"welford_diag\"` above (JAX routes; the PyMC step: Welford, and it takes `\"fisher_diag\"` but "
              "not the low-rank one), or Welford as `dense_mass` says when it is given.")
    target_acceptance_rate: float = _option(0.8, "Dual averaging's target in the metric phase.")
    initial_step_size: float | None = _option(None, "Where the warm-up's first step size comes from. JAX routes: "
                                                    "the start of a doubling/halving search, run by the warm-up's "
                                                    "first iterations with one leapfrog step each, whose result "
                                                    "starts dual averaging; `None`: 1.0. PyMC step: dual "
                                                    "averaging's first step size; `None`: `step_scale / d^(1/4)`.")
    warmup_integration_time: float = _option(1.0, "Trajectory length `eps x L` of the metric phase.")
    restart_lost_chains: bool = _option(True, "With 3 or more pooled chains, restart a chain lost far below the "
                                              "others from another chain's position (JAX routes).")
    warm_start_weight: float = _option(
        0.1, "With `warm_start=`: each of the snapshot's GP arms enters with at most this weight (one chain's "
             "round weighs 1), so the new posterior's rounds soon outweigh the earlier one's evidence "
             "(docs/decisions.md, \"Warm start: the weight of old rewards\").")

    def __post_init__(self):
        if self.metric_fraction is not None and not (isinstance(self.metric_fraction, numbers.Real)
                                                     and 0.0 <= self.metric_fraction < 1.0):
            raise ValueError(f"metric_fraction must be in [0, 1) or None; got {self.metric_fraction!r}.")
        if self.dense_mass not in (False, True, "auto") or (isinstance(self.dense_mass, str) and self.dense_mass != "auto"):
            raise ValueError(f"dense_mass must be True, False or 'auto' (one matrix over all parameters); got "
                             f"{self.dense_mass!r}.")
        resolve_metric_recipe(self.metric_recipe, self.dense_mass)
        if not (isinstance(self.target_acceptance_rate, numbers.Real) and 0 < self.target_acceptance_rate < 1):
            raise ValueError(f"target_acceptance_rate must be in (0, 1); got {self.target_acceptance_rate!r}.")
        _positive("initial_step_size", self.initial_step_size, allow_none=True)
        _positive("warmup_integration_time", self.warmup_integration_time)
        _positive("warm_start_weight", self.warm_start_weight)


@dataclass(frozen=True)
class RewardConfig:
    """How a round is scored, and what a divergence costs."""

    objective: str | Callable | None = _option(
        None, "`None`: `\"normalized_ess\"` with an adapted mass matrix and pooled rounds (JAX routes, "
              "`PooledAdaptiveHMC`), else `\"normalized_esjd\"` (RMHMC, a fixed metric, the PyMC step). "
              "`\"normalized_ess\"`: the round's strict ESS per draw (the worse of the means' and the squares', "
              "from their lag-1 jumps) over `sqrt(steps per draw)`; `\"normalized_esjd\"` (the paper's: mean "
              "squared whitened jump over `sqrt(L)`), `\"esjd\"`, `\"esjd_per_gradient\"`, `\"esjd_moments\"`, "
              "or a callable `(RoundStats, max_num_steps) -> reward`.")
    divergence_penalty: float = _option(DEFAULT_DIVERGENCE_PENALTY, "The reward times `exp(-penalty x divergent fraction)`; 0 is the "
                                              "paper's.")
    jump_estimate: str | None = _option(
        None, "`\"trajectory\"`: each round's jump estimated from every leapfrog step; `\"transition\"`: the jumps "
              "made (the paper's). `None`: trajectory, except RMHMC (transition).")
    divergence_retry: int | None = _option(
        DEFAULT_DIVERGENCE_RETRY,
        "After the metric phase, a divergent transition retries once from the same momentum with `eps / "
        "divergence_retry` for as many times the steps (delayed rejection, exact; costs nothing without "
        "divergences). `None`: off, the paper's. (docs/decisions.md, \"Divergences: a finer retry\").")

    def __post_init__(self):
        if isinstance(self.objective, str):
            _choice("objective", self.objective, tuple(OBJECTIVES))
        elif self.objective is not None and not callable(self.objective):
            raise ValueError(f"objective must be a name or a callable; got {self.objective!r}.")
        if not (isinstance(self.divergence_penalty, numbers.Real) and math.isfinite(self.divergence_penalty)
                and self.divergence_penalty >= 0):
            raise ValueError(f"divergence_penalty must be a finite number >= 0; got {self.divergence_penalty!r}.")
        retry = self.divergence_retry
        if retry is not None and not (isinstance(retry, numbers.Integral) and not isinstance(retry, bool) and retry >= 2):
            raise ValueError(f"divergence_retry must be a whole number >= 2 (the retry's step-size divisor) or "
                             f"None (off); got {retry!r}.")
        if self.jump_estimate not in (None, *JUMP_ESTIMATES):
            raise ValueError(f"jump_estimate must be 'trajectory' (every leapfrog step) or 'transition' (the jumps "
                             f"made, the paper's); got {self.jump_estimate!r}.")


GROUPS = {"box": SearchBoxConfig, "gp": GPConfig, "schedule": ScheduleConfig, "warmup": WarmupConfig,
          "reward": RewardConfig}
GROUP_TITLES = {"box": "Search box", "gp": "Gaussian process", "schedule": "Schedule", "warmup": "Warm-up",
                "reward": "Reward"}
PAPER_SETTINGS = {"objective": "normalized_esjd", "adapt_mass_matrix": False, "k": 100, "log_step_size": False,
                  "divergence_penalty": 0.0, "min_steps_fraction": 0.0, "jump_estimate": "transition",
                  "divergence_retry": None, "alpha": 4.0, "initial_design": 0}


def _group_of() -> dict[str, str]:
    return {f.name: group for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}


@dataclass(frozen=True)
class Config:
    """Every tuning option, grouped; frozen and validated. See the module docstring."""

    box: SearchBoxConfig = field(default_factory=SearchBoxConfig)
    gp: GPConfig = field(default_factory=GPConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)

    @staticmethod
    def option_names() -> tuple[str, ...]:
        return tuple(_group_of())

    def options(self) -> dict[str, Any]:
        """Every option by its flat name."""
        return {name: getattr(getattr(self, group), name) for name, group in _group_of().items()}

    def changed(self) -> dict[str, Any]:
        """The options that differ from the defaults."""
        default = Config().options()
        return {name: value for name, value in self.options().items() if value != default[name]}

    def replace(self, **options) -> "Config":
        """A copy with these flat options changed (unknown names fail with the nearest valid one)."""
        check_option_names(options, self.option_names(), "Config")
        groups = _group_of()
        updates: dict[str, dict] = {}
        for name, value in options.items():
            updates.setdefault(groups[name], {})[name] = value
        return dataclasses.replace(self, **{g: dataclasses.replace(getattr(self, g), **u) for g, u in updates.items()})

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, base: "Config | None" = None,
                     owner: str = "Config") -> "Config":
        """``base`` (default: the defaults) with the flat ``options``; unknown names name ``owner``."""
        check_option_names(options, cls.option_names(), owner)
        return (base or cls()).replace(**dict(options))

    @classmethod
    def paper(cls, step_size_bounds, num_steps_bounds) -> "Config":
        """Algorithm 2 as published: your box on a linear grid, identity metric, the GP from the first round,
        ``k = 100``, the jumps made, no divergence penalty."""
        return cls().replace(step_size_bounds=step_size_bounds, num_steps_bounds=num_steps_bounds, **PAPER_SETTINGS)

    def to_json(self) -> str:
        """JSON text; ``Config.from_json`` rebuilds the same config (a callable objective cannot be stored)."""
        if callable(self.reward.objective):
            raise ValueError("a Config with a callable objective cannot be stored as JSON; store its name and "
                             "pass the callable again when rebuilding.")
        return json.dumps({group: dataclasses.asdict(getattr(self, group)) for group in GROUPS}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes | Mapping) -> "Config":
        data = json.loads(text) if isinstance(text, (str, bytes)) else dict(text)
        unknown = set(data) - set(GROUPS)
        if unknown:
            raise ValueError(f"Config.from_json: unknown groups {sorted(unknown)}; expected {sorted(GROUPS)}.")
        flat = {name: value for group in data.values() for name, value in group.items()}
        return cls.from_options(flat, owner="Config.from_json")


def as_config(value) -> "Config | None":
    """A Config from a Config, a dict of flat options or groups, or JSON text; None stays None."""
    if value is None or isinstance(value, Config):
        return value
    if isinstance(value, (str, bytes)):
        return Config.from_json(value)
    if isinstance(value, Mapping):
        return Config.from_json(value) if set(value) <= set(GROUPS) else Config.from_options(value)
    raise ValueError(f"config must be an ahmc.core.Config, a dict or JSON text; got {type(value).__name__}.")


def resolve_options(options: Mapping[str, Any], owner: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split an adapter's keyword arguments into ``(tuning, execution)`` options.

    ``config=`` (a :class:`Config`) and ``paper_preset=True`` are folded in; the tuning options a
    user set (flat, from the config, or from the preset) are validated together by :class:`Config`
    and returned by name, so that each route keeps its own resolution of the rest. Every other
    name is an execution option, left for the adapter to check.
    """
    options = dict(options)
    config = as_config(options.pop("config", None))
    paper = options.pop("paper_preset", False)
    if not isinstance(paper, bool):
        raise ValueError(f"{owner}: paper_preset must be True or False; got {paper!r}.")
    names = set(Config.option_names())
    tuning = {name: value for name, value in options.items() if name in names}
    execution = {name: value for name, value in options.items() if name not in names}
    given = config.changed() if config is not None else {}
    if paper:
        box = {**given, **tuning}
        if box.get("step_size_bounds") is None or box.get("num_steps_bounds") is None:
            raise ValueError(f"{owner}: paper_preset=True needs step_size_bounds=(lo, hi) and "
                             "num_steps_bounds=(lo, hi): the paper searches a box you give.")
        given = {**PAPER_SETTINGS, **given}
    merged = {**given, **tuning}
    checked = Config.from_options(merged, owner=owner).options()
    return {name: checked[name] for name in merged}, execution


def options_markdown() -> str:
    """The option reference, ``docs/options.md`` (a test keeps the file equal to this)."""
    lines = ["# Options", "",
             "Generated from `ahmc.core.Config` by `./dev run python -m ahmc.core.config > docs/options.md`; "
             "do not edit by hand.", "",
             "Every route takes these as keyword arguments with these defaults (`AdaptiveHMC(round_length=20)`), "
             "or as one object, `config=Config(...)` / `Config().replace(...)`; `Config.paper(step_size_bounds, "
             "num_steps_bounds)` is the paper's Algorithm 2 (`paper_preset=True` in the adapters). An unknown name "
             "fails before anything compiles. How the chains run (`pooled`, `shared_num_steps`, the integrator, "
             "RMHMC's `metric`) is set per adapter: see the guides.", ""]
    for group, cls in GROUPS.items():
        lines += [f"## {GROUP_TITLES[group]} (`config.{group}`)", "", cls.__doc__.strip(), "",
                  "| option | default | meaning |", "|---|---|---|"]
        for f in dataclasses.fields(cls):
            default = f.default
            shown = f"`{default!r}`" if not (isinstance(default, float) and default == 4 * math.pi) else "`4 pi`"
            lines.append(f"| `{f.name}` | {shown} | {f.metadata['doc']} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(options_markdown(), end="")
