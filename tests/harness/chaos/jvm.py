"""Faster Spark driver start-up for fault runs: a class-data-sharing archive of Spark's JVM.

Fault runs restart the Spark driver dozens of times, and on a small machine each start
is mostly the JVM loading, verifying and compiling Spark's classes (~13 s on an idle
2-core machine). A dynamic CDS archive (JDK 13+) of the classes a driver loads, plus the
C1-only JIT, brings that to ~5 s (measured: 13.1 s → 5.1–5.8 s). The archive is built
once per machine by one ordinary driver run with ``-XX:ArchiveClassesAtExit`` and then
handed to every fault-run driver through ``PYSPARK_SUBMIT_ARGS``.

A test's standalone cluster starts its master, workers (``SPARK_DAEMON_JAVA_OPTS``) and
executors (``java_env(executors=True)``) with the same options.

The archive changes nothing a driver does, only how fast its JVM starts; the JVM checks
it against its own build and class path and ignores it on any mismatch. If the archive
cannot be built, drivers start without it.

Usage::

    env = dict(os.environ, **submit_env())   # builds the archive on first use (~35 s)
    subprocess.Popen([sys.executable, "-m", "tests.harness.chaos.pipeline", ...], env=env)
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import subprocess
import sys
from pathlib import Path

from tests.harness.services import default_home

SUBMIT_ARGS = "PYSPARK_SUBMIT_ARGS"
# C1 only: a driver of a fault run lives seconds to minutes; C2 compiles cost more CPU
# than they save, CPU the other drivers booting on the same cores need.
_FAST_START = "-XX:TieredStopAtLevel=1 -Xlog:cds=off -Xlog:cds+dynamic=off"
_DUMP_TIMEOUT = 300.0
#: The folder whose ``sitecustomize`` starts the drivers' Python workers faster.
WORKER_SITE = Path(__file__).with_name("worker_site")


def archive_path(home: Path | None = None) -> Path:
    """Where this Spark + JDK's archive lives (a new build of either gets a new file)."""
    return (home or default_home()) / "spark-cds" / f"driver-{_build_key()}.jsa"


@functools.cache
def _build_key() -> str:
    """Spark's version and location and the JDK's build (asked once per process)."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    key = hashlib.sha256(f"{pyspark.__version__}|{pyspark.__file__}|{java}".encode())
    return key.hexdigest()[:16]


def ensure_archive(home: Path | None = None, quiet: bool = True) -> Path | None:
    """The archive, built first if missing; None if it could not be built.

    Concurrent callers (several fault runs at once) wait for one build; a failed build
    is not tried again (delete the ``.failed`` file next to the archive to retry).
    ``quiet=False`` says so on stdout before a build starts.
    """
    path = archive_path(home)
    failed = path.with_suffix(".failed")
    if not path.exists() and not failed.exists():
        if not quiet:
            print("preparing fast Spark driver start-up (once per machine, ~30 s)", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists() and not failed.exists() and not _build(path):
                failed.touch()
    return path if path.exists() else None


def submit_env(home: Path | None = None) -> dict[str, str]:
    """The environment of a fast-starting driver: :func:`java_env`, and
    :mod:`~tests.harness.chaos.worker_site` first on ``PYTHONPATH`` for its Python
    workers."""
    return {"PYTHONPATH": worker_pythonpath()} | java_env(home)


def java_env(home: Path | None = None, executors: bool = False) -> dict[str, str]:
    """``PYSPARK_SUBMIT_ARGS`` for a fast-starting driver JVM (none where one is set);
    ``executors``: a cluster's executors start the same way."""
    if SUBMIT_ARGS in os.environ:
        return {}
    return _submit_args(fast_java_options(home), executors)


def fast_java_options(home: Path | None = None) -> str:
    """The options of a fast-starting Spark JVM: C1 only, and the archive if there is one
    (a JVM whose class path differs from the archive's ignores it)."""
    archive = ensure_archive(home)
    return _FAST_START + (f" -XX:SharedArchiveFile={archive}" if archive else "")


def worker_pythonpath() -> str:
    """This process's ``PYTHONPATH`` with :data:`WORKER_SITE` first: a driver started with
    it gives its Python workers the faster start-up of ``worker_site.sitecustomize``."""
    paths = [str(WORKER_SITE), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    return os.pathsep.join(dict.fromkeys(filter(None, paths)))


def _submit_args(java_options: str, executors: bool = False) -> dict[str, str]:
    executor = f'--conf "spark.executor.extraJavaOptions={java_options}" ' if executors else ""
    return {SUBMIT_ARGS: f'--driver-java-options "{java_options}" {executor}pyspark-shell'}


def _build(path: Path) -> bool:
    """One driver run that loads what a pipeline driver loads, then dumps at JVM exit."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    env = dict(os.environ, **_submit_args(f"{_FAST_START} -XX:ArchiveClassesAtExit={partial}"),
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    try:
        subprocess.run([sys.executable, "-m", "tests.harness.chaos.jvm", "--workload"], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=_DUMP_TIMEOUT, check=True)
        if partial.exists() and partial.stat().st_size > 0:
            partial.rename(path)
    except (subprocess.SubprocessError, OSError):
        pass  # drivers start without the archive
    finally:
        partial.unlink(missing_ok=True)
    return path.exists()


def _workload() -> None:
    """Session, mapInArrow (into a Python data source where PySpark has them) and a
    streaming JSON query."""
    import tempfile

    from tests.harness.chaos.pipeline import SCHEMA, WARM_UP_SOURCE, spark_session, warm_up_source
    from txsink.spark.versions import has_data_source

    spark = spark_session("local[2,3]", register=has_data_source())
    df = spark.range(4, numPartitions=2).mapInArrow(lambda it: it, "id long")
    if has_data_source():
        spark.dataSource.register(warm_up_source())
        df.write.format(WARM_UP_SOURCE).mode("append").save()
    else:
        df.collect()
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "source").mkdir()
        Path(tmp, "source", "0.json").write_text('{"id": 1}\n')
        stream = spark.readStream.schema(SCHEMA).json(f"{tmp}/source")
        query = (stream.writeStream.format("noop").trigger(availableNow=True)
                 .option("checkpointLocation", f"{tmp}/checkpoint").start())
        query.awaitTermination()
    spark.stop()
    # The archive is written when the JVM exits: end the gateway and wait for it.
    from pyspark import SparkContext

    gateway_proc = getattr(SparkContext._gateway, "proc", None)
    if gateway_proc is not None:
        gateway_proc.stdin.close()
        gateway_proc.wait(timeout=_DUMP_TIMEOUT)


if __name__ == "__main__" and sys.argv[1:] == ["--workload"]:
    _workload()
