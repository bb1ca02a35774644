"""Plots of what the tuner did (matplotlib; the optional ``plot`` extra).

Following the thesis (Wang 2012): the learned mean reward over the search box
with the arms tried as dots sized by their visits (its Figure 4.1), and a
slice of the GP mean +- one standard deviation with the acquisition function
underneath (its Figure 4.2); plus the arm (eps, L) over the iterations with
warm-up shaded and the annealed probability of adapting over the rounds.
Like ArviZ's matplotlib functions, each takes ``ax``/``axes`` to draw into and
returns the Axes it drew on; :func:`plot_tuning` returns the whole Figure.

>>> from ahmc.adapters.plots import plot_tuning         # doctest: +SKIP
>>> plot_tuning(history).savefig("tuning.png")          # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

from ahmc.core import Surrogate
from ahmc.core.diagnostics import TuningHistory, rebuild_surrogate

from ._extras import require

require("matplotlib", "plot")

__all__ = ["plot_reward_surface", "plot_surrogate_slice", "plot_arm_trace", "plot_adapt_probability", "plot_tuning"]

EPS_LABEL, L_LABEL = "step size $\\epsilon$", "max. leapfrog steps $L$"


def _pyplot():
    import matplotlib.pyplot as plt

    return plt


def _axes(ax, count=1, height_ratios=None):
    """The given Axes, or a new figure's: one, or ``count`` stacked with a shared x axis."""
    if ax is not None:
        return ax
    plt = _pyplot()
    if count == 1:
        return plt.subplots()[1]
    return plt.subplots(count, 1, sharex=True, height_ratios=height_ratios, layout="constrained")[1]


def _surrogate(data, tuner, config):
    if isinstance(data, Surrogate):
        return data, None
    if isinstance(data, TuningHistory):
        return rebuild_surrogate(data, config, tuner=tuner), data
    raise TypeError(f"Expected a TuningHistory or a Surrogate; got {type(data).__name__}.")


def _continuous_steps(num_steps) -> np.ndarray:
    """Column coordinates in L units: the grid's own values, or evenly spaced if columns repeat an L."""
    steps = np.asarray(num_steps, dtype=float)
    if steps.size < 2 or np.all(np.diff(steps) > 0):
        return steps
    return np.linspace(steps[0], steps[-1], steps.size)


def _is_log(step_sizes) -> bool:
    x = np.asarray(step_sizes, dtype=float)
    return x.size > 2 and x[0] > 0 and np.allclose(np.diff(np.log(x)), np.log(x[1] / x[0]), rtol=1e-6)


def _log_axis(ax, values, axis="x"):
    """Log axis with plain tick labels (0.5, 1, 2 rather than 5e-1)."""
    ticker = require("matplotlib.ticker", "plot")
    getattr(ax, f"set_{axis}scale")("log")
    target = getattr(ax, f"{axis}axis")
    ratio = np.max(values) / np.min(values)
    if ratio < 1e3:
        subs = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0) if ratio < 30 else (1.0, 2.0, 5.0)
        target.set_major_locator(ticker.LogLocator(base=10, subs=subs))
    target.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    target.set_minor_formatter(ticker.NullFormatter())


def _arms(history, tuner):
    if history is None:
        return None
    mine = history.arms.tuner == tuner
    return history.arms.step_size[mine], history.arms.num_steps[mine], history.arms.share[mine], \
        history.arms.mean_reward[mine]


def plot_reward_surface(data, *, tuner: int = 0, config=None, ax=None, levels: int = 15, cmap: str = "viridis",
                        show_arms: bool = True, colorbar: bool = True):
    """Contour of the GP's mean reward over the search box, arms tried as dots sized by visits.

    ``data`` is a :class:`~ahmc.core.diagnostics.TuningHistory` (the surrogate is
    rebuilt for ``tuner``; needs its config or ``config=``) or a core
    ``Surrogate`` (no dots).  The chosen arm is a red star.  Returns the Axes.
    """
    surrogate, history = _surrogate(data, tuner, config)
    return _draw_surface(_axes(ax), surrogate, history if show_arms else None, tuner, levels, cmap, colorbar)


def _draw_surface(ax, surrogate, history, tuner, levels=15, cmap="viridis", colorbar=True):
    x, y = np.asarray(surrogate.step_sizes, float), _continuous_steps(surrogate.num_steps)
    mean = np.asarray(surrogate.mean)
    if x.size > 1 and y.size > 1:
        filled = ax.contourf(x, y, mean.T, levels=levels, cmap=cmap)
        if colorbar:
            ax.figure.colorbar(filled, ax=ax, label="GP mean reward")
    elif x.size > 1:
        ax.plot(x, mean[:, 0], color="C3")
    else:
        ax.plot(np.full(y.size, x[0]), y, color="C3")
    if _is_log(x):
        _log_axis(ax, x)
    if history is not None:
        eps, steps, share, _ = _arms(history, tuner)
        ax.scatter(eps, steps, s=15 + 600 * share, facecolor="white", edgecolor="black", alpha=0.8,
                   linewidth=0.8, label="arms tried (size: visits)", zorder=3)
        ax.scatter([history.chosen_step_size[tuner]], [history.chosen_num_steps[tuner]], marker="*", s=220,
                   color="red", edgecolor="black", linewidth=0.6, label="chosen arm", zorder=4)
        ax.legend(loc="best", fontsize="small", framealpha=0.8)
    ax.set_xlabel(EPS_LABEL)
    ax.set_ylabel(L_LABEL)
    ax.set_title("Learned reward surface")
    return ax


def plot_surrogate_slice(data, *, along: str = "step_size", at=None, tuner: int = 0, config=None, axes=None):
    """GP mean +- one sd along one coordinate (top) and the acquisition function (bottom).

    ``along="step_size"`` fixes ``L`` at ``at`` (default: the chosen arm's, else
    the best mean's); ``along="num_steps"`` fixes the step size.  Arms tried on
    the slice are drawn with their mean reward.  Returns the two Axes.
    """
    if along not in ("step_size", "num_steps"):
        raise ValueError(f"along must be 'step_size' or 'num_steps'; got {along!r}.")
    surrogate, history = _surrogate(data, tuner, config)
    return _draw_slice(_axes(axes, 2, height_ratios=(2, 1)), surrogate, history, tuner, along, at)


def _draw_slice(axes, surrogate, history, tuner, along, at):
    top, bottom = axes
    eps, steps = np.asarray(surrogate.step_sizes, float), _continuous_steps(surrogate.num_steps)
    grid_steps = np.asarray(surrogate.num_steps)
    mean, sd, acquisition = (np.asarray(a) for a in (surrogate.mean, surrogate.sd, surrogate.acquisition))
    best_row, best_column = np.unravel_index(np.argmax(mean), mean.shape)
    if along == "step_size":
        target = (history.chosen_num_steps[tuner] if history is not None else steps[best_column]) if at is None else at
        index = int(np.argmin(np.abs(steps - target)))
        x, cut, fixed = eps, (slice(None), index), f"$L$ = {grid_steps[index]:g}"
    else:
        target = (history.chosen_step_size[tuner] if history is not None else eps[best_row]) if at is None else at
        index = int(np.argmin(np.abs(np.log(eps) - np.log(target))))
        x, cut, fixed = steps, (index, slice(None)), f"$\\epsilon$ = {eps[index]:.3g}"
    top.plot(x, mean[cut], color="red", label="GP mean")
    top.fill_between(x, mean[cut] - sd[cut], mean[cut] + sd[cut], color="C0", alpha=0.3, label="$\\pm$ 1 sd")
    if history is not None:
        arm_eps, arm_steps, share, reward = _arms(history, tuner)
        if along == "step_size":
            keep, arm_x = arm_steps == grid_steps[index], arm_eps
        else:
            keep, arm_x = np.isclose(arm_eps, eps[index], rtol=1e-3), arm_steps
        top.scatter(arm_x[keep], reward[keep], s=15 + 600 * share[keep], color="black", zorder=3,
                    label="arms tried (mean reward)")
    top.set_ylabel("reward")
    top.set_title(f"GP surrogate along {'the step size' if along == 'step_size' else 'L'}, {fixed}")
    top.legend(fontsize="small")
    bottom.plot(x, acquisition[cut], color="C2")
    bottom.axvline(x[int(np.argmax(acquisition[cut]))], color="C2", linestyle=":", linewidth=1)
    bottom.set_ylabel("acquisition (UCB)")
    bottom.set_xlabel(EPS_LABEL if along == "step_size" else L_LABEL)
    if along == "step_size" and _is_log(eps):
        _log_axis(bottom, eps)
    return np.array([top, bottom])


def _shade_warmup(ax, history: TuningHistory, chain: int, label: bool):
    trace = history.trace
    metric = np.flatnonzero(trace.round[chain] == 0)
    if metric.size:
        ax.axvspan(-0.5, metric[-1] + 0.5, color="0.6", alpha=0.25, lw=0, label="metric phase" if label else None)
    warm = np.flatnonzero(trace.is_warmup[chain])
    if history.warmup_known and warm.size:
        start = metric[-1] + 1 if metric.size else 0
        ax.axvspan(start - 0.5, warm[-1] + 0.5, color="0.6", alpha=0.12, lw=0, label="warm-up (GP)" if label else None)


def plot_arm_trace(history: TuningHistory, *, axes=None):
    """The step size (top) and ``L`` (bottom) over the iterations, one line per tuner, warm-up shaded.

    Returns the two Axes.
    """
    top, bottom = _axes(axes, 2)
    trace = history.trace
    iterations = np.arange(trace.step_size.shape[1])
    for t, chains in enumerate(history.tuner_chains):
        label = "all chains (pooled)" if history.pooled else f"chain {chains[0]}"
        top.plot(iterations, trace.step_size[chains[0]], drawstyle="steps-post", linewidth=1, label=label)
        bottom.plot(iterations, trace.num_steps[chains[0]], drawstyle="steps-post", linewidth=1, label=label)
    for n, ax in enumerate((top, bottom)):
        _shade_warmup(ax, history, history.tuner_chains[0][0], label=n == 0)
    steps = trace.step_size[np.isfinite(trace.step_size) & (trace.step_size > 0)]
    if steps.size and steps.max() / steps.min() > 20:
        _log_axis(top, steps, axis="y")
    top.set_ylabel(EPS_LABEL)
    bottom.set_ylabel(L_LABEL)
    bottom.set_xlabel("iteration")
    top.set_title("Arm over the iterations")
    top.legend(fontsize="small", loc="upper right")
    return np.array([top, bottom])


def plot_adapt_probability(history: TuningHistory, *, tuner: int | None = None, ax=None):
    """The annealed probability ``p_i`` of moving the arm after each round; dots where it moved.

    ``tuner=None`` draws every tuner.  Warm-up rounds are shaded.  Returns the Axes.
    """
    ax = _axes(ax)
    rounds = history.rounds
    tuners = range(history.num_tuners) if tuner is None else [tuner]
    for t in tuners:
        mine = (rounds.tuner == t) & rounds.is_complete
        i, p, moved = rounds.round[mine], rounds.adapt_probability[mine], rounds.arm_changed[mine]
        label = "" if history.num_tuners == 1 else f" (chain {history.tuner_chains[t][0]})"
        line = ax.plot(i, p, drawstyle="steps-post", label="$p_i$" + label)[0]
        ax.scatter(i[moved], p[moved], s=18, color=line.get_color(), edgecolor="black", linewidth=0.5, zorder=3,
                   label="arm moved" + label)
    warm = rounds.round[rounds.is_warmup & rounds.is_complete]
    if history.warmup_known and warm.size:
        ax.axvspan(warm.min() - 0.5, warm.max() + 0.5, color="0.6", alpha=0.12, lw=0, label="warm-up")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("GP round $i$")
    ax.set_ylabel("probability of adapting $p_i$")
    ax.set_title("Annealing of the adaptation")
    ax.legend(fontsize="small", loc="upper right")
    return ax


def plot_tuning(history: TuningHistory, *, tuner: int = 0, config=None, figsize=(12, 9)):
    """All four plots in one Figure (the surrogate panels need the search box); returns the Figure."""
    plt = _pyplot()
    figure = plt.figure(figsize=figsize, layout="constrained")
    grid = figure.add_gridspec(4, 2)
    surface = figure.add_subplot(grid[0:2, 0])
    slice_top = figure.add_subplot(grid[0, 1])
    slice_bottom = figure.add_subplot(grid[1, 1], sharex=slice_top)
    trace_top = figure.add_subplot(grid[2, 0])
    trace_bottom = figure.add_subplot(grid[3, 0], sharex=trace_top)
    annealing = figure.add_subplot(grid[2:4, 1])
    try:
        surrogate = rebuild_surrogate(history, config, tuner=tuner)
    except ValueError as error:  # no box or no finished round: say so where the surface would be
        for ax in (surface, slice_top, slice_bottom):
            ax.text(0.5, 0.5, str(error), ha="center", va="center", wrap=True, fontsize="small",
                    transform=ax.transAxes)
            ax.set_axis_off()
    else:
        _draw_surface(surface, surrogate, history, tuner)
        _draw_slice((slice_top, slice_bottom), surrogate, history, tuner, "step_size", None)
    if history.num_tuners > 1:  # one tuner per chain: the surface panels show one of them
        chain = history.tuner_chains[tuner][0]
        surface.set_title(f"Learned reward surface: chain {chain}")
        figure.suptitle(f"One tuner per chain ({history.num_tuners}): the surface and slice are chain {chain}'s "
                        f"(plot_tuning(history, tuner=t) for another); the traces show every chain.", fontsize="medium")
    plot_arm_trace(history, axes=(trace_top, trace_bottom))
    plot_adapt_probability(history, tuner=None if history.num_tuners <= 4 else tuner, ax=annealing)
    return figure
