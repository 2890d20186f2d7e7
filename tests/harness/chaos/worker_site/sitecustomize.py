"""Faster Python workers for the short-lived Spark drivers of fault runs and tests.

Python imports this module at start-up when its folder is on ``PYTHONPATH``, as it is for
the drivers :func:`tests.harness.chaos.jvm.submit_env` starts and so for their Python
workers. A driver of a fault run lives seconds to minutes, and each start launches a
PySpark daemon per worker kind (tasks; the data source planner's lookup, write and commit)
that forks the workers. Measured on the 2-core machine, two things made each start cost
~11 s of CPU in Python:

- Spark puts its own ``pyspark.zip`` first on the workers' path. Python caches no bytecode
  for a zip, so every daemon and worker compiled PySpark from source (~1 s of CPU each,
  against ~0.3 s from the installed package). Where the zip belongs to the installed
  ``pyspark`` (the same files), it is taken off the path.
- Each forked worker imported the sink (and a task's, pandas for PySpark's Arrow path) by
  itself. A daemon now imports its worker module and those before it forks, so its
  workers start with them.

Nothing here changes what runs; a module that fails to preload is imported by the worker
as before. Users' own Spark applications never see this folder.
"""

import os
import sys

#: Per worker module, what its workers import besides it (the lookup's needs nothing more).
_PRELOADED = {
    "pyspark.worker": ("txsink.spark.datasource", "pandas"),
    "pyspark.sql.worker.write_into_data_source": ("txsink.spark.datasource",),
    "pyspark.sql.worker.commit_data_source_write": ("txsink.spark.datasource",),
}


def _drop_spark_zips() -> None:
    for entry in sys.path:
        if entry.endswith(os.path.join("python", "lib", "pyspark.zip")):
            package = os.path.dirname(os.path.dirname(os.path.dirname(entry)))
            if os.path.isfile(os.path.join(package, "__init__.py")):
                lib = os.path.dirname(entry) + os.sep
                sys.path[:] = [p for p in sys.path if not p.startswith(lib)]
                if os.path.dirname(package) not in sys.path:
                    sys.path.append(os.path.dirname(package))
            return


def _preload_in_daemon() -> None:
    """In ``python -m pyspark.daemon <worker module>``: import what its workers will."""
    argv = getattr(sys, "orig_argv", [])
    if argv[1:3] != ["-m", "pyspark.daemon"]:
        return
    import importlib

    for name in (*argv[3:4], *_PRELOADED.get("".join(argv[3:4]), ())):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the worker imports it itself and reports
            pass


_drop_spark_zips()
_preload_in_daemon()
