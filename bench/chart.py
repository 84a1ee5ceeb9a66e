"""Draw ``bench/results.png`` from ``bench/results.json`` (run with the tools venv).

bench/.venv-tools/bin/python bench/chart.py bench/results.json bench/results.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def draw(results: dict[str, object], path: Path) -> None:
    """Requests/s and p50 latency per workload, one bar per target (log scales)."""
    cells: list[dict[str, object]] = results["cells"]  # type: ignore[assignment]
    groups = list(dict.fromkeys((str(c["workload"]), int(c["concurrency"])) for c in cells))  # type: ignore[call-overload]
    targets = list(dict.fromkeys(str(c["target"]) for c in cells))
    by_key = {(c["target"], c["workload"], c["concurrency"]): c for c in cells}
    figure, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    width = 0.8 / len(targets)
    for axis, field, label in (
        (axes[0], "rps", "requests/s (log scale, higher is better)"),
        (axes[1], "p50_ms", "p50 latency, ms (log scale, lower is better)"),
    ):
        for offset, target in enumerate(targets):
            # NaN where a target has no such workload (an endpoint that does not stream).
            values = [
                float(by_key[(target, w, c)][field]) if (target, w, c) in by_key else float("nan")  # type: ignore[arg-type]
                for w, c in groups
            ]
            positions = [i + offset * width for i in range(len(groups))]
            bars = axis.bar(positions, values, width, label=target)
            labels = [
                "" if v != v else f"{v:,.0f}" if v >= 10 else f"{v:.2g}"  # v != v: NaN
                for v in values
            ]
            axis.bar_label(bars, labels=labels, fontsize=6, rotation=90, padding=2)
        axis.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))])
        axis.set_xticklabels([f"{w}\nconcurrency {c}" for w, c in groups], fontsize=8)
        axis.set_yscale("log")
        axis.set_title(label, fontsize=10)
        axis.margins(y=0.25)
    handles, names = axes[0].get_legend_handles_labels()
    figure.legend(handles, names, loc="lower center", ncol=len(targets), fontsize=8)
    figure.suptitle(str(results.get("title", "")), fontsize=10)
    figure.tight_layout(rect=(0, 0.06, 1, 1))
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    draw(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
