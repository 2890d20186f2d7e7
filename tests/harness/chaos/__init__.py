"""Fault injection and an independent checker: the proof that ``clickhouse_tx`` is exactly-once.

- :mod:`tests.harness.chaos.proxy` — a TCP proxy that delays, cuts or black-holes connections.
- :mod:`tests.harness.chaos.faults` — process faults: kill -9 the Spark driver, a Python worker,
  the ClickHouse server or ZooKeeper; restart them; a private server pair to kill freely.
- :mod:`tests.harness.chaos.pipeline` — the streaming (or batch) job under test, and the
  uniquely keyed input files it reads.
- :mod:`tests.harness.chaos.launcher` — runs that job as its own driver process (own session),
  with a warm standby for fast restarts.
- :mod:`tests.harness.chaos.checker` — counts every id in the target over plain HTTP.
- :mod:`tests.harness.chaos.crashrun` — every named crash point once, against one driver.
- :mod:`tests.harness.chaos.actors` — overlapping actors for the schedule: an operator's
  recover loop, a second driver of the same query, a zombie task of an old generation.
- :mod:`tests.harness.chaos.schedule` — seeded random fault schedules and the soak command.

Nothing here is imported by the sink itself.
"""
