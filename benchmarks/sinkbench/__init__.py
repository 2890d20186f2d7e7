"""Benchmarks of the ``clickhouse_tx`` Spark sink against its baselines.

Modules, one job each:

- :mod:`sinkbench.environment` — the Spark session, a scratch database, load average;
- :mod:`sinkbench.workload` — the benchmark rows (Spark and Arrow) and the target table;
- :mod:`sinkbench.noop_source` — the no-op Python Arrow writer (the Python ceiling);
- :mod:`sinkbench.client_baseline` — ``foreachBatch`` + clickhouse-driver, what users do
  today;
- :mod:`sinkbench.variants` — every way of writing a DataFrame that is compared;
- :mod:`sinkbench.memory` — peak RSS of the driver JVM and the Python workers;
- :mod:`sinkbench.rounds` — interleaved repetitions, medians and ratios;
- :mod:`sinkbench.batch` — the batch experiments (baselines, writers, epoch size, scale);
- :mod:`sinkbench.streaming` — visibility latency vs trigger interval;
- :mod:`sinkbench.breakdown` — the cost of each protocol step of one epoch;
- :mod:`sinkbench.report` — tables and the goals, read from the results;
- :mod:`sinkbench.commit_trace` — where a ``tx`` commit spends its time, traced inside
  Spark's Python workers (``bench_partitions.py --trace-commit``).

Run through ``benchmarks/bench_sink.py`` (or ``benchmarks/run_all.py`` for the suite).
"""
