"""The write's tuning: the sizes and pools the tasks and the commit share, as one record.

Not options: nothing here changes what a write does, only how much of it runs at once and
where combining stops copying data (figures in ``docs/benchmarks.md``). The planner puts
:data:`DEFAULT_TUNING` into every ``WritePlan`` (``txsink.core.write_plan``), which is
pickled into each task and read by the commit, so the task that contributes its staged
table and the commit that publishes it judge by the same :class:`SizeLimits`. The values
a lower layer owns are its own (``server_ext.publish.combined.DEFAULT_LIMITS``,
``coordinator.upkeep.retention.PASS_XIDS``) and gathered here, not written again.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.upkeep.retention import PASS_XIDS
from server_ext.publish import DEFAULT_LIMITS, SizeLimits


@dataclass(frozen=True)
class Tuning:
    """How much of a write runs at once, and where combining stops copying."""

    # where combining stops copying: a task's contribution to its pre-combined table
    # (txsink/core/combine.py) and the commit's publish of it (txsink/core/publisher.py)
    limits: SizeLimits = DEFAULT_LIMITS
    digest_workers: int = 2  # staged tables of a task digested at once, beside its contributions
    contribute_workers: int = 4  # a task's staged tables contributed at once
    release_workers: int = 2  # published winners' staging drops in flight at once
    retention_pass_xids: int = PASS_XIDS  # finished xids one writer's retention pass removes


DEFAULT_TUNING = Tuning()
