"""A step ladder as a PNG: one bar per step, stepping down in time (the "ladder"), coloured
by outcome, over the signals the segmenter read (gripper command and hold, end-effector speed
against the pause threshold), so a reviewer sees at a glance why a step ended where it did."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt
import numpy as np

from .config import LadderConfig
from .segment import Signals, Step, speed

COLOURS = {
    "success": "#2e9d4a",
    "failure": "#d62728",
    "done": "#7f8c9a",
    "incomplete": "#f0a030",
    "after_failure": "#d5d8dc",
}


def ladder_png(steps: list[Step], signals: Signals | None, config: LadderConfig, *, title: str, dpi: int = 80) -> bytes:
    t0 = steps[0].start_ns if steps else 0
    fig, axes = plt.subplots(
        3 if signals is not None else 1,
        1,
        figsize=(8, 5.2 if signals is not None else 2.6),
        sharex=True,
        gridspec_kw={"height_ratios": [3, 1, 1.2][: 3 if signals is not None else 1]},
    )
    axes = np.atleast_1d(axes)
    ax = axes[0]
    for s in steps:
        a, b = (s.start_ns - t0) / 1e9, (s.end_ns - t0) / 1e9
        ax.barh(-s.index, b - a, left=a, height=0.8, color=COLOURS.get(s.outcome, "#999999"), edgecolor="white")
        label = f"{s.name}  {s.duration_s:.2f}s" + (f"  ✗ {s.failure_mode}" if s.failure_mode else "")
        ax.text(a + 0.05, -s.index, label, va="center", ha="left", fontsize=8)
        if s.failed_at_ns is not None:
            ax.plot([(s.failed_at_ns - t0) / 1e9], [-s.index], marker="x", color="black", markersize=7)
    ax.set_yticks([])
    ax.set_title(title, fontsize=9, loc="left")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    ax.legend(handles, list(COLOURS), fontsize=7, ncol=5, loc="upper right", frameon=False)
    ax.set_ylim(-len(steps) - 0.2, 1.4)
    if signals is not None:
        th = config.thresholds
        ax = axes[1]
        ax.step((signals.command_t - t0) / 1e9, signals.command, where="post", lw=1, color="#1f77b4", label="command")
        ax.fill_between(
            (signals.hold_t - t0) / 1e9,
            0,
            signals.holding.astype(float),
            step="post",
            alpha=0.3,
            color="#2e9d4a",
            label="holding",
        )
        ax.set_ylabel("gripper", fontsize=8)
        ax.set_yticks([0, 1])
        ax.legend(fontsize=7, loc="upper right", frameon=False)
        ax = axes[2]
        ax.plot(
            (signals.position_t - t0) / 1e9,
            speed(signals.position_t, signals.position, th["speed_window_s"]),
            lw=0.8,
            color="#444444",
        )
        ax.axhline(th["pause_speed_m_s"], color="#d62728", lw=0.6, ls="--")
        ax.set_ylabel("EE m/s", fontsize=8)
    axes[-1].set_xlabel("seconds from the episode start", fontsize=8)
    for a in axes:
        a.tick_params(labelsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()
