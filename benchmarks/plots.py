"""PNG plots of a benchmark run, drawn from its JSON files alone.

Reads ``sink.json`` (``bench_sink.py``) and, when present, ``writer.json``,
``publish.json`` and ``coordinator.json`` (the component benchmarks), ``shards.json``
(``bench_shards.py``), ``partitions.json`` (``bench_partitions.py``), ``task_paths.json``
(``bench_task_paths.py``), ``views.json``/``views-modern.json`` (``bench_views.py``) and
``messages_<server>_<store>.json`` (``bench_messages.py``)
from one results directory and writes one small PNG per figure next to them. Plots never
measure anything: re-drawing a recorded run gives the same pictures.

    python benchmarks/plots.py [--results benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

RESULTS = Path(__file__).resolve().parent / "results"
DPI = 90
SIZE = (6.4, 3.6)
COLORS = {"noop": "#9e9e9e", "arrow_noop": "#616161", "plain": "#1f77b4",
          "client_driver": "#ff7f0e", "client_executor": "#d62728", "tx": "#2ca02c",
          "tx_pipelined": "#9467bd"}
LABELS = {"noop": 'format("noop")', "arrow_noop": "no-op Arrow writer",
          "plain": "clickhouse_plain", "client_driver": "foreachBatch+client (driver)",
          "client_executor": "foreachBatch+client (tasks)", "tx": "clickhouse_tx",
          "tx_pipelined": "clickhouse_tx, publish=pipelined"}
SHARD_COLORS = {"one_server": "#2ca02c", "two_shards_id": "#1f77b4",
                "two_shards_hash": "#9467bd"}
SERVER_COLORS = {"ch18": "#2ca02c", "ch26": "#9467bd"}
STEP_COLORS = {"begin": "#8c564b", "stage": "#1f77b4", "seal": "#17becf",
               "decision": "#d62728", "publish": "#2ca02c", "drop": "#bcbd22",
               "finish": "#9467bd", "other": "#c7c7c7"}


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _rows(experiment: list[dict], variant: str, key: str) -> tuple[list, list]:
    found = sorted((r[key], r["rows_per_s"] / 1e6) for r in experiment
                   if r["variant"] == variant and r.get("rows_per_s"))
    return [k for k, _ in found], [v for _, v in found]


def baselines(sink: dict, out: Path) -> Path | None:
    rows = sink["experiments"].get("baselines")
    if not rows:
        return None
    rows = [r for r in rows if r.get("rows_per_s")]
    fig, ax = plt.subplots(figsize=SIZE)
    names = [r["variant"] for r in rows]
    values = [r["rows_per_s"] / 1e6 for r in rows]
    bars = ax.barh([LABELS[n] for n in names], values, color=[COLORS[n] for n in names])
    for bar, row in zip(bars, rows, strict=True):
        ratio = row["paired_ratio"].get("plain")
        note = f"{bar.get_width():.2f}" + (f"  ({ratio:.2f}×)" if ratio else "")
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + note,
                va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(values) * 1.4)
    ax.set_xlabel("million rows/s (median)")
    ax.set_title(f"{rows[0]['rows']:,} rows, {rows[0]['partitions']} partitions, local[2]\n"
                 "(n×) = paired ratio to clickhouse_plain", fontsize=9)
    return _save(fig, out / "baselines.png")


def _round_ratios(rows: list[dict], key: str, x: object, base: str) -> list[float]:
    """tx ÷ ``base`` rows/s in each round (the same round's two measurements)."""
    pick = {r["variant"]: r for r in rows if r[key] == x}
    if "tx" not in pick or base not in pick:
        return []
    return [b["seconds"] / t["seconds"] for t, b in zip(pick["tx"]["runs"], pick[base]["runs"],
                                                        strict=True)
            if t["seconds"] and b["seconds"]]


def _throughput_lines(sink: dict, experiment: str, key: str, variants: tuple[str, ...],
                      xlabel: str, title: str, out: Path, log_x: bool = False) -> Path | None:
    """Left: median rows/s per variant. Right: tx ÷ plain in every round, and the median."""
    rows = sink["experiments"].get(experiment)
    if not rows:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.6, 3.4),
                                      gridspec_kw={"width_ratios": [3, 2]})
    for variant in variants:
        xs, ys = _rows(rows, variant, key)
        if xs:
            left.plot(xs, ys, marker="o", label=LABELS[variant], color=COLORS[variant])
    xs = sorted({r[key] for r in rows})
    for x in xs:
        ratios = _round_ratios(rows, key, x, "plain")
        right.scatter([x] * len(ratios), ratios, color=COLORS["tx"], alpha=0.45, s=14)
    medians = [(x, r["paired_ratio"]["plain"]) for x in xs for r in rows
               if r[key] == x and r["variant"] == "tx" and "plain" in r["paired_ratio"]]
    if medians:
        right.plot(*zip(*medians, strict=True), color=COLORS["tx"], marker="_",
                   markersize=14, label="median")
    right.axhline(1.0, color="black", linewidth=0.6)
    right.axhline(0.9, color="black", linewidth=0.6, linestyle="--")
    right.set_title("tx ÷ plain per round (dashed: 0.9)", fontsize=9)
    right.set_ylim(bottom=0)
    for ax in (left, right):
        if log_x:
            ax.set_xscale("log")
        else:
            ax.set_xticks(xs)
        ax.set_xlabel(xlabel, fontsize=8)
    left.set_ylim(bottom=0)
    left.set_ylabel("million rows/s (median)")
    left.set_title(title, fontsize=10)
    left.legend(fontsize=7)
    return _save(fig, out / f"{experiment}.png")


def streaming(sink: dict, out: Path) -> Path | None:
    rows = [r for r in sink["experiments"].get("streaming", []) if r.get("total_s")]
    if not rows:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.6, 3.4))
    for name in dict.fromkeys(r["sink"] for r in rows):
        mine = sorted((r for r in rows if r["sink"] == name), key=lambda r: r["trigger_s"])
        triggers = [r["trigger_s"] for r in mine]
        style = {"marker": "o", "color": COLORS[name], "label": LABELS[name]}
        left.plot(triggers, [r["total_s"] for r in mine], **style)
        right.plot(triggers, [r["latency_mean_s"] for r in mine], **style)
        right.plot(triggers, [r["latency_max_s"] for r in mine], linestyle=":",
                   marker=".", color=COLORS[name])
    first = rows[0]
    left.set_title(f"total time, {first['rows']:,} rows at {first['rate']:,}/s", fontsize=10)
    left.set_ylabel("seconds")
    right.set_title("visibility latency (solid mean, dotted max)", fontsize=10)
    for ax in (left, right):
        ax.set_xlabel("trigger interval (s)")
        ax.set_ylim(bottom=0)
    left.legend(fontsize=7)
    return _save(fig, out / "streaming.png")


def breakdown(sink: dict, out: Path) -> Path | None:
    rows = sink["experiments"].get("breakdown")
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=SIZE)
    labels = [f"{r['branches']}b×{r['target_partitions']}p" for r in rows]
    bottom = [0.0] * len(rows)
    for step, color in STEP_COLORS.items():
        values = [r["steps_ms"][step] for r in rows]
        ax.bar(labels, values, bottom=bottom, color=color, label=step)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.bar(labels, [r["steps_ms"]["insert"] for r in rows], bottom=bottom, color="white",
           edgecolor="#555555", hatch="//", label="insert (data)")
    two_cores = [r.get("overhead_2cores_ms") for r in rows]
    if all(v is not None for v in two_cores):
        ax.scatter(labels, two_cores, marker="_", s=400, color="black", zorder=3,
                   label="overhead on 2 cores")
    ax.axhline(100, color="black", linestyle="--", linewidth=0.8)
    ax.text(len(rows) - 0.5, 102, "100 ms goal", ha="right", va="bottom", fontsize=8)
    ax.set_ylabel("ms per epoch (median)")
    ax.set_xlabel("branches (Spark partitions) × target partitions")
    ax.set_title(f"one epoch of {rows[0]['rows']:,} rows, steps run one after another",
                 fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, out / "breakdown.png")


def scaling(sink: dict, out: Path) -> Path | None:
    rows = sink["experiments"].get("scaling")
    if not rows:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.6, 3.4))
    fits = {f["variant"]: f for f in sink["experiments"].get("scaling_fit", []) if f}
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = sorted((r for r in rows if r["variant"] == variant and r.get("median_s")),
                      key=lambda r: r["rows"])
        if not mine:
            continue
        millions = [r["rows"] / 1e6 for r in mine]
        left.plot(millions, [r["median_s"] for r in mine], marker="o",
                  color=COLORS[variant], label=LABELS[variant])
        if variant in fits:
            fit = fits[variant]
            left.plot([0, max(millions)], [fit["fixed_s"], fit["fixed_s"]
                      + fit["seconds_per_million_rows"] * max(millions)],
                      linestyle=":", color=COLORS[variant], linewidth=0.8)
        right.plot(millions, [r["memory_peak"]["worker_max_mb"] for r in mine], marker="o",
                   color=COLORS[variant], label=LABELS[variant])
    tx = sorted((r for r in rows if r["variant"] == "tx"), key=lambda r: r["rows"])
    if tx:
        right.plot([r["rows"] / 1e6 for r in tx], [r["memory_peak"]["jvm_mb"] for r in tx],
                   marker="s", color="black", linestyle="--", label="driver JVM (run peak)")
    left.set_title("time vs rows (dotted: linear fit)", fontsize=10)
    left.set_ylabel("seconds (median)")
    right.set_title("peak RSS", fontsize=10)
    right.set_ylabel("MB (largest Python worker)")
    for ax in (left, right):
        ax.set_xlabel("million rows")
        ax.set_ylim(bottom=0)
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    return _save(fig, out / "scaling.png")


def shards(data: dict, out: Path) -> Path | None:
    """``bench_shards.py``: rows/s of 1 server and 2 shards (left), 2 shards ÷ 1 server in
    every round and the paired median (right)."""
    rows = [r for r in data.get("results", []) if r.get("rows_per_s")]
    if not rows:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.6, 3.4),
                                      gridspec_kw={"width_ratios": [3, 2]})
    partitions = sorted({r["partitions"] for r in rows})
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    width = 0.8 / len(variants)
    for i, variant in enumerate(variants):
        mine = {r["partitions"]: r for r in rows if r["variant"] == variant}
        xs = [j + (i - (len(variants) - 1) / 2) * width for j, p in enumerate(partitions)
              if p in mine]
        label = next(r["label"] for r in rows if r["variant"] == variant)
        left.bar(xs, [mine[p]["rows_per_s"] / 1e6 for p in partitions if p in mine], width,
                 label=label, color=SHARD_COLORS.get(variant))
        if variant == "one_server":
            continue
        for j, p in enumerate(partitions):
            if p not in mine:
                continue
            base = next((r for r in data["results"] if r["variant"] == "one_server"
                         and r["partitions"] == p), None)
            per_round = [b["seconds"] / t["seconds"]
                         for t, b in zip(mine[p]["runs"], base["runs"] if base else [],
                                         strict=False) if t["seconds"] and b["seconds"]]
            x = j + (i - (len(variants) - 1) / 2) * width
            right.scatter([x] * len(per_round), per_round, color=SHARD_COLORS.get(variant),
                          alpha=0.45, s=14)
            paired = mine[p]["paired_ratio"].get("one_server")
            if paired:
                right.scatter([x], [paired], marker="_", s=300,
                              color=SHARD_COLORS.get(variant))
    for ax in (left, right):
        ax.set_xticks(range(len(partitions)), [f"{p} partitions" for p in partitions])
        ax.set_xlim(-0.5, len(partitions) - 0.5)
        ax.set_ylim(bottom=0)
    right.set_ylim(top=max(right.get_ylim()[1] * 1.1, 1.2))
    right.axhline(1.0, color="black", linewidth=0.6)
    right.set_title("2 shards ÷ 1 server, each round\n(dots) and paired median (bars)",
                    fontsize=9)
    left.set_ylim(top=max(r["rows_per_s"] for r in rows) / 1e6 * 1.45)  # room for legend
    left.set_ylabel("million rows/s (median)")
    left.set_title(f"clickhouse_tx, {rows[0]['rows']:,} rows, local[2]\n"
                   "both shards on the same 2 cores", fontsize=9)
    left.legend(fontsize=7)
    return _save(fig, out / "shards.png")


def partitions(data: dict, out: Path) -> Path | None:
    """``bench_partitions.py``: tx commit_ms vs branches with the goal line (left), tx ÷
    plain wall time in every round and the paired median vs Spark partitions (right)."""
    rows = [r for r in data.get("results", []) if r.get("tx_s") or r.get("plain_s")]
    if not rows:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.6, 3.4))
    xs = sorted({r["partitions"] for r in rows})
    for server in dict.fromkeys(r["server"] for r in rows):
        mine = sorted((r for r in rows if r["server"] == server), key=lambda r: r["partitions"])
        color = SERVER_COLORS.get(server, "#7f7f7f")
        strategy = mine[0]["strategy"]
        for r in mine:
            branches = r["branches"] or r["partitions"]
            rounds = [c for c in r["commit_ms_rounds"] if c is not None]
            left.scatter([branches] * len(rounds), rounds, color=color, alpha=0.35, s=12)
            ratios = r["tx_over_plain_rounds"]
            right.scatter([r["partitions"]] * len(ratios), ratios, color=color, alpha=0.35,
                          s=12)
        commits = [((r["branches"] or r["partitions"]), r["commit_ms"]) for r in mine
                   if r["commit_ms"] is not None]
        if commits:
            left.plot(*zip(*commits, strict=True), marker="o", color=color,
                      label=f"{server} ({strategy})")
        paired = [(r["partitions"], r["tx_over_plain_paired"]) for r in mine
                  if r["tx_over_plain_paired"] is not None]
        if paired:
            right.plot(*zip(*paired, strict=True), marker="o", color=color,
                       label=f"{server} median")
    goal_x = [min(xs), max(xs)]
    grid = [min(xs) * (max(xs) / min(xs)) ** (i / 40) for i in range(41)]
    left.plot(grid, [100 + x for x in grid], color="black", linestyle="--", linewidth=0.8,
              label="goal 100 ms + 1 ms/branch")
    right.axhline(1.0, color="black", linewidth=0.6)
    right.axhline(1.15, color="black", linewidth=0.8, linestyle="--")
    right.text(goal_x[0], 1.16, "goal at 200: 1.15", fontsize=7, va="bottom")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
    left.set_yscale("log")
    left.set_xlabel("branches (= Spark partitions)", fontsize=8)
    left.set_ylabel("tx commit_ms (median; dots: rounds)", fontsize=8)
    left.set_title(f"driver commit, {rows[0]['rows']:,} rows over 4 days", fontsize=9)
    left.legend(fontsize=7)
    right.set_ylim(bottom=0)
    right.set_xlabel("Spark partitions (repartition(N))", fontsize=8)
    right.set_ylabel("tx ÷ plain wall time", fontsize=8)
    right.set_title("tx ÷ plain per round (dots), paired median", fontsize=9)
    right.legend(fontsize=7)
    return _save(fig, out / "partitions.png")


def streaming_partitions(data: dict, out: Path) -> Path | None:
    """``bench_streaming_partitions.py``: median micro-batch per server and sink, against
    the trigger interval and the floor (the no-op Python writer, same run)."""
    rows = [r for r in data.get("results", []) if r.get("trigger_ms_median")]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=SIZE)
    labels = [f"{r['server']} {r['sink']}" for r in rows]
    seconds = [r["trigger_ms_median"] / 1000 for r in rows]
    ax.bar(labels, seconds, color=[COLORS.get(r["sink"], "#7f7f7f") for r in rows])
    trigger = rows[0].get("trigger_s")
    if trigger:
        ax.axhline(trigger, color="black", linestyle="--", linewidth=0.8,
                   label=f"trigger {trigger:g} s")
    floor = (data.get("floor") or {}).get("median_ms")
    if floor:
        ax.axhline(floor / 1000, color=COLORS["arrow_noop"], linewidth=1.2,
                   label=f"floor: no-op Python writer {floor / 1000:.1f} s")
    ax.set_ylabel("micro-batch s (triggerExecution, median)", fontsize=8)
    partitions = rows[0].get("partitions", "")
    ax.set_title(f"{partitions}-partition micro-batches: keeping up means below the trigger",
                 fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, out / "streaming_partitions.png")


def task_paths(data: dict, out: Path) -> Path | None:
    """``bench_task_paths.py``: each (Spark path, task body)'s median task phases, stacked,
    beside its median job time."""
    rows = data.get("results", [])
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=SIZE)
    labels = [r["variant"] for r in rows]
    bottom = [0.0] * len(rows)
    for key, label, color in (("first_s", "until the first batch", "#bdbdbd"),
                              ("arrive_s", "batches arriving", "#6baed6"),
                              ("insert_s", "INSERT after the last batch", "#2ca02c")):
        values = [r[key] for r in rows]
        ax.bar(labels, values, bottom=bottom, color=color, label=label, width=0.5)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.scatter(labels, [r["median_s"] for r in rows], color="black", marker="_", s=600,
               label="whole job", zorder=3)
    ax.set_ylabel("seconds (median)", fontsize=8)
    ax.set_title(f"{data.get('rows', 0):,} rows, {data.get('partitions', '')} tasks: "
                 "Spark path (map / source) x task body (sink / connect)", fontsize=9)
    ax.set_ylim(0, 1.35 * max(max(bottom), *(r["median_s"] for r in rows)))
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    return _save(fig, out / "task_paths.png")


def views(data: dict, out: Path) -> Path | None:
    """``bench_views.py``: the 1M-row job with and without a materialized view (each
    round's seconds and the median), and the small epoch's metrics against the number of
    view tables, with the fitted line of ``commit_ms``."""
    job, epoch = data.get("job"), data.get("epoch")
    if not job or not epoch:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(SIZE[0] * 1.6, SIZE[1]))
    names = {"tx_view": "tx, 1 view", "plain_view": "plain, 1 view",
             "tx_noview": "tx, no view", "plain_noview": "plain, no view"}
    colors = {"tx_view": COLORS["tx"], "plain_view": COLORS["plain"], "tx_noview": "#98df8a",
              "plain_noview": "#aec7e8"}
    rows = job["results"]
    labels = [names[r["variant"]] for r in rows]
    left.bar(labels, [r["median_s"] for r in rows], width=0.5,
             color=[colors[r["variant"]] for r in rows])
    for label, r in zip(labels, rows, strict=True):
        left.scatter([label] * len(r["runs_s"]), r["runs_s"], color="black", s=8, zorder=3)
    ratio = job["ratios"]["tx_vs_plain"]["median"]
    left.set_ylabel("job seconds (bar: median, dots: rounds)", fontsize=8)
    left.set_title(f"{job['rows']:,} rows, {job['partitions']} tasks: tx ÷ plain {ratio} "
                   f"with the view (goal {job['goal_tx_vs_plain']})", fontsize=9)
    left.tick_params(axis="x", labelsize=7)
    counts = [r["views"] for r in epoch["results"]]
    for key, color in (("commit_ms", "#d62728"), ("stage_ms", "#1f77b4"),
                       ("seal_ms", "#17becf")):
        right.plot(counts, [r["metrics_median"].get(key) for r in epoch["results"]],
                   marker="o", color=color, label=key)
    fit = epoch["fit"]["commit_ms"]
    right.plot(counts, [fit["at_0_views_ms"] + fit["per_view_ms"] * n for n in counts],
               linestyle="--", color="#d62728", linewidth=0.8,
               label=f"fit: +{fit['per_view_ms']} ms per view")
    right.set_xticks(counts)
    right.set_xlabel("view tables the target feeds", fontsize=8)
    right.set_ylabel("ms (median)", fontsize=8)
    right.set_ylim(bottom=0)
    right.set_title(f"{epoch['rows']:,}-row epoch, {epoch['partitions']} tasks: "
                    "the sink's metrics", fontsize=9)
    right.legend(fontsize=7)
    fig.suptitle(f"materialized views, ClickHouse {data.get('server_version', '')}",
                 fontsize=9)
    return _save(fig, out / ("views-modern.png" if data.get("modern") else "views.png"))


def trigger_floor(data: dict, out: Path) -> Path | None:
    """``bench_trigger_floor.py``: per input rate, each sink's median micro-batch time as
    a share of its trigger interval; at or below 1 the interval is sustained."""
    results = [r for r in data.get("results", []) if r.get("trigger_ms_median")]
    if not results:
        return None
    rates = sorted({r["rate"] for r in results})
    fig, axes = plt.subplots(1, len(rates), figsize=(SIZE[0] * 0.8 * len(rates), SIZE[1]),
                             squeeze=False)
    for ax, rate in zip(axes[0], rates, strict=True):
        for sink in ("plain", "tx", "tx_pipelined"):
            points = sorted((r["trigger_s"], r["trigger_ms_median"] / (r["trigger_s"] * 1000))
                            for r in results if r["rate"] == rate and r["sink"] == sink)
            if points:
                ax.plot([t for t, _ in points], [s for _, s in points], marker="o",
                        color=COLORS[sink], label=LABELS[sink])
        floor = data.get("floors", {}).get(str(rate), {})
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xscale("log")
        triggers = sorted({r["trigger_s"] for r in results if r["rate"] == rate})
        ax.set_xticks(triggers, [f"{t:g}" for t in triggers])
        ax.minorticks_off()
        ax.set_xlabel("trigger interval, s", fontsize=8)
        ax.set_ylabel("median micro-batch ÷ interval", fontsize=8)
        ax.set_title(f"{rate:,} rows/s: smallest sustained " + ", ".join(
            f"{sink} {value if value is not None else 'none'} s"
            for sink, value in floor.items()), fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle(f"trigger interval floor, ClickHouse {data.get('server_version', '')}",
                 fontsize=9)
    modern = not data.get("server_version", "").startswith("18.")
    return _save(fig, out / ("trigger_floor-modern.png" if modern else "trigger_floor.png"))


def components(results: Path, out: Path) -> Path | None:
    """The three component benchmarks side by side, if their JSON is there."""
    loaded = {name: json.loads((results / f"{name}.json").read_text())
              for name in ("writer", "publish", "coordinator")
              if (results / f"{name}.json").exists()}
    if not loaded:
        return None
    fig, axes = plt.subplots(1, len(loaded), figsize=(3.3 * len(loaded), 3.3))
    axes = [axes] if len(loaded) == 1 else list(axes)
    for ax, (name, data) in zip(axes, loaded.items(), strict=True):
        DRAW[name](ax, data)
    return _save(fig, out / "components.png")


def _writer(ax, data: dict) -> None:
    rows = data["results"]
    labels = [f"{r['rows'] / 1e6:g}M" for r in rows]
    width = 0.38
    xs = range(len(rows))
    ax.bar([x - width / 2 for x in xs], [r["raw_rows_per_s"] / 1e6 for r in rows], width,
           label="raw Native POST", color="#9e9e9e")
    ax.bar([x + width / 2 for x in xs], [r["writer_rows_per_s"] / 1e6 for r in rows], width,
           label="BranchWriter", color=COLORS["tx"])
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("million rows/s")
    ax.set_title("writer vs raw insert", fontsize=9)
    ax.legend(fontsize=7)


def _publish(ax, data: dict) -> None:
    for strategy, report in data.items():
        rows = report["results"]
        ax.plot([r["partitions"] for r in rows], [r["total_ms"] for r in rows], marker="o",
                label=strategy)
    ax.set_xscale("log")
    ax.set_xlabel("partitions per epoch")
    ax.set_ylabel("ms (seal+publish+drop)")
    ax.set_title("publish per epoch", fontsize=9)
    ax.legend(fontsize=7)


def _coordinator(ax, data: dict) -> None:
    series = dict.fromkeys((r.get("store", "zookeeper"), r["mode"]) for r in data["results"])
    both = len({store for store, _ in series}) > 1
    for store, mode in series:
        rows = [r for r in data["results"]
                if r["mode"] == mode and r.get("store", "zookeeper") == store]
        ax.plot([r["branches"] for r in rows], [r["total_ms"] for r in rows], marker="o",
                label=f"{store} {mode}" if both else mode)
    ax.set_xscale("log")
    ax.set_xlabel("branches per epoch")
    ax.set_ylabel("ms (the coordinator only)")
    ax.set_title("coordinator per epoch", fontsize=9)
    ax.legend(fontsize=7)


DRAW: dict[str, Callable] = {"writer": _writer, "publish": _publish,
                             "coordinator": _coordinator}


MODERN_COLORS = {**COLORS, "connect_driver": "#e377c2", "connect_executor": "#8c564b"}
MODERN_LABELS = {**LABELS, "connect_driver": "foreachBatch+connect (driver)",
                 "connect_executor": "foreachBatch+connect (tasks)"}
#: tx ÷ baseline goals of the modern-server issue (None: shown, no goal).
MODERN_GOALS = {"plain": 0.9, "arrow_noop": 0.8, "connect_driver": 1.0,
                "connect_executor": 1.0, "client_driver": None, "client_executor": None}


def modern(sink: dict, out: Path) -> Path | None:
    """``bench_sink.py --modern``: rows/s of every variant at each epoch size (left), and
    tx ÷ each baseline in every round with its median and goal (right)."""
    rows = [r for r in sink["experiments"].get("modern", []) if r.get("rows_per_s")]
    if not rows:
        return None
    sizes = sorted({r["rows"] for r in rows})
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.4, 4.2),
                                      gridspec_kw={"width_ratios": [3, 2]})
    height = 0.8 / len(sizes)
    for k, size in enumerate(sizes):
        pick = {r["variant"]: r for r in rows if r["rows"] == size}
        ys = [i + (k - (len(sizes) - 1) / 2) * height for i in range(len(variants))]
        values = [pick[v]["rows_per_s"] / 1e6 if v in pick else 0 for v in variants]
        left.barh(ys, values, height=height * 0.95,
                  color=[MODERN_COLORS[v] for v in variants], alpha=1.0 - 0.45 * k,
                  label=f"{size / 1e6:g}M rows/epoch")
        for y, value in zip(ys, values, strict=True):
            if value:
                left.text(value, y, f" {value:.2f}", va="center", fontsize=7)
    left.set_yticks(range(len(variants)), [MODERN_LABELS[v] for v in variants], fontsize=8)
    left.invert_yaxis()
    left.set_xlim(0, max(r["rows_per_s"] for r in rows) / 1e6 * 1.25)
    left.set_xlabel("million rows/s (median)")
    left.legend(fontsize=7, loc="lower right")
    left.set_title(f"ClickHouse {sink.get('clickhouse', '')}, {rows[0]['partitions']} "
                   "partitions, local[2]", fontsize=9)
    bases = [b for b in MODERN_GOALS if any(r["variant"] == b for r in rows)]
    markers = "os^D"
    for i, base in enumerate(bases):
        for k, size in enumerate(sizes):
            ratios = _round_ratios([r for r in rows if r["rows"] == size], "rows", size, base)
            right.scatter([i + (k - (len(sizes) - 1) / 2) * 0.2] * len(ratios), ratios,
                          color=MODERN_COLORS[base], alpha=0.5, s=14,
                          marker=markers[k % len(markers)],
                          label=f"{size / 1e6:g}M rows" if i == 0 else None)
        medians = [r["paired_ratio"][base] for r in rows
                   if r["variant"] == "tx" and base in r["paired_ratio"]]
        if medians:
            right.plot([i - 0.3, i + 0.3], [statistics.median(medians)] * 2,
                       color="black", linewidth=1.6)
        if MODERN_GOALS[base]:
            right.plot([i - 0.4, i + 0.4], [MODERN_GOALS[base]] * 2, color="red",
                       linewidth=1, linestyle="--")
    right.axhline(1.0, color="black", linewidth=0.5)
    right.set_xticks(range(len(bases)), [b.replace("_", "\n", 1) for b in bases], fontsize=7)
    right.set_ylim(bottom=0)
    right.set_title("tx ÷ baseline per round\n(black: median, red dashed: goal)", fontsize=9)
    right.legend(fontsize=7)
    return _save(fig, out / "modern.png")


def messages(data: dict, out: Path) -> Path | None:
    """``bench_messages.py``: ZooKeeper requests (KeeperMap statements) and ClickHouse
    statements per steady epoch, per variant."""
    variants = data.get("variants") or {}
    if not variants:
        return None
    keepermap = data.get("store") == "keepermap"
    key = "coordinator_statements" if keepermap else "zk_requests"
    names = list(variants)
    steady = [variants[v]["steady"] for v in names]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=SIZE)
    ax.bar([i - 0.2 for i in x], [s[key] for s in steady], width=0.4,
           color=COLORS["tx"], label="KeeperMap statements" if keepermap
           else "ZooKeeper requests")
    ax.bar([i + 0.2 for i in x], [s["statements"] for s in steady], width=0.4,
           color=COLORS["plain"], label="ClickHouse statements")
    ax.set_xticks(list(x), names, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("messages per epoch (steady)", fontsize=8)
    ax.set_title(f"{data.get('rows', 0):,}-row epochs of {data.get('tasks')} tasks over "
                 f"{data.get('target_partitions')} partitions, {data.get('server')}, "
                 f"store {data.get('store')}"
                 + (", rows carried" if data.get("carry_max_bytes") else ""), fontsize=9)
    ax.legend(fontsize=7)
    carried = "_carried" if data.get("carry_max_bytes") else ""
    name = f"messages_{data.get('server')}_{data.get('store')}{carried}.png"
    return _save(fig, out / name)


def draw_all(results: Path) -> list[Path]:
    """Every plot whose data is in ``results``; returns the files written."""
    written: list[Path | None] = [components(results, results)]
    sink_file = results / "sink.json"
    if sink_file.exists():
        sink = json.loads(sink_file.read_text())
        written += [
            baselines(sink, results),
            _throughput_lines(sink, "writers", "partitions", ("arrow_noop", "plain", "tx"),
                              "Spark partitions (2 cores)",
                              "throughput vs writers", results),
            _throughput_lines(sink, "epoch_size", "rows", ("plain", "tx"),
                              "rows per epoch (= per job)",
                              "throughput vs rows per transaction", results, log_x=True),
            _throughput_lines(sink, "block_rows", "insert_block_rows", ("plain", "tx"),
                              "insert_block_rows", "throughput vs insert block", results,
                              log_x=True),
            streaming(sink, results),
            breakdown(sink, results),
            scaling(sink, results),
        ]
    shards_file = results / "shards.json"
    if shards_file.exists():
        written.append(shards(json.loads(shards_file.read_text()), results))
    streaming_file = results / "streaming_partitions.json"
    if streaming_file.exists():
        written.append(streaming_partitions(json.loads(streaming_file.read_text()), results))
    task_paths_file = results / "task_paths.json"
    if task_paths_file.exists():
        written.append(task_paths(json.loads(task_paths_file.read_text()), results))
    for name in ("trigger_floor.json", "trigger_floor-modern.json"):
        if (results / name).exists():
            written.append(trigger_floor(json.loads((results / name).read_text()), results))
    for name in ("views.json", "views-modern.json"):
        if (results / name).exists():
            written.append(views(json.loads((results / name).read_text()), results))
    for path in sorted(results.glob("messages_*.json")):
        written.append(messages(json.loads(path.read_text()), results))
    partitions_file = results / "partitions.json"
    if partitions_file.exists():
        written.append(partitions(json.loads(partitions_file.read_text()), results))
    return [p for p in written if p is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    for path in draw_all(args.results):
        print(f"written {path} ({path.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
