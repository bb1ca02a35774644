"""What the tuner did, rebuilt from per-draw sample stats alone (NumPy only).

Every adapter records, per draw, the arm it ran (``step_size`` and ``L``), the
round's reward at the round's last iteration (NaN elsewhere), the 1-based GP
round (0 before the GP starts), whether the arm changed, and ``p_i``.  From
those arrays :func:`tuning_history` builds a per-round table, the distinct
arms with their share of iterations, and the chosen (final) arm;
:func:`rebuild_surrogate` replays the rounds into a fresh core tuner, with the
arms forced to the recorded ones, and returns its GP surrogate on the grid;
:func:`tuning_summary` writes a text report with a warning when tuning
probably failed.  Plots live in :mod:`ahmc.adapters.plots`.

Replaying needs what the stats do not hold: the search box, the grid and the
GP settings, a :class:`TuningConfig` (adapters store it as JSON in the
DataTree attribute ``ahmc_config``).  It is exact: same rewards, same weights
and same arms in the same order give the tuner's own buffer, and so its GP.
When the grid has more ``L`` points than the box has integers (the automatic
box), two grid arms may run the same ``L``; a per-draw ``arm`` stat (the flat
grid index) resolves that, else the replay picks, among the matching grid
arms, the one the tuner itself would have chosen.

>>> import numpy as np
>>> stats = {"step_size": np.full(20, 0.1), "max_steps": np.full(20, 8), "tuning_round": np.repeat([1, 2], 10),
...          "reward": np.where(np.arange(20) % 10 == 9, 0.5, np.nan)}
>>> history = tuning_history(stats)
>>> history.rounds.round.tolist(), history.rounds.reward.tolist()
([1, 2], [0.5, 0.5])
"""

from __future__ import annotations

import inspect
import json
from typing import Mapping, NamedTuple

import numpy as np

from .space import SearchSpace, search_space, unit_of_num_steps
from .tuner import SCHEDULES, Surrogate, gp_ucb

__all__ = [
    "TuningConfig",
    "RoundTable",
    "ArmTable",
    "IterationTrace",
    "TuningHistory",
    "tuning_history",
    "replay",
    "rebuild_surrogate",
    "arm_parameters",
    "tuning_warnings",
    "tuning_summary",
    "strongest_correlation",
    "varying_coordinates",
    "variance_hint",
    "few_draws_hint",
    "single_step_hint",
    "dense_mass_hint",
    "DENSE_HINT_CORRELATION",
]

# Canonical field -> accepted stat names, in order of preference.  ``num_steps`` is the arm's
# ``L`` and ``num_integration_steps`` the steps taken; they are resolved by ``_names``.
ALIASES = {
    "step_size": ("step_size",),
    "acceptance": ("acceptance_rate", "accept_prob", "accept"),
    "divergent": ("is_divergent", "diverging"),
    "retried": ("retried",),
    "reward": ("reward",),
    "round": ("round", "tuning_round"),
    "arm_changed": ("arm_changed",),
    "adapt_probability": ("adapt_probability",),
    "is_warmup": ("is_warmup", "tune", "warmup"),
    "arm": ("arm", "tuner_arm"),
}
_CORE_DEFAULTS = {name: parameter.default for function in (search_space, gp_ucb)
                  for name, parameter in inspect.signature(function).parameters.items()}
LOW_ACCEPTANCE, HIGH_ACCEPTANCE, MAX_DIVERGENT, MIN_WARMUP_ROUNDS = 0.3, 0.99, 0.01, 10
#: :func:`tuning_warnings` flags a run whose slowest coordinate's bulk ESS is below this share of the draws.
MIN_ESS_FRACTION = 0.01
#: R-hat above which :func:`tuning_warnings` says the chains have not mixed (Vehtari et al. 2021's threshold,
#: ArviZ's and PyMC's).
MAX_RHAT = 1.01


class TuningConfig(NamedTuple):
    """Search box, grid and GP settings: what a replay needs beyond the stats.

    ``step_size`` and ``num_steps`` are the absolute box ``(lo, hi)`` the GP
    rounds used, or one pair per tuner (e.g. independent chains with automatic
    boxes).  The grid has ``num_step_sizes`` step sizes (log-spaced if
    ``log_step_size``) and ``num_num_steps`` values of ``L``, ``L = round(lo +
    u (hi - lo))`` on ``u`` in ``linspace(0, 1, num_num_steps)``, or ``round(lo (hi /
    lo) ** u)`` if ``log_num_steps`` (:func:`~ahmc.core.space.grid_num_steps`); ``None`` means
    every integer of the box.  ``initial_arm`` is the flat grid index of the
    first arm; ``k=None`` is inferred from the recorded ``p_i``; ``pooled=None``
    from whether the chains share their arms.  Defaults are those of
    :func:`~ahmc.core.search_space` and :func:`~ahmc.core.gp_ucb`
    (``ahmc.adapters.diagnostics.config_from_engine`` gives the JAX engine's).
    """

    step_size: tuple | None = None
    num_steps: tuple | None = None
    num_step_sizes: int = _CORE_DEFAULTS["num_step_sizes"]
    num_num_steps: int | None = None
    log_step_size: bool = _CORE_DEFAULTS["log_step_size"]
    log_num_steps: bool = False  # runs recorded before 2026-12-06 spaced L evenly (their JSON lacks the key)
    initial_arm: int | None = None
    capacity: int = _CORE_DEFAULTS["capacity"]
    lengthscale: float = _CORE_DEFAULTS["lengthscale"]
    noise_variance: float = _CORE_DEFAULTS["noise_variance"]
    alpha: float = _CORE_DEFAULTS["alpha"]
    delta: float = _CORE_DEFAULTS["delta"]
    initial_design: int = 0  # runs recorded before 2026-12-06 had none (their JSON lacks the key)
    schedule: str = _CORE_DEFAULTS["schedule"]
    k: int | None = None
    decay: float = _CORE_DEFAULTS["decay"]
    pooled: bool | None = None
    dense_mass: bool | str | None = None  # True, False or "auto"; None: not recorded (e.g. PyMC runs)
    # The metric phase's estimator (ahmc.core.mass_matrix.resolve_metric_recipe's name; "default" until the
    # dimension is known); None: not recorded (PyMC runs, and JAX runs recorded before 2026-12-07).
    metric_recipe: str | None = None

    def to_json(self) -> str:
        """JSON text for the DataTree attribute ``ahmc_config``."""
        return json.dumps({key: np.asarray(value).tolist() if value is not None else None
                           for key, value in self._asdict().items()})

    @classmethod
    def parse(cls, value) -> "TuningConfig | None":
        """A config from a TuningConfig, a dict or JSON text (unknown keys are ignored); None stays None."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, (str, bytes)):
            value = json.loads(value)
        if not isinstance(value, Mapping):
            raise ValueError(f"config must be a TuningConfig, a dict or JSON text; got {type(value).__name__}.")
        config = cls(**{key: value[key] for key in cls._fields if key in value})
        if config.schedule not in SCHEDULES:
            raise ValueError(f"config schedule must be one of {SCHEDULES}; got {config.schedule!r}.")
        return config


class RoundTable(NamedTuple):
    """One row per (tuner, GP round); every field has shape (num_rows,).

    tuner (int) · round (int, 1-based) · step_size · num_steps (``L``) · arm (flat grid
    index if recorded, else -1) · reward (NaN if unfinished) · adapt_probability (``p_i``
    after the round, NaN if unfinished) · arm_changed · num_iterations (per chain) ·
    acceptance (mean) · num_divergent (sum over the tuner's chains) · num_integration_steps
    (mean steps taken per iteration, NaN if not recorded) · is_warmup · is_complete
    """

    tuner: np.ndarray
    round: np.ndarray
    step_size: np.ndarray
    num_steps: np.ndarray
    arm: np.ndarray
    reward: np.ndarray
    adapt_probability: np.ndarray
    arm_changed: np.ndarray
    num_iterations: np.ndarray
    acceptance: np.ndarray
    num_divergent: np.ndarray
    num_integration_steps: np.ndarray
    is_warmup: np.ndarray
    is_complete: np.ndarray


class ArmTable(NamedTuple):
    """One row per (tuner, distinct ``(step_size, L)``), in order of first visit; shape (num_rows,).

    ``share`` is the arm's fraction of the tuner's GP-phase iterations; ``num_rounds``
    counts completed rounds; ``mean_reward`` averages their finite rewards.
    """

    tuner: np.ndarray
    step_size: np.ndarray
    num_steps: np.ndarray
    num_rounds: np.ndarray
    num_iterations: np.ndarray
    share: np.ndarray
    mean_reward: np.ndarray
    acceptance: np.ndarray
    num_divergent: np.ndarray


class IterationTrace(NamedTuple):
    """The per-draw stats used, every field of shape (chains, draws) (NaN / False if not recorded)."""

    step_size: np.ndarray
    num_steps: np.ndarray
    num_integration_steps: np.ndarray
    acceptance: np.ndarray
    is_divergent: np.ndarray
    round: np.ndarray
    reward: np.ndarray
    arm_changed: np.ndarray
    adapt_probability: np.ndarray
    is_warmup: np.ndarray
    is_retried: np.ndarray | None = None  # a divergent first try retried finer (None: not recorded)


class TuningHistory(NamedTuple):
    """Everything :func:`tuning_history` rebuilt.

    rounds : RoundTable          per (tuner, round)
    arms : ArmTable              per (tuner, distinct arm)
    trace : IterationTrace       per draw, shape (chains, draws)
    chosen_step_size, chosen_num_steps : ndarray, (num_tuners,)
        The arm each tuner ends with: ``final_arm`` if given, else the arm of the last draw.
    chosen_is_known : ndarray of bool, (num_tuners,)
        False when the arm moved after the last draw and ``final_arm`` was not given.
    tuner_chains : tuple of tuples   chains driven by each tuner (all of them when pooled)
    pooled : bool                    one tuner shared by all chains
    warmup_known : bool              whether the stats say which draws are warm-up
    config : TuningConfig or None
    float_dtype : str                dtype of the recorded rewards (the tuner's arithmetic)
    strongest_correlation : (r, name_i, name_j) or None
        The largest posterior correlation in absolute value between two coordinates of the draws
        (:func:`strongest_correlation`), when the history was built from draws as well as stats.
    slowest_square : (ess_square, name, ess_coordinates, num_draws) or None
        The smallest bulk ESS of a coordinate's centred square ``(x - mean)^2``, that coordinate, the
        smallest bulk ESS of the coordinates themselves and the number of draws (the adapters compute it
        with ArviZ when the history is built from draws).
    worst_rhat : (rhat, name, num_chains) or None
        The largest rank-normalised split R-hat (ArviZ's) over the coordinates of the draws, that
        coordinate and the number of chains (the adapters compute it when the history is built from the
        draws of two or more chains).
    """

    rounds: RoundTable
    arms: ArmTable
    trace: IterationTrace
    chosen_step_size: np.ndarray
    chosen_num_steps: np.ndarray
    chosen_is_known: np.ndarray
    tuner_chains: tuple
    pooled: bool
    warmup_known: bool
    config: TuningConfig | None
    float_dtype: str = "float64"
    strongest_correlation: tuple | None = None
    slowest_square: tuple | None = None
    worst_rhat: tuple | None = None

    @property
    def num_tuners(self) -> int:
        return len(self.tuner_chains)

    def weight(self, tuner: int) -> float:
        """Weight of one reward in the GP: the number of pooled chains (1 per independent chain)."""
        return float(len(self.tuner_chains[tuner])) if self.pooled else 1.0


def _names(keys, names: Mapping | None) -> dict:
    """Canonical field -> stat name (or None) for the available ``keys``."""
    names = dict(names or {})
    unknown = set(names) - set(ALIASES) - {"num_steps", "num_integration_steps"}
    if unknown:
        raise ValueError(f"names has unknown fields {sorted(unknown)}; known: "
                         f"{sorted(set(ALIASES) | {'num_steps', 'num_integration_steps'})}.")
    out = {field: names.get(field, next((a for a in aliases if a in keys), None))
           for field, aliases in ALIASES.items()}
    # L versus steps taken: NumPyro and PyMC call L `max_steps` and the steps taken `num_steps`
    # / `n_steps`; the JAX engine calls L `num_steps` and the steps taken `num_integration_steps`.
    if "max_steps" in keys:
        default_l, taken = "max_steps", ("num_integration_steps", "n_steps", "num_steps")
    elif "num_integration_steps" in keys:
        default_l, taken = "num_steps", ("num_integration_steps",)
    else:
        default_l, taken = None, ("n_steps",)
    out["num_steps"] = names.get("num_steps", default_l)
    out["num_integration_steps"] = names.get("num_integration_steps", next((a for a in taken if a in keys), None))
    for field in ("step_size", "num_steps", "round", "reward"):
        if out[field] is None or out[field] not in keys:
            raise ValueError(
                f"The stats have no {field!r} field (looked for {out[field] or ALIASES.get(field)}); "
                f"available: {sorted(keys)}. Pass names={{'{field}': '<stat name>'}}."
            )
    return out


def _as_2d(value, name) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2:
        raise ValueError(f"stat {name!r} must have shape (chains, draws) or (draws,); got {array.shape}.")
    return array


def _mean(values) -> float:
    """Mean of the finite values; NaN (quietly) when there are none."""
    values = np.asarray(values, dtype=np.float64)
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else np.nan


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.all((a == b) | (np.isnan(a) & np.isnan(b)))) if a.dtype.kind == "f" else bool(np.all(a == b))


def _tuner_round_rows(t: int, chains: tuple, trace: IterationTrace, arm) -> list[dict]:
    """One row per GP round of tuner ``t`` (its ``chains``; the first one's records stand for all)."""
    lead, rounds, reward = chains[0], trace.round, trace.reward
    num_draws = rounds.shape[1]
    starts = np.flatnonzero(np.r_[True, rounds[lead, 1:] != rounds[lead, :-1]])  # rounds are contiguous
    segments = [(start, end) for start, end in zip(starts, np.r_[starts[1:], num_draws]) if rounds[lead, start] > 0]
    tuner_rows, longest = [], 0
    for position, (start, end) in enumerate(segments):
        last, length = end - 1, end - start
        # A round is finished if another follows, its reward is in, or it is as long as the longest before.
        finished = position < len(segments) - 1 or np.isfinite(reward[lead, last]) or (0 < longest <= length)
        longest = max(longest, length)
        block = (list(chains), slice(start, end))
        tuner_rows.append(dict(
            tuner=t, round=rounds[lead, start], step_size=trace.step_size[lead, start],
            num_steps=trace.num_steps[lead, start], arm=-1 if arm is None else arm[lead, start],
            reward=reward[lead, last] if finished else np.nan,
            adapt_probability=trace.adapt_probability[lead, last] if finished else np.nan,
            arm_changed=bool(trace.arm_changed[lead, last]), num_iterations=length,
            acceptance=_mean(trace.acceptance[block]), num_divergent=int(np.sum(trace.is_divergent[block])),
            num_integration_steps=_mean(trace.num_integration_steps[block]),
            is_warmup=bool(np.all(trace.is_warmup[lead, start:end])), is_complete=bool(finished),
        ))
    return tuner_rows


def tuning_history(stats: Mapping, *, config=None, names: Mapping | None = None, is_warmup=None,
                   final_arm=None) -> TuningHistory:
    """Rebuild the tuning history from per-draw sample stats.

    Parameters
    ----------
    stats
        Mapping of stat name -> array of shape (chains, draws) or (draws,).
        Names of every adapter are recognised (acceptance: ``acceptance_rate``,
        ``accept_prob``, ``accept``; divergences: ``is_divergent``, ``diverging``;
        round: ``round``, ``tuning_round``; warm-up: ``is_warmup``, ``tune``).
        ``L`` is ``max_steps`` when present (NumPyro, PyMC; ``num_steps`` /
        ``n_steps`` are then the steps taken), else ``num_steps`` next to
        ``num_integration_steps`` (JAX engine, BlackJAX).
    config
        :class:`TuningConfig` (or dict / JSON), needed only to rebuild the surrogate.
    names
        Canonical field -> stat name, overriding the defaults: ``step_size``,
        ``num_steps`` (L), ``num_integration_steps``, ``acceptance``, ``divergent``,
        ``reward``, ``round``, ``arm_changed``, ``adapt_probability``, ``is_warmup``, ``arm``.
    is_warmup
        Warm-up flags, shape (chains, draws) or (draws,), overriding the stats'.
    final_arm
        ``(step_size, num_steps)``, scalars or one per tuner: the arm each tuner
        holds after the last draw (e.g. from the final tuner state with
        :func:`arm_parameters`), when the stats end with a move.
    """
    config = TuningConfig.parse(config)
    key = _names(set(stats), names)
    data = {field: None if name is None else _as_2d(stats[name], name) for field, name in key.items()}
    shape = data["step_size"].shape
    for field, value in data.items():
        if value is not None and value.shape != shape:
            raise ValueError(f"stat {key[field]!r} has shape {value.shape}, expected {shape} like step_size.")
    num_chains, num_draws = shape
    nan = np.full(shape, np.nan)

    def floats(field, fill):
        return fill if data[field] is None else data[field].astype(float)

    warm = data["is_warmup"] if is_warmup is None else np.broadcast_to(_as_2d(is_warmup, "is_warmup"), shape)
    rounds = data["round"].astype(np.int64)
    reward = data["reward"].astype(np.float64)
    step_size = data["step_size"].astype(np.float64)
    num_steps = data["num_steps"].astype(np.int64)
    changed = data["arm_changed"]
    if changed is None:  # derive: the arm differs at the next draw
        changed = np.zeros(shape, bool)
        changed[:, :-1] = (step_size[:, 1:] != step_size[:, :-1]) | (num_steps[:, 1:] != num_steps[:, :-1])
    trace = IterationTrace(
        step_size=step_size, num_steps=num_steps,
        num_integration_steps=floats("num_integration_steps", nan), acceptance=floats("acceptance", nan),
        is_divergent=np.zeros(shape, bool) if data["divergent"] is None else data["divergent"].astype(bool),
        round=rounds, reward=reward, arm_changed=changed.astype(bool),
        adapt_probability=floats("adapt_probability", nan),
        is_warmup=np.zeros(shape, bool) if warm is None else np.asarray(warm).astype(bool),
        is_retried=None if data["retried"] is None else data["retried"].astype(bool),
    )
    arm = None if data["arm"] is None else data["arm"].astype(np.int64)

    pooled = config.pooled if config is not None and config.pooled is not None else None
    if pooled is None:
        gp = rounds[0] > 0
        pooled = num_chains > 1 and all(
            _same(step_size[c, gp], step_size[0, gp]) and _same(num_steps[c, gp], num_steps[0, gp])
            and _same(reward[c], reward[0]) and _same(rounds[c], rounds[0]) for c in range(1, num_chains))
    tuner_chains = (tuple(range(num_chains)),) if pooled else tuple((c,) for c in range(num_chains))

    rows, arm_rows = [], []
    for t, chains in enumerate(tuner_chains):
        tuner_rows = _tuner_round_rows(t, chains, trace, arm)
        rows.extend(tuner_rows)
        arm_rows.extend(_arm_rows(t, tuner_rows))
    rounds_table = RoundTable(*(np.asarray([row[f] for row in rows], dtype=_DTYPES[f]) for f in RoundTable._fields))
    arms_table = ArmTable(*(np.asarray([row[f] for row in arm_rows], dtype=_DTYPES[f]) for f in ArmTable._fields))
    lead_chains = [chains[0] for chains in tuner_chains]
    chosen_step_size, chosen_num_steps = step_size[lead_chains, -1], num_steps[lead_chains, -1]
    known = ~trace.arm_changed[lead_chains, -1]
    if final_arm is not None:
        final_eps, final_steps = (np.broadcast_to(np.asarray(v, dtype), (len(lead_chains),)).copy()
                                  for v, dtype in zip(final_arm, (np.float64, np.int64)))
        chosen_step_size, chosen_num_steps, known = final_eps, final_steps, np.ones(len(lead_chains), bool)
    return TuningHistory(
        rounds=rounds_table, arms=arms_table, trace=trace,
        chosen_step_size=chosen_step_size, chosen_num_steps=chosen_num_steps, chosen_is_known=known,
        tuner_chains=tuner_chains, pooled=bool(pooled), warmup_known=warm is not None, config=config,
        float_dtype=np.result_type(data["reward"].dtype, np.float32).name,
    )


_DTYPES = {"tuner": np.int64, "round": np.int64, "step_size": np.float64, "num_steps": np.int64, "arm": np.int64,
           "reward": np.float64, "adapt_probability": np.float64, "arm_changed": bool, "num_iterations": np.int64,
           "acceptance": np.float64, "num_divergent": np.int64, "num_integration_steps": np.float64,
           "is_warmup": bool, "is_complete": bool, "num_rounds": np.int64, "share": np.float64,
           "mean_reward": np.float64}


def _arm_rows(tuner: int, rows: list) -> list:
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["step_size"], row["num_steps"]), []).append(row)
    total = sum(row["num_iterations"] for row in rows)
    out = []
    for (eps, steps), group in groups.items():
        iterations = np.array([g["num_iterations"] for g in group])
        rewards = np.array([g["reward"] for g in group if g["is_complete"]])
        finite = rewards[np.isfinite(rewards)]
        out.append(dict(
            tuner=tuner, step_size=eps, num_steps=steps, num_rounds=len(rewards), num_iterations=int(iterations.sum()),
            share=iterations.sum() / total, mean_reward=float(finite.mean()) if finite.size else np.nan,
            acceptance=_mean(np.repeat([g["acceptance"] for g in group], iterations)),
            num_divergent=int(sum(g["num_divergent"] for g in group)),
        ))
    return out


# -- replay -----------------------------------------------------------------------------------


class _Grid(NamedTuple):
    space: SearchSpace          # same unit coordinates as the tuner that ran
    step_sizes: np.ndarray      # (G,) absolute
    num_steps: np.ndarray       # (H,) the L each grid column runs
    step_size_box: tuple
    num_steps_box: tuple
    log_num_steps: bool         # the L columns are log-spaced (grid_num_steps)


def _pair(value, tuner: int) -> tuple:
    array = np.asarray(value, dtype=float)
    if array.ndim == 2:
        array = array[tuner]
    if array.shape != (2,):
        raise ValueError(f"a search-box bound must be (lo, hi) or one pair per tuner; got shape {np.shape(value)}.")
    return float(array[0]), float(array[1])


def _grid(config: TuningConfig, tuner: int) -> _Grid:
    eps_box = _pair(config.step_size, tuner)
    l_lo, l_hi = (int(round(v)) for v in _pair(config.num_steps, tuner))
    columns = int(config.num_num_steps) if config.num_num_steps else None
    log_columns = bool(columns) and bool(config.log_num_steps)  # an automatic box's columns
    space = search_space(eps_box, (l_lo, l_hi), num_step_sizes=int(config.num_step_sizes),
                         log_step_size=bool(config.log_step_size), num_num_steps=columns, log_num_steps=log_columns)
    return _Grid(space, space.step_sizes, space.num_steps, eps_box, (l_lo, l_hi), log_columns)


def arm_parameters(config, arm, *, tuner: int = 0) -> tuple[float, int]:
    """``(step_size, L)`` that the flat grid index ``arm`` runs in the box of ``config``."""
    grid = _grid(TuningConfig.parse(config), tuner)
    row, column = divmod(int(arm), len(grid.num_steps))
    return float(grid.step_sizes[row]), int(grid.num_steps[column])


def _candidates_matching(grid: _Grid, step_size: float, num_steps: int) -> tuple[list, int]:
    """Grid arms that run ``(step_size, num_steps)`` and the nearest grid arm: the first of the matching
    ones, as :meth:`~ahmc.core.space.SearchSpace.arm_index` picks a first arm where columns repeat an ``L``."""
    scale = np.log if grid.space.log_step_size else (lambda v: v)
    row = int(np.argmin(np.abs(scale(grid.step_sizes) - scale(step_size))))
    num_l = len(grid.num_steps)
    columns = np.flatnonzero(grid.num_steps == num_steps)
    if len(columns):
        column = int(columns[0])
    else:
        unit = unit_of_num_steps(num_steps, *grid.num_steps_box, log=grid.log_num_steps)
        column = int(np.argmin(np.abs(grid.space.num_steps_unit - unit)))
    return [row * num_l + int(j) for j in columns], row * num_l + column


def _config(history: TuningHistory, config) -> TuningConfig:
    config = TuningConfig.parse(config) if config is not None else history.config
    if config is None or config.step_size is None or config.num_steps is None:
        raise ValueError(
            "Rebuilding the surrogate needs the search box and GP settings: pass config=TuningConfig(...) "
            "(adapters store it as JSON in the DataTree attribute 'ahmc_config')."
        )
    return config


def _has_box(config) -> bool:
    return config is not None and config.step_size is not None and config.num_steps is not None


def _k(config: TuningConfig, rows: RoundTable) -> int:
    if config.k is not None:
        return int(config.k)
    p, i = rows.adapt_probability, rows.round
    decaying = np.isfinite(p) & (p < 1.0 - 1e-6) & (p > 0)
    if config.schedule == "inverse_sqrt" and decaying.any():  # p_i = (i - k + 1)^(-1/2)
        return max(int(np.round(np.median(i[decaying] + 1 - 1.0 / p[decaying] ** 2))), 1)
    return max(int(i.max()) if i.size else 1, 1)


def _design_options(grid: _Grid, config: TuningConfig, rows: RoundTable) -> dict:
    """The replayed tuner's initial design: its arms sit at the first arm's step size, the recorded
    ``initial_arm``'s, else (the PyMC step records none) the step size of the design's rounds, 2 to
    ``initial_design + 1``, when the warm-up was recorded and they share one."""
    count = int(config.initial_design)
    if not count:
        return {}
    space, first = grid.space, None
    if config.initial_arm is not None:
        row, col = divmod(int(config.initial_arm), space.shape[1])
        first = (float(space.step_sizes[row]), int(space.num_steps[col]))
    elif len(rows.round) > count and rows.round[0] == 1:
        design_step_sizes = np.unique(rows.step_size[1:count + 1])
        step_size = design_step_sizes[0] if design_step_sizes.size == 1 else rows.step_size[0]
        first = (float(step_size), int(rows.num_steps[0]))
    return {"initial_design": count, "initial_arm": first}


def replay(history: TuningHistory, config=None, *, tuner: int = 0, dtype=None):
    """Replay one tuner's completed rounds into a fresh core tuner: ``(Tuner, TunerState)``.

    Each round's recorded arm is forced (``state._replace(arm=...)``) before
    ``update(state, reward, uniform=1.0, weight)``, so the result does not
    depend on the tuner's own random moves.  ``uniform=1.0`` never adapts, so
    the forced arm is what the update records.  The replay runs in ``dtype``
    (default: that of the recorded rewards, i.e. of the tuner that ran), so that
    argmax ties among grid arms break the same way.
    """
    config = _config(history, config)
    if not 0 <= tuner < history.num_tuners:
        raise ValueError(f"tuner must be in [0, {history.num_tuners}); got {tuner}.")
    grid = _grid(config, tuner)
    select = (history.rounds.tuner == tuner) & history.rounds.is_complete
    rows = RoundTable(*(field[select] for field in history.rounds))
    core = gp_ucb(grid.space, capacity=int(config.capacity), lengthscale=float(config.lengthscale),
                  noise_variance=float(config.noise_variance), alpha=float(config.alpha), delta=float(config.delta),
                  schedule=config.schedule, k=_k(config, rows), decay=float(config.decay),
                  **_design_options(grid, config, rows))
    state = core.init(dtype=np.dtype(dtype or history.float_dtype))
    weight = history.weight(tuner)
    previous, proposal, changed, previous_round = None, None, True, None
    for n in range(len(rows.round)):
        if rows.arm[n] >= 0:
            arm = int(rows.arm[n])
        else:
            matching, nearest = _candidates_matching(grid, rows.step_size[n], int(rows.num_steps[n]))
            consecutive = previous_round is not None and rows.round[n] == previous_round + 1
            if len(matching) <= 1:
                candidates = matching
            elif previous is None:
                candidates = [config.initial_arm] if config.initial_arm is not None and rows.round[n] == 1 else []
            elif consecutive and not changed:
                candidates = [previous]
            else:  # moved: to the UCB proposal, or (end of warm-up) to the best posterior mean
                exploit = n > 0 and rows.is_warmup[n - 1] and not rows.is_warmup[n]
                candidates = ([] if consecutive else [previous]) + _moves(core, state, proposal, matching, exploit)
            resolved = (c() if callable(c) else c for c in candidates)  # lazy: the surrogate only if needed
            arm = next((c for c in resolved if c in matching), nearest)
        state, info = core.update(state._replace(arm=np.asarray(arm, np.int32)), rows.reward[n], 1.0, weight)
        previous, proposal = arm, int(info.proposed_arm)
        changed, previous_round = bool(rows.arm_changed[n]), rows.round[n]
    return core, state


def _moves(core, state, proposal, matching, exploit) -> list:
    """Where a recorded move went, most likely first: the UCB proposal or the best posterior mean, then
    (float ties: the tuner ran in other arithmetic) the first of the matching arms near their maximum."""
    cache = []

    def values(name):
        if not cache:
            cache.append(core.surrogate(state))
        return np.ravel(np.asarray(getattr(cache[0], name), dtype=np.float64))

    def near_max(name):
        v = values(name)[matching]
        return matching[int(np.argmax(v >= v.max() - 1e-5 * max(abs(v.max()), 1.0)))]

    best = lambda: int(np.argmax(values("mean")))  # noqa: E731
    by_mean, by_ucb = (lambda: near_max("mean")), (lambda: near_max("acquisition"))
    return [proposal, best, by_mean, by_ucb] if exploit else [proposal, by_ucb, best, by_mean]


def rebuild_surrogate(history: TuningHistory, config=None, *, tuner: int = 0) -> Surrogate:
    """The GP surrogate of one tuner after its last completed round, in absolute units.

    Returns the core :class:`~ahmc.core.Surrogate`: ``step_sizes`` (G,) and
    ``num_steps`` (H,) give each grid row's step size and each column's ``L``
    in the box the rounds used (with an automatic box, neighbouring columns
    may run the same ``L``); ``mean``, ``sd`` (reward units) and
    ``acquisition`` (the UCB the next move would maximise) have shape (G, H).
    """
    config = _config(history, config)
    core, state = replay(history, config, tuner=tuner)
    surrogate = core.surrogate(state)
    grid = _grid(config, tuner)
    return Surrogate(grid.step_sizes, grid.num_steps, np.asarray(surrogate.mean), np.asarray(surrogate.sd),
                     np.asarray(surrogate.acquisition))


# -- summary ----------------------------------------------------------------------------------


def _phase_mask(history: TuningHistory, chains) -> np.ndarray:
    """Draws of ``chains`` to judge the sampler by: sampling if known and present, else GP-phase draws."""
    trace = history.trace
    sampling = ~trace.is_warmup[list(chains)]
    if history.warmup_known and sampling.any():
        return sampling
    return trace.round[list(chains)] > 0


#: ``|r|`` from which :func:`tuning_summary` suggests a dense mass matrix.
DENSE_HINT_CORRELATION = 0.9


def varying_coordinates(draws) -> np.ndarray:
    """Indices of the coordinates of ``draws`` (..., d) that are finite everywhere and not constant: the
    ones the hints on the draws look at."""
    flat = np.asarray(draws, dtype=np.float64).reshape(-1, np.shape(draws)[-1])
    return np.flatnonzero(np.all(np.isfinite(flat), axis=0) & (np.std(flat, axis=0) > 0))


def strongest_correlation(draws, names=None, *, max_dim: int = 1000):
    """``(r, name_i, name_j)``: the largest ``|r|`` among the correlations of the draws' coordinates.

    ``draws`` is ``(..., d)`` (e.g. chains x draws x d; every leading axis is pooled); ``names`` the
    ``d`` coordinate names (default ``x[i]``).  Constant coordinates are skipped.  ``None`` for fewer
    than two varying coordinates, fewer than three draws, or ``d > max_dim`` (the matrix is d x d).
    """
    draws = np.asarray(draws, dtype=np.float64)
    draws = draws.reshape(-1, draws.shape[-1]) if draws.ndim > 1 else draws[:, None]
    n, d = draws.shape
    names = [f"x[{i}]" for i in range(d)] if names is None else list(names)
    if len(names) != d:
        raise ValueError(f"names has {len(names)} entries for {d} coordinates.")
    keep = varying_coordinates(draws)
    if len(keep) < 2 or n < 3 or d > max_dim:
        return None
    corr = np.corrcoef(draws[:, keep], rowvar=False)
    np.fill_diagonal(corr, 0.0)
    i, j = np.unravel_index(np.argmax(np.abs(corr)), corr.shape)
    i, j = sorted((int(i), int(j)))
    return float(corr[i, j]), names[keep[i]], names[keep[j]]


def dense_mass_hint(history: TuningHistory) -> str | None:
    """A suggestion to try a dense mass matrix (``"auto"`` or ``True``) when the draws are strongly
    correlated, else None."""
    found = history.strongest_correlation
    if found is None or abs(found[0]) < DENSE_HINT_CORRELATION:
        return None
    if history.config is not None and history.config.dense_mass:
        return None
    r, a, b = found
    if history.config is not None and history.config.metric_recipe == "fisher_low_rank":
        # the low-rank estimate learns such correlations from the warm-up already: no dense_mass to suggest
        return (f"posterior correlation {r:+.2f} between {a} and {b}. The low-rank mass matrix (the JAX routes' "
                "default up to d = 200) learns correlations this strong from the warm-up, unless its estimate "
                "did not fit the draws and the warm-up ended diagonal (docs/algorithm.md, \"Scales the window "
                "missed\"); where a scale parameter and the values it scales are correlated, a non-centred "
                "parameterization removes the correlation itself")
    unknown = history.config is None or history.config.dense_mass is None
    return (f"posterior correlation {r:+.2f} between {a} and {b}. A diagonal mass matrix (the default) "
            f"leaves it to the step size and L; a dense one learns it, and was several times faster per "
            f"gradient on most correlated posteriors of our benchmark (docs/algorithm.md, \"Dense mass matrix\"): "
            f"dense_mass=\"auto\" keeps the correlations where they stand above their sampling noise (up to "
            f"d = 200), dense_mass=True always"
            + (". Ignore this if the run already used dense_mass=True." if unknown else "."))


#: :func:`tuning_summary` points at the variances when a square's bulk ESS is below this fraction of the
#: draws and below half the slowest coordinate's.
VARIANCE_HINT_FRACTION = 0.1


def variance_hint(history: TuningHistory) -> str | None:
    """A note that the draws' squares mix far more slowly than the draws (variances less well estimated
    than means), with what to do about it, else None."""
    found = history.slowest_square
    if found is None:
        return None
    ess_square, name, ess_coordinates, num_draws = found
    if ess_square >= VARIANCE_HINT_FRACTION * num_draws or ess_square >= 0.5 * ess_coordinates:
        return None
    return (f"the squares mix far more slowly than the coordinates: the bulk ESS of ({name} - mean)^2 is "
            f"{ess_square:.0f} of {num_draws} draws, against at least {ess_coordinates:.0f} for every coordinate, "
            f"so variances, sds and tail quantiles are estimated less well than means (R-hat, which also "
            f"checks the folded draws, may show it). A reward on the jump alone (objective=\"normalized_esjd\", "
            f"the paper's, the PyMC step's and RMHMC's) favours moves that carry a coordinate to the far side of "
            f"the mode, which leave its square where it was; objective=\"normalized_ess\" (the JAX routes' "
            f"default, and PooledAdaptiveHMC's) scores the squares too (docs/decisions.md, \"The reward on the "
            f"strict metric: ESS, not jumps\"). With it already, draw more.")


#: :func:`tuning_summary` suggests more draws below this bulk ESS per chain (Vehtari et al. 2021's floor for
#: trusting R-hat and ESS; PyMC warns below it after ``pm.sample``).
MIN_ESS_PER_CHAIN = 100


def _short_of_draws(history: TuningHistory, num_chains: int) -> bool:
    """Whether the slowest coordinate's bulk ESS is under :data:`MIN_ESS_PER_CHAIN` per chain (False when the
    draws were not given)."""
    found = history.slowest_square
    return found is not None and found[2] < MIN_ESS_PER_CHAIN * num_chains


def few_draws_hint(history: TuningHistory) -> str | None:
    """A note that some coordinate's bulk ESS is under :data:`MIN_ESS_PER_CHAIN` per chain, with what draws
    cost here and how to get more ESS, else None.  ahmc's arms are short: a draw costs few gradients and
    carries less ESS than a NUTS draw (posteriordb's eight schools: 1.5-2.5 gradients and 0.09-0.21 ESS
    per draw against NUTS's 7-11 and 0.4-0.5), so a run of NUTS's draw count can fall short."""
    num_chains = history.trace.acceptance.shape[0]
    if not _short_of_draws(history, num_chains):
        return None
    ess = history.slowest_square[2]
    sampling = ~history.trace.is_warmup
    steps = history.trace.num_integration_steps[sampling] if sampling.any() else history.trace.num_integration_steps
    steps = steps[np.isfinite(steps)]
    cost = f" at {np.mean(steps):.1f} leapfrog steps per draw" if steps.size else ""
    more = int(np.ceil(MIN_ESS_PER_CHAIN * num_chains / max(ess, 1.0)))
    return (f"the smallest bulk ESS of a coordinate is {ess:.0f} over {num_chains} chains, under "
            f"{MIN_ESS_PER_CHAIN} per chain: R-hat and the Monte Carlo errors are not reliable yet (Vehtari et al. "
            f"2021; PyMC warns the same). The arm is tuned for ESS per unit of computation{cost}, so each draw is "
            f"cheap and carries little: draw about {more}x as many (num_samples / draws), or give objective=\"esjd\" "
            f"for longer trajectories, more ESS per draw and less per gradient (docs/benchmarks.md, \"Known "
            f"misses\").")


def single_step_hint(history: TuningHistory) -> str | None:
    """A note that a tuner settled on ``L = 1`` (every transition one leapfrog step, a MALA step) in a box
    that offered longer trajectories, with the bound that rules it out, else None."""
    notes = []
    for t, chains in enumerate(history.tuner_chains):
        if not history.chosen_is_known[t] or int(history.chosen_num_steps[t]) != 1:
            continue
        upper = int(round(_pair(history.config.num_steps, t)[1])) if _has_box(history.config) else None
        if upper is not None and upper <= 1:
            continue  # the user asked for L = 1
        notes.append((chains[0], upper))
    if not notes:
        return None
    who = "" if history.num_tuners == 1 else "chain " + ", ".join(str(c) for c, _ in notes) + ": "
    upper = max((u for _, u in notes if u is not None), default=None)
    bound = f"num_steps_bounds=(2, {upper})" if upper is not None else "num_steps_bounds=(2, upper)"
    return (f"{who}the chosen arm takes a single leapfrog step (L = 1), so every transition is a Langevin "
            f"(MALA) step. In low dimension the squared-jump reward can prefer it although its rejections "
            f"make the chain stick: on the 3-parameter Ripley regression such runs had 0.63-0.82x the ESS per "
            f"gradient of the other seeds (docs/decisions.md; BENCHMARKS.md@036b7d1, \"A floor of two leapfrog steps\"). To rule it out "
            f"give {bound}: alone it keeps the automatic step sizes; with a box of your own, raise its lower "
            f"L bound to 2.")


def unrecorded_warmup_note(history: TuningHistory) -> str | None:
    """What the report cannot see when the warm-up was not recorded (the default of ``pm.sample`` and
    ``MCMC.run``), and how to keep it; None when every round is there."""
    rounds = history.rounds
    firsts = [int(rounds.round[rounds.tuner == t].min()) for t in range(history.num_tuners)
              if np.any(rounds.tuner == t)]
    if not firsts or min(firsts) <= 1:
        return None
    return (f"the warm-up was not recorded, so rounds 1-{min(firsts) - 1}, where the tuner learns most, are missing: "
            "the arms and the reward surface below cover the later rounds only. That is no sign of failure. To keep "
            "it: pm.sample(..., discard_tuned_samples=False) or sample_numpyro_ahmc(..., discard_tuned_samples=False) "
            "(PyMC); in NumPyro mcmc.warmup(key, ..., collect_warmup=True), warmup = arviz.from_numpyro(mcmc), "
            "mcmc.run(...), then history_from_numpyro(mcmc, warmup=warmup) (README, \"What did the tuner do?\"); "
            "BlackJAX's run_chains and gpucb_adaptation info hold it already.")


def tuning_warnings(history: TuningHistory) -> list[str]:
    """Signs that tuning failed, each with its fix (empty when none)."""
    out = []
    rounds = history.rounds
    for t, chains in enumerate(history.tuner_chains):
        who = "" if history.num_tuners == 1 else f"chain {chains[0]}: "
        mine = rounds.tuner == t
        if not np.any(mine & rounds.is_complete):
            out.append(f"{who}no GP round finished: tuning never started. More warm-up (num_warmup) or shorter "
                       "rounds (round_length).")
            continue
        first = int(rounds.round[mine].min())
        warm_rounds = int(np.sum(mine & rounds.is_warmup & rounds.is_complete))
        if history.warmup_known and first == 1 and warm_rounds < MIN_WARMUP_ROUNDS:
            out.append(f"{who}only {warm_rounds} GP rounds in warm-up: too few to learn the reward surface. "
                       "More warm-up (num_warmup) or shorter rounds (round_length).")
        mask = _phase_mask(history, chains)
        accept = history.trace.acceptance[list(chains)][mask]
        accept = _mean(accept)
        if accept < LOW_ACCEPTANCE:
            out.append(f"{who}acceptance {accept:.2f} is near 0: the step sizes tried are too large for this "
                       "posterior. Lower the step-size box (step_size_bounds, or step_size_factors for the automatic "
                       "box), more warm-up, or reparameterize.")
        elif accept > HIGH_ACCEPTANCE:
            out.append(f"{who}acceptance {accept:.3f} is near 1: the step sizes are smaller than they need to be. "
                       "Widen the step-size box upwards (step_size_bounds / step_size_factors).")
        divergent, first_try, rescued = _divergent_shares(history.trace, list(chains), mask)
        if first_try > MAX_DIVERGENT:
            # a retry that rescues the transition (divergence_retry) does not make the region easy: still say so
            after = f" ({100 * divergent:.1f}% still did after a finer retry)" if rescued else ""
            out.append(f"{who}{100 * first_try:.1f}% of transitions diverged{after}: the step sizes are too large in some "
                       "region. Lower the step-size box, more warm-up, or reparameterize the model (non-centred). "
                       "Where the posterior's scale changes with position (a funnel, a centred hierarchy), try the "
                       "Riemannian route, AdaptiveRMHMC(metric=\"fisher\") (docs/rmhmc.md), whose metric follows it.")
        if _has_box(history.config):
            out.extend(who + message for message in _edge_warnings(history, t))
    found = [_slow_exploration(history), _unmixed_chains(history)]
    return out + [message for message in found if message]


def _divergent_shares(trace: IterationTrace, chains: list, mask) -> tuple[float, float, bool]:
    """Shares of the masked transitions that diverged (after any retry), whose first try diverged (retried
    or not), and whether retries were recorded at all."""
    if not mask.any():
        return 0.0, 0.0, False
    divergent = trace.is_divergent[chains][mask]
    if trace.is_retried is None:
        return float(np.mean(divergent)), float(np.mean(divergent)), False
    first_try = divergent | trace.is_retried[chains][mask]
    return float(np.mean(divergent)), float(np.mean(first_try)), True


def _slow_exploration(history: TuningHistory) -> str | None:
    """A warning when some coordinate's bulk ESS is a sliver of the draws (known from draws only)."""
    if history.slowest_square is None:
        return None
    _, _, ess_coordinates, num_draws = history.slowest_square
    if not ess_coordinates < MIN_ESS_FRACTION * num_draws:
        return None
    return (f"the slowest coordinate's bulk ESS is {ess_coordinates:.0f} of {num_draws} draws: the chains barely "
            "explore it, so its estimates cannot be trusted. Where the posterior's scales differ by orders of "
            "magnitude the warm-up may not have found one: give more warm-up (tune / num_warmup), pool the chains' "
            "estimate (PyMC: PooledAdaptiveHMC), or pass the variances (PyMC: scaling=; BlackJAX and NumPyro: "
            "inverse_mass_matrix=).")


def _unmixed_chains(history: TuningHistory) -> str | None:
    """A warning when the chains disagree about some coordinate (R-hat above 1.01; known from draws only),
    with the remedy our benchmark found for the default metric's known miss."""
    if history.worst_rhat is None:
        return None
    rhat, name, num_chains = history.worst_rhat
    if not rhat > MAX_RHAT:
        return None
    shown = f"{rhat:.3f}" if rhat < 100 else f"{rhat:.3g}"  # chains that each sat still: R-hat near inf
    few = _short_of_draws(history, num_chains)
    first = (" With under 100 effective draws per chain R-hat is itself uncertain: draw more first (the hint "
             "below); if it stays above 1.01, give more warm-up." if few else " Draw more and give more warm-up.")
    return (f"R-hat {shown} for {name} over {num_chains} chains (above {MAX_RHAT}): the chains disagree about "
            f"it, so means, sds and intervals from these draws can be wrong.{first} On a "
            "posterior far from Gaussian (hyperparameters of a Gaussian process or a hierarchy) the low-rank "
            "Fisher mass matrix (metric_recipe=\"fisher_low_rank\", the JAX routes' default up to d = 200) can "
            "set some scales below the posterior's, and tuned trajectories too short for them; the warm-up "
            "ends with a diagonal of the draws' spread only when one scale is more than 2.5x too small, and "
            "metric_recipe=\"welford_diag\" takes the draws' variances throughout (docs/algorithm.md, "
            "\"Scales the window missed\").")


def _edge_warnings(history: TuningHistory, tuner: int) -> list[str]:
    grid = _grid(history.config, tuner)
    core, state = replay(history, tuner=tuner)
    mean = np.asarray(core.surrogate(state).mean).reshape(-1)
    num_eps, num_l = grid.space.shape
    tried = np.asarray(state.buffer.arm)[np.asarray(state.buffer.count) > 0]
    best = int(tried[np.argmax(mean[tried])])  # among the arms tried: far from data the mean is the prior's 0
    _, chosen = _candidates_matching(grid, history.chosen_step_size[tuner], int(history.chosen_num_steps[tuner]))
    out = []
    for label, arm in (("best", best), ("chosen", chosen)):
        row, column = divmod(arm, num_l)
        eps, steps = grid.step_sizes[row], grid.num_steps[column]
        edges = []
        if num_eps > 1 and row in (0, num_eps - 1):
            side = "lower" if row == 0 else "upper"
            edges.append(f"the {side} step-size edge {grid.step_size_box[row > 0]:.3g}")
        if num_l > 1 and (column == num_l - 1 or (column == 0 and grid.num_steps_box[0] > 1)):
            side = "lower" if column == 0 else "upper"
            edges.append(f"the {side} L edge {grid.num_steps_box[column > 0]}")
        if edges:
            out.append(
                f"the {label} arm (step_size={eps:.3g}, L={steps}) sits on {' and '.join(edges)} of the search box "
                f"(step_size {grid.step_size_box[0]:.3g}..{grid.step_size_box[1]:.3g}, L "
                f"{grid.num_steps_box[0]}..{grid.num_steps_box[1]}): the optimum may lie outside. Widen the box "
                "(step_size_bounds / num_steps_bounds; for the automatic box step_size_factors / "
                "max_integration_time) and give it more warm-up."
            )
            break  # one edge warning per tuner
    return out


def tuning_summary(history: TuningHistory, *, max_arms: int | None = None) -> str:
    """A text report: chosen (eps, L), distinct arms and their shares, acceptance, divergences, warnings.

    ``max_arms`` rows of the arm table per tuner, by share of iterations
    (default 8 for one tuner, 4 each for several).
    """
    trace, rounds, arms = history.trace, history.rounds, history.arms
    num_chains = trace.step_size.shape[0]
    several = history.num_tuners > 1
    max_arms = (4 if several else 8) if max_arms is None else max_arms
    kind = "one pooled tuner" if history.pooled else ("one tuner" if num_chains == 1 else "one tuner per chain")
    lines = [f"ahmc tuning summary: {num_chains} chain(s), {kind}"]
    if _has_box(history.config):
        for t in range(history.num_tuners if np.ndim(history.config.step_size) == 2 else 1):
            grid = _grid(history.config, t)
            where = f" (chain {history.tuner_chains[t][0]})" if np.ndim(history.config.step_size) == 2 else ""
            lines.append(f"  search box{where}: step_size {grid.step_size_box[0]:.3g}..{grid.step_size_box[1]:.3g}, "
                         f"L {grid.num_steps_box[0]}..{grid.num_steps_box[1]}")
    for t, chains in enumerate(history.tuner_chains):
        indent = "    " if several else "  "
        if several:
            lines.append(f"  chain {chains[0]}:")
        mine = rounds.tuner == t
        moved = "" if history.chosen_is_known[t] else " (the last arm run: the tuner moved after the last draw)"
        lines.append(f"{indent}chosen arm: step_size = {history.chosen_step_size[t]:.3g}, "
                     f"L = {history.chosen_num_steps[t]}{moved}")
        metric = int(np.sum(trace.round[chains[0]] == 0))
        warm = f"{int(np.sum(mine & rounds.is_warmup))} in warm-up" if history.warmup_known else "warm-up not recorded"
        after = f" after {metric} metric-phase draws" if metric else ""
        lines.append(f"{indent}GP rounds: {int(np.sum(mine))} ({warm}){after}; "
                     f"distinct arms: {int(np.sum(arms.tuner == t))}")
        mask = _phase_mask(history, chains)
        phase = "sampling" if history.warmup_known and (~trace.is_warmup[list(chains)]).any() else "GP phase"
        divergent, draws = int(np.sum(trace.is_divergent[list(chains)][mask])), int(mask.sum())
        retried = "" if trace.is_retried is None else f", retried finer {int(np.sum(trace.is_retried[list(chains)][mask]))}"
        lines.append(f"{indent}{phase}: acceptance {_mean(trace.acceptance[list(chains)][mask]):.2f}, "
                     f"divergences {divergent} of {draws} ({100 * divergent / max(draws, 1):.1f}%){retried}")
        order = np.flatnonzero(arms.tuner == t)
        order = order[np.argsort(-arms.share[order], kind="stable")]
        lines.append(f"{indent}  step_size      L   share  rounds   reward  accept  diverged")
        for a in order[:max_arms]:
            lines.append(f"{indent}  {arms.step_size[a]:9.3g}  {arms.num_steps[a]:5d}  {100 * arms.share[a]:5.1f}%  "
                         f"{arms.num_rounds[a]:6d}  {arms.mean_reward[a]:7.3g}  {arms.acceptance[a]:6.2f}  "
                         f"{arms.num_divergent[a]:8d}")
        if len(order) > max_arms:
            rest = order[max_arms:]
            lines.append(f"{indent}  ... and {len(rest)} more arms "
                         f"({100 * arms.share[rest].sum():.1f}% of the iterations)")
    missing = unrecorded_warmup_note(history)
    if missing:
        lines.append(f"NOTE: {missing}")
    warnings = tuning_warnings(history)
    if warnings:
        lines.append("WARNING: tuning probably failed:")
        lines.extend(f"  - {message}" for message in warnings)
    else:
        lines.append("No sign that tuning failed.")
    for hint in (dense_mass_hint(history), variance_hint(history), single_step_hint(history),
                 few_draws_hint(history)):
        if hint:
            lines.append(f"Hint: {hint}")
    return "\n".join(lines)
