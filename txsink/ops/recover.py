"""``txsink recover`` and ``txsink resolve``: finish decided xids, roll back abandoned
ones, and the operator's two recorded ways out of a publish that can never succeed.

A ``Committing`` xid is decided: it is never aborted, only published. When its publish
can never succeed, the operator has two recorded ways out (``recover`` prints which one
applies): ``recover --strategy`` publishes branches whose recorded strategy the server
cannot run with one it can (:meth:`RecoverCommands.recover`, where the switch is argued),
and ``resolve --give-up`` gives up partitions whose rows cannot be published at all
(:meth:`RecoverCommands.give_up`). Both are written in the branch's ledger
(:mod:`txsink.core.operator_records`) and the xid's metrics, and ``status`` shows them.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from typing import Any

import server_ext
from coordinator import (
    BranchRecord,
    Coordinator,
    PublishInProgress,
    SinkTreeDamaged,
    XidState,
)
from coordinator.protocol.recovery import (
    FAILED,
    IN_PROGRESS,
    ROLLED_BACK,
    ROLLED_FORWARD,
    RecoveryAction,
)
from coordinator.sink_admin import SinkAdmin
from server_ext.publish import (
    PublishRecord,
    Strategy,
    ledger_key,
    resolve_partition,
    strategy_problem,
)
from server_ext.sql import qualified_name
from server_ext.staging import read_staged_partitions
from txsink.core.metrics import EpochMetrics, GivenUpPartition
from txsink.core.operator_records import GivenUp, GivenUpPartitions, StrategySwitch, SwitchStep
from txsink.core.publisher import (
    BranchPublisher,
    publish_manifest,
    recorded_strategy,
    server_of,
    switched_strategy,
)
from txsink.ops.session import NO_SINKS, Session, protected_lines

UNCHANGED = "unchanged"  # a recover action that left the xid as it was, and why


class RecoverRefused(ValueError):
    """``recover --epoch/--strategy`` or ``resolve --give-up`` refused before writing
    anything: the message says why and what to do instead."""


def _operator() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class RecoverCommands(Session):
    def recover(self, sink: str | None = None, epoch: int | None = None,
                strategy: str | None = None,
                unwatched_after: float | None = None) -> dict[str, Any]:
        """Finish unfinished xids and roll back abandoned ones
        (``coordinator/protocol/liveness.py``: the writer's session gone, its generation
        superseded, or, with ``unwatched_after``, an unwatched xid not updated for that many
        seconds); a live writer's xid is left. With ``epoch`` only that xid of ``sink``; with
        ``strategy`` publish its winners whose recorded strategy the server cannot run
        with ``strategy`` instead.

        Every publish honours the strategy switches operators recorded earlier. For each
        ``Committing`` xid that stays unfinished, ``way_out`` says what can be done (a
        decided xid is never aborted): which ``--strategy`` to publish with, or how to
        resolve or give up partitions.

        Why switching the strategy of a decided xid is safe: the decision (the winners)
        stands and their staged parts are still in staging (publish checks them by name
        before any statement). The switch is allowed only for a branch whose current
        strategy the server refuses to run for its target (``strategy_problem`` with
        ``statement_runs`` False: ``move`` without MOVE PARTITION or into a Replicated
        table, ``attach_replicated`` into a plain one). Such a publish failed at the
        statement that makes rows visible, or before it, so it made no row visible: a
        failed ``move`` moved nothing. Its ledger intent ("attaching" these partitions)
        therefore says nothing the new strategy must believe, and the new strategy must
        not read it as its own (``attach_marked`` would take an intent without a
        watermark as "attached above block 0"). So the intent is cleared, keeping the
        partitions an operator already resolved, before the switch is recorded; a repeat
        of this command after a crash finds the switch and leaves the new strategy's own
        records alone. One case where the old strategy did run: a ``move`` that worked on
        a server since replaced by one without MOVE PARTITION. ``move`` takes the parts
        out of staging, so a partition its intent names that staging no longer holds was
        moved (``move``'s own repeat rule) and is recorded as published, never attached
        again; any other partition missing from staging fails the new strategy's check
        (``StagingChanged``) instead of publishing it. The switch and the cleared intent
        are recorded in the branch's ledger (``operator.strategy_switch``) and the xid's
        metrics. A branch whose strategy can run is never switched: its failure has
        another cause, and a switch could publish rows a repeat of the old strategy would
        publish again. Everything is checked before anything is written; the writes and
        the publish run under the xid's publish lease, so no other actor publishes it
        meanwhile. Writers' own recovery at start-up still uses the recorded strategy
        until this command has finished the xid: it fails before any statement runs, and
        the worst it can do to an interrupted switch is overwrite its intent, which turns
        the next repeat into "in doubt" (``txsink resolve``), never a duplicate.
        """
        if (epoch is not None or strategy is not None) and sink is None:
            raise RecoverRefused("--epoch and --strategy need --sink")
        sinks = self._sinks(sink)
        if (epoch is not None or strategy is not None) and not sinks:
            raise RecoverRefused(f"no sink {sink!r} under {self.root}")
        reports = []
        for sink_id in sinks:
            admin = self._admin(sink_id)
            coord = admin.coordinator
            admin.restore_open_index()
            if epoch is None and strategy is None:
                with BranchPublisher(self.client_for, coord) as publisher:
                    actions = list(coord.recover(publish=publisher.publish,
                                                 rollback=publisher.rollback,
                                                 raise_on_failure=False, abandoned=True,
                                                 unwatched_after=unwatched_after).actions)
            else:
                actions = self._finish_decided(coord, epoch, strategy)
            failed = [a for a in actions if a.action == FAILED]
            reports.append({
                "sink_id": sink_id, "actions": [str(a) for a in actions],
                "failed": [str(a) for a in failed],
                "way_out": [hint for a in failed if a.from_state is XidState.COMMITTING
                            for hint in self.hints(coord, a)],
            })
        return {"sinks": reports, **({"unknown": sink} if sink and not sinks else {})}

    def _finish_decided(self, coord: Coordinator, epoch: int | None,
                        strategy: str | None) -> list[RecoveryAction]:
        """``recover --epoch/--strategy``: check everything, then finish each xid."""
        if epoch is not None:
            record = coord.xid(epoch)
            if record is None:
                raise RecoverRefused(f"xid {coord.sink_id}/{epoch} has no record (never "
                                     "begun, or pruned)")
            records = [record]
        else:
            records = SinkAdmin(coord).xids(states=(XidState.COMMITTING,))
        switches: dict[int, list[_Switch]] = {}
        if strategy is not None:
            for record in records:
                if record.state is not XidState.COMMITTING:
                    raise RecoverRefused(
                        f"xid {record.xid} is {record.state.value}: --strategy is for a "
                        "Committing xid whose publish cannot succeed (run txsink recover "
                        "without it)")
                switches[record.epoch] = self._plan_switch(coord, record.epoch, strategy)
        return [self._finish_one(coord, record.epoch, switches.get(record.epoch, []))
                for record in records]

    def _finish_one(self, coord: Coordinator, epoch: int,
                    switches: list[_Switch]) -> RecoveryAction:
        generation = coord.generation()
        record = coord.xid(epoch)
        assert record is not None
        try:
            with coord.publish_lease(epoch, generation, wait=False):
                record = coord.xid(epoch) or record
                if record.state is XidState.COMMITTING:
                    self._apply_switches(coord, epoch, switches)
                    with BranchPublisher(self.client_for, coord) as publisher:
                        coord.commit(epoch, generation, None, publish=publisher.publish,
                                     rollback=publisher.rollback)
                    detail = "; ".join(str(s) for s in switches)
                    return RecoveryAction(record.xid, record.state, ROLLED_FORWARD, epoch, detail)
                if record.state is XidState.ABORTING:
                    publisher = BranchPublisher(self.client_for, coord)
                    coord.abort(epoch, generation, rollback=publisher.rollback)
                    return RecoveryAction(record.xid, record.state, ROLLED_BACK, epoch)
        except PublishInProgress as exc:
            return RecoveryAction(record.xid, record.state, IN_PROGRESS, epoch,
                                  f"held by {exc.holder}")
        except Exception as exc:  # noqa: BLE001 - reported per xid, like recovery does
            return RecoveryAction(record.xid, record.state, FAILED, epoch,
                                  f"{type(exc).__name__}: {exc}")
        why = ("undecided: txsink recover without --epoch rolls it back once its writer is "
               "gone" if record.state is XidState.INITIALIZED else "finished already")
        return RecoveryAction(record.xid, record.state, UNCHANGED, epoch, why)

    def _plan_switch(self, coord: Coordinator, epoch: int, strategy: str) -> list[_Switch]:
        """The branches of a ``Committing`` xid to switch to ``strategy``; refuses (before
        anything is written) a strategy some such branch's server cannot run, and a switch
        that applies to no branch."""
        record = coord.xid(epoch)
        assert record is not None
        winners = [b for b in coord.branches(epoch) if b.branch_id in record.winners]
        planned: list[_Switch] = []
        kept: list[str] = []
        for branch in winners:
            manifest = publish_manifest(coord, branch)
            if manifest is None or not manifest.partitions:
                continue  # a dynamic overwrite publishes with REPLACE PARTITION, whatever
            now = switched_strategy(coord, branch) or recorded_strategy(branch)
            if now == strategy:
                continue  # switched earlier (a repeat after a crash) or recorded so
            server = server_of(branch) or self.url or "?"
            caps, target = self._server_view(branch, manifest)
            refused = strategy_problem(caps, target, strategy)
            if refused is not None:
                raise RecoverRefused(
                    f"cannot publish branch {branch.branch_id} of {record.xid} with "
                    f"strategy={strategy!r} on {server} into {target.qualified}: "
                    f"{refused.lacks}; use --strategy {refused.instead}")
            problem = strategy_problem(caps, target, now)
            if problem is None or problem.statement_runs:
                kept.append(f"{branch.branch_id} ({now})")
                continue
            planned.append(_Switch(branch.branch_id, manifest, server_of(branch), now,
                                   strategy, f"{server}: {problem.lacks}"))
        if not planned and kept:
            raise RecoverRefused(
                f"no winner of {record.xid} needs another strategy: the server runs the "
                f"strategies of {', '.join(kept)} for their targets, so their publish fails "
                "for another reason. `txsink recover --sink "
                f"{coord.sink_id} --epoch {epoch}` shows it; a switch could publish rows "
                "twice")
        return planned

    def _apply_switches(self, coord: Coordinator, epoch: int, switches: list[_Switch]) -> None:
        """Clear each switched branch's failed intent, then record the switch (order: a
        crash in between repeats the clearing; see :meth:`recover`). Under the lease."""
        switched: dict[str, dict[str, str]] = {}
        for switch in switches:
            ledger = coord.ledger(epoch, switch.branch_id)
            key = ledger_key(switch.manifest.staging_table)
            publish_record = PublishRecord.load(ledger, key)
            cleared = sorted(publish_record.intended) if publish_record else []
            moved = (self._moved(switch.server, switch.manifest, cleared)
                     if switch.old == Strategy.MOVE else [])
            if cleared and publish_record is not None:
                PublishRecord.intent((), {*publish_record.published, *moved}).store(ledger, key)
            step = SwitchStep(switch.old, switch.new, switch.why, tuple(cleared), tuple(moved),
                              round(time.time(), 3), _operator())
            (StrategySwitch.load(ledger) or StrategySwitch(switch.old)).then(step).store(ledger)
            switched[switch.branch_id] = {"from": switch.old, "to": switch.new}
        if switched:
            record = coord.xid(epoch)
            known = EpochMetrics.from_dict(record.metrics if record else None).strategy_switches
            coord.record_metrics(epoch, EpochMetrics(
                strategy_switches={**known, **switched}).to_dict())

    def _moved(self, server: str | None, manifest: server_ext.Manifest,
               intended: Sequence[str]) -> list[str]:
        """The partitions a ``move`` intent names that staging no longer holds: moved
        (``move``'s own repeat rule; a MOVE that returned leaves no other record)."""
        if not intended:
            return []
        staged = read_staged_partitions(
            self.client_for(server), manifest.staging_database, manifest.staging_table,
            purpose="read staging for the partitions a move intent names")
        return sorted(p for p in intended if p not in staged)

    def _server_view(self, branch: BranchRecord, manifest: server_ext.Manifest
                     ) -> tuple[server_ext.Capabilities, server_ext.TargetTable]:
        """Capabilities of the branch's server and its target as that server describes it."""
        client = self.client_for(server_of(branch))
        target = server_ext.describe_table(
            client, qualified_name(manifest.target_database, manifest.target_table))
        return server_ext.detect_capabilities(client), target

    def hints(self, coord: Coordinator, failed: RecoveryAction) -> list[str]:
        """:meth:`way_out` for a failed recovery of a ``Committing`` xid, by its cause:
        none for lost records of the sink (the error says what to restore), and first,
        for staged partitions gone without an intent, that their rows may be published."""
        if failed.detail.startswith(SinkTreeDamaged.__name__):
            return []
        hints = self.way_out(coord, failed.epoch)
        if failed.detail.startswith(server_ext.StagingChanged.__name__):
            hints.insert(0, (
                "staged partitions are gone and no publish intent names them: if their rows "
                "are in the target (a MOVE whose intent was lost), record it with txsink "
                f"resolve --sink {coord.sink_id} --epoch {failed.epoch} --branch B "
                "--partition P --attached yes; give them up only if the rows are nowhere"))
        return hints

    def way_out(self, coord: Coordinator, epoch: int) -> list[str]:
        """What an operator can do about a ``Committing`` xid that recovery cannot finish.

        Per winner: a recorded strategy the server cannot run → the ``--strategy`` to
        publish with; a target table that is gone → recreate it or give up. Otherwise the
        general answer: fix the cause and run recover again, resolve what is in doubt,
        give up what can never be published. Never "abort": the xid is decided.
        """
        record = coord.xid(epoch)
        if record is None or record.state is not XidState.COMMITTING:
            return []
        xid = f"--sink {coord.sink_id} --epoch {epoch}"
        found: dict[str, list[str]] = {}
        staged: list[str] = []
        winners = coord.branches(epoch, record.winners)
        lost = sorted(set(record.winners) - {b.branch_id for b in winners})
        if lost:
            return [f"winner(s) {', '.join(lost)} of xid {record.xid} have no record: it was "
                    f"lost (not pruned: {coord.layout.xid(epoch)} is there), so what they "
                    "staged and where is unknown, and neither resolve nor recover can act "
                    "on them. Restore the record from a backup; txsink verify shows the "
                    "partitions this leaves unjudged"]
        for branch in winners:
            manifest = publish_manifest(coord, branch)
            if manifest is None:
                continue
            server = server_of(branch) or self.url or "?"
            staged.append(f"{branch.branch_id}: {manifest.staging_database}."
                          f"{manifest.staging_table} on {server}")
            try:
                caps, target = self._server_view(branch, manifest)
            except server_ext.ClickHouseError as exc:
                if exc.code in (60, 81):  # unknown table / database
                    hint = (f"the target {manifest.target_database}.{manifest.target_table} is "
                            f"gone on {server}: recreate it as it was and run txsink recover "
                            f"{xid} again, or give its partitions up: txsink resolve {xid} "
                            "--branch B --partition P --give-up")
                    found.setdefault(hint, []).append(branch.branch_id)
                continue
            now = switched_strategy(coord, branch) or recorded_strategy(branch)
            problem = strategy_problem(caps, target, now)
            if problem is not None and not problem.statement_runs:
                hint = (f"strategy {now} cannot run on {server} for {target.qualified} "
                        f"({problem.lacks}); publish with a strategy the server supports: "
                        f"txsink recover {xid} --strategy {problem.instead}")
                found.setdefault(hint, []).append(branch.branch_id)
        hints = [f"branch(es) {', '.join(ids)}: {hint}" for hint, ids in found.items()]
        hints = hints or [
            f"xid {record.xid} is decided: it cannot be aborted, only published. Fix the "
            f"cause above and run txsink recover {xid} again; a partition in doubt: look at "
            f"the target, then txsink resolve {xid} --branch B --partition P --attached "
            f"yes|no; rows that can never be published: txsink resolve {xid} --branch B "
            "--partition P --give-up (recorded; txsink status shows it)"]
        if staged and any("--give-up" in hint for hint in hints):
            hints.append("staged rows (copy them out before giving them up; they are "
                         "dropped when the xid finishes): " + "; ".join(staged))
        return hints

    def resolve(self, sink_id: str, epoch: int, branch_id: str,
                partition_id: str | Sequence[str], attached: bool) -> dict[str, Any]:
        """Record an operator's decision on in-doubt partitions, then recover the sink.

        Only for what ``recover`` reported as in doubt: look at the target first.
        ``attached=True`` means the partition's rows are in the target; ``False`` that
        they are not and must be attached again.
        """
        coord = self._coordinator(sink_id)
        record = next(iter(coord.branches(epoch, [branch_id])), None)
        manifest = publish_manifest(coord, record) if record is not None else None
        if manifest is None:
            raise ValueError(f"no prepared branch {branch_id} in xid {sink_id}/{epoch} "
                             "publishes partitions one by one")
        ids = [partition_id] if isinstance(partition_id, str) else list(partition_id)
        with coord.publish_lease(epoch):  # PublishInProgress while another actor publishes
            ledger = coord.ledger(epoch, branch_id)
            for pid in ids:
                resolve_partition(manifest, pid, ledger, attached=attached)
        return self.recover(sink_id)

    def give_up(self, sink_id: str, epoch: int, branch_id: str, partition_ids: Sequence[str],
                reason: str = "") -> dict[str, Any]:
        """Give up partitions of a ``Committing`` xid whose rows can never be published,
        then finish the xid.

        The decision stands for everything else: the partitions are recorded as given up
        (branch ledger ``operator.given_up`` and the xid's ``given_up`` metric, shown by
        ``txsink status``), marked so that publish skips them, and their staged rows are
        dropped with the branch's staging when the xid finishes (copy them out of the
        staging table first if they are wanted). Refused, before anything is written, for
        an xid that is not ``Committing``, a branch that is not a winner, a partition the
        branch did not stage or one already published.
        """
        coord = self._coordinator(sink_id)
        record = coord.xid(epoch)
        xid = f"{sink_id}/{epoch}"
        if record is None or record.state is not XidState.COMMITTING:
            state = record.state.value if record else "unknown"
            raise RecoverRefused(f"xid {xid} is {state}: only a Committing xid has partitions "
                                 "to give up (an undecided xid is rolled back by txsink "
                                 "recover; nothing of an aborted one is published)")
        branch = next((b for b in coord.branches(epoch) if b.branch_id == branch_id), None)
        if branch is None or branch_id not in record.winners:
            raise RecoverRefused(f"branch {branch_id} is not a winner of {xid} (winners: "
                                 f"{', '.join(record.winners)})")
        manifest = publish_manifest(coord, branch)
        if manifest is None:
            raise RecoverRefused(f"branch {branch_id} of {xid} is a dynamic overwrite; its "
                                 "partitions are replaced as a whole and cannot be given up "
                                 "one by one")
        staged = {p.partition_id: p for p in manifest.partitions}
        unknown = [p for p in partition_ids if p not in staged]
        if unknown or not partition_ids:
            raise RecoverRefused(f"branch {branch_id} of {xid} staged partitions "
                                 f"{sorted(staged)}, not {unknown or 'none given'}")
        key = ledger_key(manifest.staging_table)
        with coord.publish_lease(epoch, coord.generation(), wait=False):
            ledger = coord.ledger(epoch, branch_id)
            publish_record = PublishRecord.load(ledger, key)
            done = (set() if publish_record is None else set(staged)
                    if publish_record.is_published else set(publish_record.published))
            if publish_record is not None and (switched_strategy(coord, branch)
                                               or recorded_strategy(branch)) == Strategy.MOVE:
                done.update(self._moved(server_of(branch), manifest,
                                        sorted(publish_record.intended)))
            published = sorted(set(partition_ids) & done)
            if published:
                raise RecoverRefused(f"partition(s) {published} of branch {branch_id} are "
                                     "published already (recorded, or moved out of "
                                     "staging by the move its intent names); nothing to "
                                     "give up")
            now, by = round(time.time(), 3), _operator()
            given = {pid: GivenUp(staged[pid].rows, reason, now, by) for pid in partition_ids}
            GivenUpPartitions.load(ledger).adding(given).store(ledger)
            for pid in partition_ids:
                resolve_partition(manifest, pid, ledger, attached=True)
            target = f"{manifest.target_database}.{manifest.target_table}"
            known = EpochMetrics.from_dict((coord.xid(epoch) or record).metrics).given_up
            listed = [g for g in known if not (g.branch == branch_id and g.partition in given)]
            listed += [GivenUpPartition(branch_id, pid, target, given[pid].rows, reason, now)
                       for pid in partition_ids]
            coord.record_metrics(epoch, EpochMetrics(given_up=tuple(listed)).to_dict())
        result = self.recover(sink_id, epoch=epoch)
        result["given_up"] = [{"sink_id": sink_id, "epoch": epoch, "branch": branch_id,
                               "partition": pid, "table": target, "rows": given[pid].rows,
                               "staging": manifest.staging_table}
                              for pid in partition_ids]
        return result


def render(result: dict[str, Any]) -> str:
    """Human-readable text of ``recover``'s or ``resolve``'s result."""
    lines = protected_lines(result)
    if result.get("unknown"):
        return "\n".join([*lines, f"no sink {result['unknown']!r} under this root: nothing "
                                  "to recover (a sink's first write makes it)"])
    if not result["sinks"]:
        return "\n".join([*lines, NO_SINKS])
    for sink in result["sinks"]:
        lines.append(f"{sink['sink_id']}: " + ("; ".join(sink["actions"]) or "nothing to do"))
        lines += [f"  NOT FINISHED: {a}" for a in sink["failed"]]
        lines += [f"  WHAT TO DO: {hint}" for hint in sink.get("way_out", [])]
    lines += [f"gave up partition {g['partition']} of branch {g['branch']} "
              f"({g['rows']} rows for {g['table']}, never published; they are dropped with "
              f"the staging table txsink_staging.{g['staging']} when the xid finishes)"
              for g in result.get("given_up", [])]
    return "\n".join(lines)


class _Switch:
    """One branch to publish with ``new`` instead of ``old`` (see ``recover``)."""

    def __init__(self, branch_id: str, manifest: server_ext.Manifest, server: str | None,
                 old: str, new: str, why: str) -> None:
        self.branch_id, self.manifest, self.server = branch_id, manifest, server
        self.old, self.new, self.why = old, new, why

    def __str__(self) -> str:
        return f"branch {self.branch_id} published with {self.new} instead of {self.old}"
