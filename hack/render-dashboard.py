#!/usr/bin/python3
# Draws the chart's Grafana dashboard (deploy/helm/hwdra/files/dashboard.json)
# from the data the real-node suite's Prometheus scenario keeps with
# HWDRA_E2E_ARTIFACTS set (dashboard-data.json: each panel's queries over
# the run, its variables set to the suite's node and namespace), with
# matplotlib (Debian's python3-matplotlib), in the dashboard's layout:
# every panel's title, kind, units and series are the dashboard's. Grafana
# itself is not built here (it is AGPL, and the project ships the JSON
# only), so this is a drawing of the panels' data, not a Grafana
# screenshot.
#
#   HWDRA_E2E_ARTIFACTS=/tmp/a flock /tmp/hwdra-e2e.lock hack/e2e-realnode.sh -run Prometheus
#   hack/render-dashboard.py /tmp/a/dashboard-data.json docs/images/dashboard.png
import json
import re
import sys
from datetime import datetime, timezone

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BG, PANEL, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
COLORS = ["#73bf69", "#f2cc0c", "#5794f2", "#ff780a", "#f2495c", "#b877d9", "#8ab8ff", "#fade2a"]
ROW_PX = 30  # Grafana's grid row height


def legend(fmt, metric):
    if not fmt:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__") + "}"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt).strip()


def scale(unit):
    """The factor and the suffix a panel's unit is drawn in."""
    return {
        "bytes": (1 / 2**30, "GiB"), "decmbytes": (1 / 1024, "GiB"), "percent": (1, "%"),
        "percentunit": (100, "%"), "watt": (1, "W"), "bps": (1e-9, "Gb/s"), "s": (1000, "ms"),
    }.get(unit, (1, ""))


def series(target):
    res = target["result"]
    return res if isinstance(res, list) else []


def draw_timeseries(ax, p, t0):
    defaults = (p.get("fieldConfig") or {}).get("defaults", {})
    unit = defaults.get("unit", "short")
    stacked = defaults.get("custom", {}).get("stacking", {}).get("mode") == "normal"
    factor, suffix = scale(unit)
    lines = []
    for tg in p["targets"]:
        for s in series(tg):
            xs = [(float(v[0]) - t0) / 60 for v in s["values"]]
            ys = [float(v[1]) * factor for v in s["values"]]
            lines.append((legend(tg.get("legendFormat"), s["metric"]), xs, ys))
    base = None
    for i, (name, xs, ys) in enumerate(lines):
        color = COLORS[i % len(COLORS)]
        if stacked:
            lo = base if base is not None and len(base) == len(ys) else [0] * len(ys)
            hi = [a + b for a, b in zip(lo, ys)]
            ax.fill_between(xs, lo, hi, color=color, alpha=0.35, linewidth=0)
            ax.plot(xs, hi, color=color, linewidth=1.2, label=name)
            base = hi
        else:
            ax.plot(xs, ys, color=color, linewidth=1.4, label=name)
    ax.set_facecolor(PANEL)
    ax.grid(color=GRID, linewidth=0.5)
    ax.tick_params(colors=TEXT, labelsize=6)
    for sp in ax.spines.values():
        sp.set_color(GRID)
    ax.set_xlabel("minutes", color=TEXT, fontsize=6)
    if suffix:
        ax.set_ylabel(suffix, color=TEXT, fontsize=6)
    if lines:
        ax.legend(fontsize=5.5, loc="upper left", facecolor=PANEL, edgecolor=GRID, labelcolor=TEXT, framealpha=0.8)
    else:
        ax.text(0.5, 0.5, "No data", color=TEXT, ha="center", va="center", transform=ax.transAxes, fontsize=9)


def last(s):
    return float(s["values"][-1][1]) if s.get("values") else None


def draw_stat(ax, p):
    ax.set_facecolor(PANEL)
    ax.axis("off")
    parts = []
    for tg in p["targets"]:
        for s in series(tg):
            v = last(s)
            if v is not None:
                parts.append((legend(tg.get("legendFormat") or " ", s["metric"]), v))
    text = "   ".join(f"{n} {v:g}" if n.strip() else f"{v:g}" for n, v in parts) or "No data"
    ax.text(0.5, 0.45, text, color="#73bf69", ha="center", va="center", fontsize=16, fontweight="bold", transform=ax.transAxes)


TABLE_COLUMNS = ["UUID", "type", "GPU_I_PROFILE", "GPU_I_ID", "sharing", "namespace", "pod", "claim", "device"]


def draw_table(ax, p):
    ax.set_facecolor(PANEL)
    ax.axis("off")
    rows = []
    for tg in p["targets"]:
        for s in series(tg):
            m = s["metric"]
            rows.append([m.get(c, "") if c != "UUID" else m.get(c, "")[:13] + "…" for c in TABLE_COLUMNS])
    rows.sort()
    if not rows:
        ax.text(0.5, 0.5, "No data", color=TEXT, ha="center", va="center", transform=ax.transAxes)
        return
    tb = ax.table(cellText=rows, colLabels=TABLE_COLUMNS, loc="upper center", cellLoc="left")
    tb.auto_set_font_size(False)
    tb.set_fontsize(6.5)
    tb.scale(1, 1.25)
    for (r, _), cell in tb.get_celld().items():
        cell.set_facecolor(PANEL if r else "#22252b")
        cell.set_edgecolor(GRID)
        cell.get_text().set_color(TEXT)


def main(data_file, out_file):
    with open(data_file) as f:
        data = json.load(f)
    t0 = datetime.fromisoformat(data["from"].replace("Z", "+00:00")).astimezone(timezone.utc).timestamp()
    panels = data["panels"]
    # A repeated panel's copies share its gridPos: lay them out as Grafana
    # does, side by side (two a row) and the panels below pushed down.
    groups = {}
    for p in panels:
        groups.setdefault((p["gridPos"]["x"], p["gridPos"]["y"]), []).append(p)
    placed, pushed = [], 0
    for (x0, y0), group in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        per_row = max(1, 24 // group[0]["gridPos"]["w"]) if len(group) > 1 else 1
        for i, p in enumerate(group):
            g = dict(p["gridPos"])
            g["x"] = x0 + (i % per_row) * g["w"]
            g["y"] = y0 + pushed + (i // per_row) * g["h"]
            placed.append((p, g))
        pushed += ((len(group) - 1) // per_row) * group[0]["gridPos"]["h"]
    height = max(g["y"] + g["h"] for _, g in placed)
    width_in, height_in = 16, height * ROW_PX / 100
    fig = plt.figure(figsize=(width_in, height_in), dpi=100, facecolor=BG)
    fig.suptitle(f"hwdra: GPUs by node, GPU and pod — node {data['node']}, namespace {data['namespace']} (real-node suite, drawn by hack/render-dashboard.py)",
                 color=TEXT, fontsize=9, x=0.01, ha="left", y=0.999)
    for p, g in placed:
        left, width = g["x"] / 24 + 0.004, g["w"] / 24 - 0.008
        top = 1 - g["y"] / height - 0.012
        h = g["h"] / height
        if p["type"] == "row":
            fig.text(left, top - 0.004, p["title"], color=TEXT, fontsize=10, fontweight="bold", va="top")
            continue
        inner = 0.65 * ROW_PX / (height * ROW_PX)
        ax = fig.add_axes([left + (0.03 if p["type"] == "timeseries" else 0), top - h + 0.01, width - (0.035 if p["type"] == "timeseries" else 0), h - inner - 0.012])
        fig.text(left, top - 0.002, p["title"], color=TEXT, fontsize=7.5, va="top")
        {"timeseries": lambda: draw_timeseries(ax, p, t0), "stat": lambda: draw_stat(ax, p), "table": lambda: draw_table(ax, p)}[p["type"]]()
    fig.savefig(out_file, facecolor=BG)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
