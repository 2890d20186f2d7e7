"""Where a benchmark runs: the Spark session, a scratch database, the machine's load.

The benchmark machine is shared and small (2 cores), so every figure is read next to the
load average at the time it was taken; :func:`load` is what each measurement records.
Each run gets its own ClickHouse database and ZooKeeper root, created and removed here
with plain HTTP and kazoo, so a run never touches anything but its own objects.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import requests
from kazoo.client import KazooClient

from server_ext.sql import quote_identifier, sql_string
from server_ext.staging import STAGING_DATABASE, sink_key

BENCHMARKS_DIR = Path(__file__).resolve().parent.parent

#: Arrow batch size handed to Python writers: Spark's default. 100,000 made no difference
#: beyond the noise here (docs/benchmarks.md); ``--arrow-batch-rows`` changes it.
ARROW_BATCH_ROWS = 10_000


def load() -> float:
    """The one-minute load average (2 cores: above 2 means waiting for a CPU)."""
    return round(os.getloadavg()[0], 2)


def cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``): Spark,
    its Python workers and the servers alike. On 2 cores a job's wall time follows the
    CPU it needs, so the difference across a job is a figure far steadier than seconds."""
    with open("/proc/stat") as stat:
        ticks = [int(v) for v in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def machine() -> dict[str, object]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "memory_gb": _memory_gb(),
    }


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        return None
    return None


def sql(url: str, statement: str, timeout: float = 120.0) -> str:
    """Run one statement over plain HTTP (setup and checks, never timed)."""
    resp = requests.post(url, data=statement.encode("utf-8"), timeout=timeout)
    body = resp.content.decode("utf-8")
    if resp.status_code != 200:
        raise RuntimeError(f"ClickHouse answered {resp.status_code}: {body.strip()[:300]}")
    return body


@dataclass(frozen=True)
class Scratch:
    """A run's own database and ZooKeeper root; :meth:`remove` drops both."""

    url: str
    zookeeper: str
    database: str
    zk_root: str

    @classmethod
    def create(cls, url: str, zookeeper: str) -> Scratch:
        run = uuid.uuid4().hex[:8]
        scratch = cls(url, zookeeper, f"bench_sink_{run}", f"/bench/sink-{run}")
        sql(url, f"CREATE DATABASE {quote_identifier(scratch.database)}")
        return scratch

    def table(self, name: str) -> str:
        return f"{self.database}.{name}"

    def remove(self) -> None:
        sql(self.url, f"DROP DATABASE IF EXISTS {quote_identifier(self.database)}")
        delete_zk_root(self.zookeeper, self.zk_root)


def delete_zk_root(hosts: str, root: str) -> None:
    """Remove a benchmark's ZooKeeper root and everything below it."""
    client = KazooClient(hosts=hosts)
    client.start(timeout=15)
    try:
        client.delete(root, recursive=True)
    finally:
        client.stop()
        client.close()


def staging_tables(url: str, sink_ids: set[str]) -> list[str]:
    """The staging tables of these sink ids on ``url`` (what a run's sinks left)."""
    if not sink_ids:
        return []
    prefixes = ", ".join(sql_string(f"txs_{sink_key(s)}_") for s in sorted(sink_ids))
    return sql(url, f"SELECT name FROM system.tables WHERE database = "
                    f"{sql_string(STAGING_DATABASE)} AND arrayExists(p -> startsWith(name, p), "
                    f"[{prefixes}])").split()


def start_spark(cores: int = 2, arrow_batch_rows: int = ARROW_BATCH_ROWS):
    """A local Spark session set up like the tests', with ``benchmarks/`` importable.

    Python data sources are unpickled by module name in Spark's Python workers, so the
    workers need ``benchmarks/`` on their ``PYTHONPATH`` to find
    :mod:`sinkbench.noop_source` and :mod:`sinkbench.client_baseline`; the JVM passes its
    environment on to them.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [str(BENCHMARKS_DIR), *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("txsink-benchmarks")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(arrow_batch_rows))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def spark_settings(spark) -> dict[str, str]:
    """The session settings a reader needs to compare figures (recorded with them)."""
    keys = ("spark.master", "spark.driver.memory", "spark.sql.execution.arrow.maxRecordsPerBatch",
            "spark.sql.execution.arrow.pyspark.enabled")
    conf = spark.sparkContext.getConf()
    return {key: conf.get(key, None) or spark.conf.get(key, "") for key in keys}


def run_record(benchmark: str, script: str, started: float, load_start: float,
               **fields: object) -> dict:
    """What every benchmark's JSON opens with (what ran, when, on what machine, at what
    load), then ``fields``."""
    return {"benchmark": benchmark, "started_at": time.strftime(
        "%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)), "duration_s": round(time.time() - started),
        "machine": machine(), "load_start": load_start, "load_end": load(),
        "command": " ".join(["python", f"benchmarks/{script}", *sys.argv[1:]]), **fields}


def write_result(output: Path, data: dict, plot: Callable[[dict, Path], Path | None]) -> str:
    """Write ``data`` to ``output`` and its plot beside it; the line saying so."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(data, indent=2) + "\n")
    picture = plot(data, output.parent)
    return (f"written {output}" + (f" and {picture}" if picture else "")
            + f" ({data['duration_s']} s)")
