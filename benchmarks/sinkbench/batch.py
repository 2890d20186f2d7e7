"""The batch experiments: one Spark job per measurement, one xid per job for ``tx``.

- :func:`baselines` — every variant on the same rows: the headline ratios;
- :func:`modern` — the same on the modern server (26.x), with the clickhouse-connect
  baselines, at one or more epoch sizes of >= 1M rows;
- :func:`writers` — throughput vs concurrent writers (Spark partitions), with and without
  transactions (Alibaba's first experiment);
- :func:`epoch_size` — throughput vs rows per transaction (Alibaba's second);
- :func:`block_rows` — the ``insert_block_rows`` option at a fixed epoch size;
- :func:`overhead` — the whole-job cost of the protocol on a tiny epoch (``tx`` − ``plain``);
- :func:`scaling` — time vs rows, and peak memory, to show the cost is linear.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from sinkbench.rounds import Bench, Case

ALL_VARIANTS = ("noop", "arrow_noop", "plain", "client_driver", "client_executor",
                "connect_driver", "connect_executor", "tx")


def baselines(bench: Bench, rows: int, partitions: int, rounds: int,
              variants: Sequence[str] = ALL_VARIANTS) -> list[dict]:
    return bench.rounds("baselines", [Case(rows, partitions)], variants, rounds)


def modern(bench: Bench, sizes: Sequence[int], partitions: int, rounds: int,
           variants: Sequence[str] = ALL_VARIANTS) -> list[dict]:
    """Every variant at each epoch size, interleaved in the same rounds."""
    cases = [Case(rows, partitions) for rows in sizes]
    return bench.rounds("modern", cases, variants, rounds)


def writers(bench: Bench, rows: int, partition_counts: Sequence[int], rounds: int
            ) -> list[dict]:
    cases = [Case(rows, p) for p in partition_counts]
    return bench.rounds("writers", cases, ("arrow_noop", "plain", "tx"), rounds)


def epoch_size(bench: Bench, sizes: Sequence[int], partitions: int, rounds: int
               ) -> list[dict]:
    cases = [Case(rows, partitions) for rows in sizes]
    return bench.rounds("epoch_size", cases, ("plain", "tx"), rounds)


def block_rows(bench: Bench, rows: int, partitions: int, blocks: Sequence[int], rounds: int
               ) -> list[dict]:
    cases = [Case(rows, partitions, block) for block in blocks]
    return bench.rounds("block_rows", cases, ("plain", "tx"), rounds)


def overhead(bench: Bench, rows: int, partition_counts: Sequence[int], rounds: int
             ) -> list[dict]:
    """Per-job cost of ``tx`` over ``plain`` when there is almost no data to move."""
    cases = [Case(rows, p) for p in partition_counts]
    summary = bench.rounds("overhead", cases, ("plain", "tx"), rounds)
    out = []
    for p in partition_counts:
        plain, tx = (next(r for r in summary if r["partitions"] == p and r["variant"] == v)
                     for v in ("plain", "tx"))
        paired = [(t["seconds"] - b["seconds"]) * 1000
                  for t, b in zip(tx["runs"], plain["runs"], strict=True)
                  if t["seconds"] and b["seconds"]]
        out.append({
            "rows": rows, "partitions": p, "plain_ms": _ms(plain["median_s"]),
            "tx_ms": _ms(tx["median_s"]),
            "overhead_ms": round(statistics.median(paired), 1) if paired else None,
            "load_range": [min(plain["load_range"][0], tx["load_range"][0]),
                           max(plain["load_range"][1], tx["load_range"][1])],
        })
    return summary + [{"variant": "tx-plain", **row} for row in out]


def scaling(bench: Bench, sizes: Sequence[int], partitions: int, rounds: int) -> list[dict]:
    """``plain`` and ``tx`` only: the no-op ceiling is in :func:`baselines`, and the
    largest size is the costliest measurement of the suite."""
    cases = [Case(rows, partitions) for rows in sizes]
    return bench.rounds("scaling", cases, ("plain", "tx"), rounds)


def linear_fit(summary: list[dict], variant: str) -> dict | None:
    """Least-squares ``seconds = fixed + per_million * rows / 1e6`` over the sizes.

    Two sizes fit any line exactly, so the residual (how far from linear the worst size
    is) is only given from three sizes on (``--huge``).
    """
    points = [(r["rows"] / 1e6, r["median_s"]) for r in summary
              if r["variant"] == variant and r["median_s"]]
    if len(points) < 2:
        return None
    xs, ys = zip(*points, strict=True)
    slope, intercept = statistics.linear_regression(xs, ys)
    worst = max(abs(y - (intercept + slope * x)) / y for x, y in points)
    return {"variant": variant, "fixed_s": round(intercept, 3),
            "seconds_per_million_rows": round(slope, 3), "worst_relative_residual":
            round(worst, 3) if len(points) > 2 else None}


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1000, 1) if seconds else None
