"""Consolidation: the winners of one xid on one server, published in one pass.

Publishing every winning branch on its own costs a merges stop/start, a watermark, an
intent, an ALTER, a mark and a staging drop per branch, and adds one part per branch and
partition to the target. ``publish_combined`` instead gathers the winners' staged
partitions into one *combined* staging table on the server (hard links, no data
rewritten), merges each small partition into one part, seals the result and publishes
that single table with the strategy's ordinary ``publish``: one pass per xid and server,
and at most one new part per target partition while partitions stay under
``merge_max_bytes``.

Contract (the same as ``publish``: may be repeated after a crash anywhere, by this actor
or by whoever holds the xid's publish lease next):

- Until the ledger records the combined table (``{"state": "combined", "manifest": ...}``
  under :func:`combine_key`), nothing of it counts: a repeat drops and rebuilds it from
  the sources, which are still intact (ATTACH ... FROM copies parts, it does not take
  them). The record is written only after the combined table was sealed with exactly the
  sources' rows, so from then on the combined table is the one source of truth and the
  sources may be dropped.
- Before anything is combined, every source must hold exactly its sealed parts
  (``StagingChanged`` otherwise): rows that left a source are never silently skipped.
- The sources stay until the caller rolls them back (txsink: as non-winners, once the
  xid is ``Committed``); a repeat before that finds them, after that the record.
- Merging rewrites the data of a partition once, inside the server; above
  ``merge_max_bytes`` a partition keeps the sources' parts (they are large already and
  the rewrite would cost more than the parts it saves).
"""

from __future__ import annotations

import logging

from server_ext.capabilities import SqlClient
from server_ext.ledger import Ledger
from server_ext.manifest import Manifest
from server_ext.publish import publish
from server_ext.publish_steps import MAX_COMMANDS_PER_ALTER, PublishReport, StepHook, no_step
from server_ext.schema import describe_table
from server_ext.seal import merge_partitions, require_sealed, seal
from server_ext.sql import qualified_name, sql_string
from server_ext.staging import create_staging, staging_qualified

log = logging.getLogger(__name__)

STEP_AFTER_COMBINE = "consolidate.after_combine"  # combined table built, not recorded
STEP_AFTER_RECORD = "consolidate.after_record"  # recorded, nothing published yet
STEPS = (STEP_AFTER_COMBINE, STEP_AFTER_RECORD)

COMBINED = "combined"
MERGE_MAX_BYTES = 256 * 1024 * 1024  # per partition; see docs/benchmarks.md


def combine_key(combined_table: str) -> str:
    """Ledger key of the record that the combined table is built and sealed."""
    return f"{combined_table}.combined"


def publish_combined(
    client: SqlClient,
    sources: list[Manifest],
    combined_table: str,
    strategy: str,
    ledger: Ledger,
    *,
    on_step: StepHook | None = None,
    merge_max_bytes: int = MERGE_MAX_BYTES,
) -> PublishReport:
    """Publish the sealed staging tables ``sources`` (one target, one server) in one pass
    through ``combined_table`` (in the staging database). Re-runnable; the caller drops
    the combined table afterwards, as it drops a branch's staging after ``publish``."""
    step = on_step or no_step
    manifest = combine(client, sources, combined_table, ledger, on_step=step,
                       merge_max_bytes=merge_max_bytes)
    return publish(client, manifest, strategy, ledger, on_step=step)


def combine(
    client: SqlClient,
    sources: list[Manifest],
    combined_table: str,
    ledger: Ledger,
    *,
    on_step: StepHook = no_step,
    merge_max_bytes: int = MERGE_MAX_BYTES,
) -> Manifest:
    """The sealed manifest of the combined table, built now or recorded earlier."""
    key = combine_key(combined_table)
    record = ledger.get(key) or {}
    if record.get("state") == COMBINED:
        manifest = Manifest.from_dict(record["manifest"])
    else:
        manifest = _build(client, sources, combined_table, merge_max_bytes)
        on_step(STEP_AFTER_COMBINE)
        ledger.put(key, {"state": COMBINED, "manifest": manifest.to_dict()})
        on_step(STEP_AFTER_RECORD)
    return manifest


def _build(client: SqlClient, sources: list[Manifest], combined_table: str,
           merge_max_bytes: int) -> Manifest:
    targets = {(m.target_database, m.target_table) for m in sources}
    if len(targets) != 1:
        raise ValueError(f"sources of one combined table must share a target, got {targets}")
    database, table = next(iter(targets))
    require_sealed(client, sources, purpose="read winners' staged parts before combining")
    target = describe_table(client, f"{database}.{table}")
    staging = staging_qualified(combined_table)
    client.execute(f"DROP TABLE IF EXISTS {staging}", purpose="drop unrecorded combined table")
    create_staging(client, target, combined_table)
    sizes: dict[str, tuple[int, int]] = {}
    for source in sources:
        for partition in source.partitions:
            parts, size = sizes.get(partition.partition_id, (0, 0))
            sizes[partition.partition_id] = (parts + len(partition.parts), size + partition.bytes)
    small = {pid for pid, (parts, size) in sizes.items() if parts > 1 and size <= merge_max_bytes}
    commands = [(p.partition_id, f"ATTACH PARTITION ID {sql_string(p.partition_id)} FROM "
                                 f"{qualified_name(m.staging_database, m.staging_table)}")
                for m in sources for p in m.partitions]
    for start in range(0, len(commands), MAX_COMMANDS_PER_ALTER):
        chunk = commands[start:start + MAX_COMMANDS_PER_ALTER]
        client.execute(f"ALTER TABLE {staging} {', '.join(c for _, c in chunk)}",
                       purpose="combine winners into one table", retry=False)
        if start + MAX_COMMANDS_PER_ALTER < len(commands):
            # An ATTACH costs more the more parts its table holds (measured on 18.16:
            # ~1 ms at 200 sources, ~9 ms at 1,000): merge as we go, so it stays cheap.
            merge_partitions(client, staging, sorted({pid for pid, _ in chunk} & small))
    merge_partitions(client, staging, sorted(small))
    manifest = seal(client, target, combined_table, sum(m.rows for m in sources))
    log.info("combined %d branches into %s: %d partitions, %d parts",
             len(sources), staging, len(manifest.partitions),
             sum(len(p.parts) for p in manifest.partitions))
    return manifest
