"""Imported by every Python interpreter whose ``PYTHONPATH`` holds this directory:
``bench_partitions.py --trace-commit`` puts it there for its Spark workers only, and
sets ``TXSINK_BENCH_TRACE`` to the trace directory (see ``sinkbench/commit_trace.py``).
"""

import os
import sys

if os.environ.get("TXSINK_BENCH_TRACE"):
    try:
        from sinkbench import commit_trace

        commit_trace.install(os.environ["TXSINK_BENCH_TRACE"])
    except Exception as exc:  # noqa: BLE001 - a worker without tracing still works
        print(f"sinkbench commit trace not installed: {exc!r}", file=sys.stderr)
