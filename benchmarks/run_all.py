"""The whole benchmark suite in one command: components, the Spark sink, plots.

Runs, one after another (never two at once: the machine has 2 cores), each in its own
process so one's memory or failure cannot disturb the next:

1. ``bench_writer.py`` — BranchWriter vs a raw Native POST;
2. ``bench_publish.py`` — seal + publish + drop per epoch (both 18.16 strategies);
3. ``bench_coordinator.py`` — ZooKeeper cost per epoch;
4. ``bench_sink.py`` — the sink against its baselines in Spark;
5. ``bench_shards.py`` — the sink into one server vs 2 shards (starts and stops its own
   2 x 1 layout of ClickHouse servers, HTTP 29511 and 29521);
6. ``bench_partitions.py`` — ``tx`` vs ``plain`` by Spark partitions (2 to 1000): wall
   time, commit_ms, parts created (issue 14); also on the modern server if it runs;
7. ``plots.py`` — PNGs of all of the above.

Every JSON and PNG goes into ``--out`` (``benchmarks/results`` by default; ``--quick``
writes to ``benchmarks/results/quick`` so a smoke run never overwrites a recorded one),
with ``suite.json`` saying how long each step took and the load average around it.

    python benchmarks/run_all.py           # ~15 minutes (17 at load 8) + ~7 for the shards
                                           # + ~40 for the partitions (both servers, load 5-9)
    python benchmarks/run_all.py --quick   # smoke run, ~2 minutes on a quiet machine + ~2.5
                                           # + ~3 for the partitions
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import plots

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

#: name -> (module, its RESULTS file name, full-run arguments, quick-run arguments)
COMPONENTS: dict[str, tuple[str, str, list[str], list[str]]] = {
    "writer": ("bench_writer", "writer.json",
               ["--rows", "1000000", "10000000", "--repeat", "3"],
               ["--rows", "200000", "--repeat", "1"]),
    "publish (attach_marked)": ("bench_publish", "publish.json",
                                ["--epochs", "7", "--strategy", "attach_marked"],
                                ["--epochs", "2", "--strategy", "attach_marked"]),
    "publish (attach_replicated)": ("bench_publish", "publish.json",
                                    ["--epochs", "7", "--strategy", "attach_replicated"],
                                    []),
    "coordinator": ("bench_coordinator", "coordinator.json", ["--epochs", "30"],
                    ["--epochs", "3"]),
}


def load() -> float:
    return round(os.getloadavg()[0], 2)


def component_command(module: str, output: Path, args: list[str]) -> list[str]:
    """Run a component benchmark with its ``RESULTS`` path pointed into ``output``."""
    code = (f"import sys; from pathlib import Path; import {module} as bench; "
            f"bench.RESULTS = Path({str(output)!r}); "
            f"sys.argv = [{module + '.py'!r}, *{args!r}]; bench.main()")
    return [sys.executable, "-c", code]


def step(name: str, command: list[str], log: list[dict]) -> bool:
    print(f"\n=== {name}  (load {load():.1f})", flush=True)
    started, load_start = time.time(), load()
    code = subprocess.call(command, cwd=HERE)
    log.append({"step": name, "seconds": round(time.time() - started, 1),
                "load_start": load_start, "load_end": load(), "returncode": code})
    if code:
        print(f"=== {name} FAILED with exit code {code}", flush=True)
    return code == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run, about 2 minutes")
    parser.add_argument("--huge", action="store_true", help="add 50M rows to the scaling run")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    started, log = time.time(), []
    ok = True
    for name, (module, filename, full, quick) in COMPONENTS.items():
        arguments = quick if args.quick else full
        if args.quick and not arguments:
            continue  # left out of the smoke run
        ok &= step(name, component_command(module, out / filename, arguments), log)
    sink = [sys.executable, str(HERE / "bench_sink.py"), "--out", str(out)]
    sink += ["--quick"] if args.quick else []
    sink += ["--huge"] if args.huge else []
    ok &= step("sink", sink, log)
    shards = [sys.executable, str(HERE / "bench_shards.py"), "--out", str(out)]
    shards += ["--quick"] if args.quick else []
    ok &= step("shards", shards, log)
    partitions = [sys.executable, str(HERE / "bench_partitions.py"), "--out", str(out)]
    partitions += ["--quick"] if args.quick else []
    ok &= step("partitions", partitions, log)
    print("\n=== plots", flush=True)
    for path in plots.draw_all(out):
        print(f"written {path} ({path.stat().st_size // 1024} KB)")
    total = round(time.time() - started, 1)
    (out / "suite.json").write_text(json.dumps(
        {"command": " ".join(["python", *sys.argv]), "quick": args.quick, "seconds": total,
         "steps": log}, indent=1) + "\n")
    print(f"\nsuite finished in {total:.0f} s: "
          + ", ".join(f"{s['step']} {s['seconds']:.0f} s" for s in log))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
