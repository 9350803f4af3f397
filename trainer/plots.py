"""The training run's curves as a PNG: loss and the fraction of step time spent waiting for data,
by step (what the checkpoints asset shows inline in the Dagster UI; no Dagster here)."""

from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt


def training_curves_png(points: Sequence[dict], *, title: str = "") -> bytes:
    """``points``: the trainer's progress reports, each with ``step`` and some of ``loss`` and
    ``data_wait_fraction``. Raises ValueError when none has a step."""
    points = [p for p in points if "step" in p]
    if not points:
        raise ValueError("no progress point with a step to plot")
    fig, (loss_ax, wait_ax) = plt.subplots(2, 1, figsize=(6.4, 4.2), sharex=True, dpi=100)
    try:
        loss = [(p["step"], p["loss"]) for p in points if p.get("loss") is not None]
        if loss:
            loss_ax.plot(*zip(*loss), color="tab:blue")
        loss_ax.set_ylabel("loss")
        loss_ax.set_yscale("log" if loss and min(v for _, v in loss) > 0 else "linear")
        wait = [(p["step"], 100 * p["data_wait_fraction"]) for p in points if p.get("data_wait_fraction") is not None]
        if wait:
            wait_ax.plot(*zip(*wait), color="tab:orange")
        wait_ax.set_ylabel("data wait %")
        wait_ax.set_ylim(0, 100)
        wait_ax.set_xlabel("step")
        if title:
            loss_ax.set_title(title)
        fig.tight_layout()
        out = io.BytesIO()
        fig.savefig(out, format="png")
        return out.getvalue()
    finally:
        plt.close(fig)


__all__ = ["training_curves_png"]
