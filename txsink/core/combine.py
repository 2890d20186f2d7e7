"""When and how an xid's branches are combined: the sink's side of the combine policy.

Many small branches on one server make many small parts and one publish statement each;
the sink combines them, in two places, under one policy:

- **in the tasks** (:func:`contribute`): a sealed staging table of small parts in few
  partitions attaches its parts into the xid's *pre-combined* table of its target on its
  server, one per (generation, server, table), registered as a branch so a rollback
  drops it. A share that is not small, spans many partitions, belongs to an overwrite,
  comes from a task of a partition below ``direct_max_winners`` or fails to contribute
  is read by the commit from its own staging table;
- **at the commit** (:func:`combined_branches`): the winners of each server and table
  become one *combined* branch, registered and prepared before the decision like any
  branch, published in one pass from one combined table (``server_ext.publish.combined``,
  which builds it from the pre-combined table and the sources that did not contribute),
  unless they are at most ``direct_max_winners``: those are published directly, each
  from its own staging table. So a job of that many tasks contributes nothing.

What is small and few is the plan's ``tuning.limits`` (``txsink.core.tuning``: the
``SizeLimits`` the commit's publisher reads too); how a combined table is built and
published is ``server_ext.publish.combined``'s; which payload names what is
:mod:`txsink.core.payload`'s.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence

import server_ext
from coordinator import BranchRecord, Coordinator, CoordinatorError
from server_ext.client import ClickHouseClient
from server_ext.errors import ClickHouseError
from server_ext.publish import attach_to_precombined, create_precombined
from txsink.core import payload
from txsink.core.payload import BranchOwner, CombinedBranch, precombined_of, staged_manifest
from txsink.core.publisher import BranchPublisher, recorded_strategy, server_of
from txsink.core.write_plan import WritePlan

log = logging.getLogger(__name__)

PRECOMBINED_PREFIX = "precombined-"


def precombined_branch_id(generation: int, server: str, target: str, write: str) -> str:
    """The branch id of an xid's pre-combined table for one server, target and write
    (``WritePlan.write_id``): the same in every task of the write's generation, so they
    all find one table, and another one for a second write of the table in the xid."""
    digest = hashlib.sha1(f"{server}|{target}|{write}".encode()).hexdigest()[:8]
    return f"{PRECOMBINED_PREFIX}g{generation}-{digest}"


# (root, sink, epoch, branch id) of pre-combined tables this process registered and made
_PRECOMBINED: set[tuple[str, str, int, str]] = set()


def contribute(plan: WritePlan, coord: Coordinator, epoch: int, generation: int,
               server: str, client: ClickHouseClient, manifest: server_ext.Manifest,
               table: server_ext.TargetTable, partition: int) -> str:
    """Attach a task's sealed staging table of small parts in few partitions (a branch's
    own, or a view's share, for ``table``) into the pre-combined table of ``table`` on
    ``server``; its name if that worked, "" if it is not contributed (``SizeLimits.
    contributes`` says no, the task's Spark ``partition`` is below ``direct_max_winners``,
    an overwrite, or any failure: the commit reads the staging table itself then)."""
    limits = plan.tuning.limits
    if (plan.overwrite or partition < limits.direct_max_winners
            or not limits.contributes(manifest)):
        return ""
    options = plan.options
    branch_id = precombined_branch_id(generation, server, f"{table.database}.{table.name}",
                                      plan.write_id)
    name = server_ext.staging_table_name(plan.sink_id, epoch, branch_id,
                                         root=options.store.root_identity)
    key = (options.store.root_identity, plan.sink_id, epoch, branch_id)
    if key not in _PRECOMBINED:
        try:
            coord.register_branch(epoch, branch_id, generation,
                                  owner=BranchOwner(name, server).to_record())
            create_precombined(client, table, name)
        except (CoordinatorError, ClickHouseError) as exc:
            log.warning("xid %s/%d: no pre-combined table (the commit reads the "
                        "branches instead): %s", plan.sink_id, epoch, exc)
            return ""
        _PRECOMBINED.add(key)
    return name if attach_to_precombined(client, manifest, name) else ""


def combined_branches(plan: WritePlan, coord: Coordinator, epoch: int, generation: int,
                      records: Sequence[BranchRecord], publisher: BranchPublisher
                      ) -> list[str]:
    """The decision's winners: one combined branch per server and table that got more
    than ``direct_max_winners`` winners (every server, for an overwrite), the task
    branches elsewhere. The tables are the target and those of the materialized views it
    feeds (``server_ext.ddl.views``).

    A combined branch publishes its sources in one pass (``server_ext.publish.combined``; an
    overwrite: one ``REPLACE PARTITION`` per partition of all of them). It is registered
    and prepared before the decision like any branch, so the decision stays one
    compare-and-set over its winners, and its sources become non-winners, rolled back
    (their staging dropped) after the publish. Its id is derived from its sources, so a
    repeated commit of the same messages finds it already prepared.
    """
    publisher.remember(records)
    by_table: dict[tuple[str | None, str, str], list[BranchRecord]] = {}
    for record in records:
        manifest = staged_manifest(record)
        key = (server_of(record), manifest.target_database, manifest.target_table)
        by_table.setdefault(key, []).append(record)
    chosen = []
    for (server, _, _), group in sorted(by_table.items(), key=lambda item: str(item[0])):
        if plan.tuning.limits.publishes_directly(len(group)) and not plan.overwrite:
            chosen.extend(r.branch_id for r in group)
            continue
        sources = ",".join(sorted(r.branch_id for r in group))
        branch_id = f"combined-{hashlib.sha1(sources.encode()).hexdigest()[:8]}"
        staging = server_ext.staging_table_name(plan.sink_id, epoch, branch_id,
                                                root=plan.options.store.root_identity)
        combined = CombinedBranch.of(
            {r.branch_id: staged_manifest(r) for r in group}, staging=staging,
            strategy=recorded_strategy(group[0]), server=server, overwrite=plan.overwrite,
            precombined="" if plan.overwrite else precombined_of(group))
        coord.register_branch(epoch, branch_id, generation,  # both idempotent
                              owner=payload.BranchOwner(staging, server).to_record())
        coord.prepare_branch(epoch, branch_id, payload.to_record(combined))
        chosen.append(branch_id)
    return chosen
