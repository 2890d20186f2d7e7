"""Coordinator overhead per epoch: begin + N branch registrations + prepare + commit.

What it measures: the ZooKeeper cost the protocol adds to one epoch, with no-op publish
and rollback callbacks (so nothing but coordination is timed), for N = 1, 8, 64 branches.
Two ways of driving the branches:

- ``shared``: one Coordinator does everything (its cached xid record saves a read per
  call) — the lower bound;
- ``per_task``: every branch goes through its own Coordinator instance doing
  ``begin`` + ``register_branch`` + ``prepare_branch``, as a Spark task does, the tasks
  one after another (an upper bound on the tasks' share);
- ``parallel``: the same per-task calls from 8 threads at once, as 8 executor cores
  would run them (ZooKeeper batches the concurrent writes into fewer disk syncs).

Each branch costs two ZooKeeper writes (register, prepare) and one pipelined read at
commit, so the per-branch figure is bounded below by two synced writes; the benchmark
prints that floor (a bare 3-op multi) so the numbers can be read on a busy machine.

Goal: at most 20 ms + 2 ms per branch. With ``--keepermap URL`` the same epochs run on
the KeeperMap store too (``coordinator=keepermap``: the records table
``txsink_bench.records`` on that modern server, created if missing), interleaved with the
ZooKeeper ones, so that both stores are measured under the same load. Prints a table;
writes ``benchmarks/results/coordinator.json``.

    python benchmarks/bench_coordinator.py [--epochs 30] [--zookeeper 127.0.0.1:2181]
        [--keepermap http://127.0.0.1:8124]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kazoo.client import KazooClient

from coordinator import BranchRecord, Coordinator
from coordinator.plumbing.nodes import NodeStore

BRANCH_COUNTS = (1, 8, 64)
MODES = ("shared", "per_task", "parallel")
TASK_THREADS = 8
RESULTS = Path(__file__).parent / "results" / "coordinator.json"


def noop(_: BranchRecord) -> None:
    return None


def manifest(branch: int) -> dict:
    """A manifest of realistic size (~400 bytes: a few partitions with their parts)."""
    return {"rows": 10_000, "strategy": "attach_marked", "staging": f"stg_{branch:04d}",
            "manifest": {"partitions": [{"id": f"2026{m:02d}", "rows": 2500,
                                         "parts": [f"2026{m:02d}_1_1_0"]} for m in range(4)]}}


def run_task(client: NodeStore, sink: str, root: str, epoch: int, generation: int,
             b: int, coord: Coordinator | None) -> str:
    """What one Spark task does; ``coord`` given means "reuse the driver's instance"."""
    task = coord or Coordinator(client, sink, root=root)
    if coord is None:
        task.begin(epoch, generation)
    branch_id = f"p{b}-a0-{uuid.uuid4().hex[:8]}"
    task.register_branch(epoch, branch_id, generation, owner={"staging": f"stg_{b}"})
    task.prepare_branch(epoch, branch_id, manifest(b))
    return branch_id


def one_epoch(coord: Coordinator, client: NodeStore, sink: str, root: str, epoch: int,
              generation: int, branches: int, mode: str, pool: ThreadPoolExecutor
              ) -> dict[str, float]:
    started = time.perf_counter()
    coord.begin(epoch, generation)
    begun = time.perf_counter()
    if mode == "parallel":
        ids = list(pool.map(lambda b: run_task(client, sink, root, epoch, generation, b, None),
                            range(branches)))
    else:
        shared = coord if mode == "shared" else None
        ids = [run_task(client, sink, root, epoch, generation, b, shared)
               for b in range(branches)]
    staged = time.perf_counter()
    coord.commit(epoch, generation, ids, publish=noop, rollback=noop)
    done = time.perf_counter()
    return {"total_ms": (done - started) * 1000, "begin_ms": (begun - started) * 1000,
            "branches_ms": (staged - begun) * 1000, "commit_ms": (done - staged) * 1000}


def floor_sample(client: NodeStore, root: str, i: int) -> float:
    """One bare 3-op multi (check, check, create): the cost of one synced write."""
    floor = f"{root}/sinks/floor"
    started = time.perf_counter()
    tx = client.transaction()
    tx.check(floor, 0)
    tx.check(floor, 0)
    tx.create(f"{floor}/n{i}", b"x" * 200)
    tx.commit()
    return (time.perf_counter() - started) * 1000


def measure(stores: dict[str, NodeStore], root: str, epochs: int, pool: ThreadPoolExecutor
            ) -> tuple[list[dict], dict[str, float]]:
    """Round-robin over every (store, mode, N) once per round, so that load from other
    processes on a shared machine hits every configuration alike; 3 warm-up rounds."""
    drivers = {}
    for store, client in stores.items():
        client.ensure_path(f"{root}/sinks/floor")
        for mode in MODES:
            for n in BRANCH_COUNTS:
                coord = Coordinator(client, f"bench-{n}-{mode}", root=root)
                drivers[(store, mode, n)] = (coord, coord.fence())
    samples: dict[tuple[str, str, int], list[dict[str, float]]] = {k: [] for k in drivers}
    floors: dict[str, list[float]] = {store: [] for store in stores}
    for i in range(epochs + 3):
        for store, client in stores.items():
            floors[store] += [floor_sample(client, root, i * 5 + j) for j in range(5)]
        for (store, mode, n), (coord, generation) in drivers.items():
            sample = one_epoch(coord, stores[store], coord.sink_id, root,
                               coord.allocate_epoch(), generation, n, mode, pool)
            if i >= 3:
                samples[(store, mode, n)].append(sample)
    return ([{"store": store, **summarize(mode, n, rows)}
             for (store, mode, n), rows in samples.items()],
            {store: round(statistics.median(f[15:]), 3) for store, f in floors.items()})


def summarize(mode: str, branches: int, samples: list[dict[str, float]]) -> dict:
    row: dict = {"branches": branches, "mode": mode}
    row.update({k: round(statistics.median(s[k] for s in samples), 2) for k in samples[0]})
    totals = sorted(s["total_ms"] for s in samples)
    row["p90_total_ms"] = round(totals[max(0, int(len(totals) * 0.9) - 1)], 2)
    row["goal_ms"] = 20 + 2 * branches
    row["meets_goal"] = row["total_ms"] <= row["goal_ms"]
    return row


def cost_model(results: list[dict], store: str, mode: str, floor: float) -> dict:
    """Fit total = fixed + per_branch * N through the smallest and largest N."""
    rows = {r["branches"]: r for r in results if r["mode"] == mode and r["store"] == store}
    low, high = min(rows), max(rows)
    per_branch = (rows[high]["total_ms"] - rows[low]["total_ms"]) / (high - low)
    return {"store": store, "mode": mode, "per_branch_ms": round(per_branch, 2),
            "per_branch_in_synced_writes": round(per_branch / floor, 2),
            "fixed_ms": round(rows[low]["total_ms"] - per_branch * low, 2)}


def open_stores(zookeeper: str, keepermap: str | None) -> dict[str, NodeStore]:
    client = KazooClient(hosts=zookeeper)
    client.start(timeout=15)
    stores: dict[str, NodeStore] = {"zookeeper": client}
    if keepermap:
        from coordinator.plumbing.keepermap import KeeperMapNodes
        from server_ext.client import ClickHouseClient
        from server_ext.ddl import KeeperMapTable

        table = KeeperMapTable(ClickHouseClient(keepermap), "txsink_bench", "records")
        table.create("/txsink_bench/records")
        stores["keepermap"] = KeeperMapNodes(table)
    return stores


def run(zookeeper: str, epochs: int, keepermap: str | None = None) -> dict:
    stores = open_stores(zookeeper, keepermap)
    root = f"/txsink-bench-{uuid.uuid4().hex[:8]}"
    pool = ThreadPoolExecutor(TASK_THREADS)
    try:
        results, floors = measure(stores, root, epochs, pool)
        for store, floor in floors.items():
            print(f"{store} floor: one multi-op write = {floor:.2f} ms (median)")
        for row in results:
            n = row["branches"]
            print(f"{row['store']:>9} {row['mode']:>8}  N={n:<3} median "
                  f"{row['total_ms']:7.1f} ms (begin {row['begin_ms']:.1f}, branches "
                  f"{row['branches_ms']:.1f}, commit {row['commit_ms']:.1f}; p90 "
                  f"{row['p90_total_ms']:.1f})  goal {row['goal_ms']} ms  "
                  f"{'ok' if row['meets_goal'] else 'MISSED'}")
        models = [cost_model(results, store, mode, floors[store])
                  for store in stores for mode in MODES]
        for m in models:
            print(f"{m['store']:>9} {m['mode']:>8}  fixed {m['fixed_ms']:.1f} ms (goal 20) + "
                  f"per branch {m['per_branch_ms']:.2f} ms (goal 2) = "
                  f"{m['per_branch_in_synced_writes']:.1f} writes")
    finally:
        pool.shutdown()
        for client in stores.values():
            client.delete(root, recursive=True)
            client.stop()
            client.close()
    return {"benchmark": "coordinator overhead per epoch (no-op callbacks)",
            "epochs": epochs, "machine": platform.platform(), "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
            "zookeeper_write_floor_ms": floors["zookeeper"], "write_floor_ms": floors,
            "task_threads": TASK_THREADS, "results": results, "cost_model": models}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--zookeeper", default="127.0.0.1:2181")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--keepermap", default=None,
                        help="also the KeeperMap store, on this modern ClickHouse")
    args = parser.parse_args()
    report = run(args.zookeeper, args.epochs, args.keepermap)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
