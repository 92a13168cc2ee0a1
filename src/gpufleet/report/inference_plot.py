"""An HTML chart of an inference load: servers needed and idle over time, and mean utilisation by hour of day."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write_inference_plot"]


def write_inference_plot(path: Path, frame: Any, summary: dict[str, Any], until_s: float) -> Path:
    """Write the page to ``path``: ``frame`` has time_s, servers_needed and idle_servers; ``summary`` a ``name``,
    ``hourly_utilisation`` (24 shares) and any other fields, shown as a table."""
    from gpufleet.report.html import figure_div, kv_table, page, section
    from gpufleet.report.plots import grouped_bar, timeline_figure

    t = frame["time_s"].to_numpy()
    timeline = timeline_figure(
        {
            "servers needed": (t, frame["servers_needed"].to_numpy()),
            "idle servers": (t, frame["idle_servers"].to_numpy()),
        },
        title="Inference servers needed and idle",
        y_title="servers",
        end_time=until_s,
    )
    hours = [f"{h:02d}" for h in range(24)]
    by_hour = grouped_bar(
        hours,
        {"mean utilisation": summary["hourly_utilisation"]},
        title="By hour of day",
        y_title="share of the pool",
        x_title="hour of day",
        seconds=False,
    )
    context = {k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in summary.items() if k != "hourly_utilisation"}
    body = [
        kv_table(context),
        section(
            "Over time",
            figure_div(timeline, div_id="timeline", include_plotlyjs=True),
            note="Idle servers are the ones capacity loaning can lend to training.",
        ),
        section("Hour of day", figure_div(by_hour, div_id="hourly", include_plotlyjs=False)),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page(f"Inference load: {summary['name']}", body), encoding="utf-8")
    return path
