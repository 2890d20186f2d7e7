"""Operator commands behind ``txsink status | recover | gc | verify``.

Each returns plain data (for ``--json``) and :func:`render` turns it into the text an
operator reads. None of them fences a sink: ``recover`` (and ``gc``, first) finishes
``Committing`` xids and rolls back undecided xids that are abandoned
(``coordinator/liveness.py``: of an older generation, or whose writer's liveness holders
are all gone), so it is safe while a writer runs; a live writer's in-flight xid is left
alone.

A ``Committing`` xid is decided: it is never aborted, only published. When its publish
can never succeed, the operator has two recorded ways out (``recover`` prints which one
applies): ``recover --strategy`` publishes branches whose recorded strategy the server
cannot run with one it can (:meth:`Operations.recover`, where the switch is argued), and
``resolve --give-up`` gives up partitions whose rows cannot be published at all
(:meth:`Operations.give_up`). Both are written in the branch's ledger and the xid's
metrics, and ``status`` shows them.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ParamSpec, TypeVar

import server_ext
from coordinator import (
    AccessDenied,
    BranchRecord,
    Coordinator,
    PublishInProgress,
    XidRecord,
    XidState,
    audit,
)
from coordinator.liveness import Verdict
from coordinator.recovery import FAILED, IN_PROGRESS, ROLLED_BACK, ROLLED_FORWARD, RecoveryAction
from server_ext.capabilities import strategy_problem
from server_ext.client import ClickHouseClient
from server_ext.ledger import PublishRecord, ledger_key
from server_ext.seal import read_staged_partitions
from server_ext.sql import qualified_name
from server_ext.staging import root_tag
from server_ext.sweeper import sweep
from txsink import connections
from txsink.metrics import UNKNOWN, WRITER, EpochMetrics, GivenUpPartition
from txsink.operator_records import GivenUp, GivenUpPartitions, StrategySwitch, SwitchStep
from txsink.options import is_one_off, root_identity
from txsink.payload import BranchOwner, CombinedBranch, from_record
from txsink.publisher import (
    BranchPublisher,
    publish_manifest,
    recorded_strategy,
    server_of,
    switched_strategy,
)
from txsink.status_report import SinkHealth, sink_health
from txsink.verify_target import Writers, check_targets

OPEN_STATES = (XidState.INITIALIZED, XidState.COMMITTING, XidState.ABORTING)

UNCHANGED = "unchanged"  # a recover action that left the xid as it was, and why

P = ParamSpec("P")
R = TypeVar("R")


class RecoverRefused(ValueError):
    """``recover --epoch/--strategy`` or ``resolve --give-up`` refused before writing
    anything: the message says why and what to do instead."""


def _operator() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class UnknownSink(LookupError):
    """An operator named a sink the root does not hold."""


CONNECT_SECONDS = 5.0  # an operator waits this long for ZooKeeper, then gets one line
ONE_OFF_RETENTION = 7 * 24 * 3600.0  # gc forgets one-off sinks idle this long (default)


class Operations:
    """One ZooKeeper session (and, when needed, one ClickHouse client) per command."""

    def __init__(self, zookeeper: str, zk_root: str = "/txsink", url: str | None = None,
                 user: str | None = None, password: str | None = None,
                 zookeeper_auth: str | None = None,
                 zookeeper_ca_file: str | None = None) -> None:
        self.root = zk_root
        self.root_identity = root_identity(zookeeper, zk_root)  # what gc may judge
        self.zk = connections.zookeeper(
            zookeeper, timeout=CONNECT_SECONDS, auth=zookeeper_auth,
            ca_file=zookeeper_ca_file, shared=False, named="--zookeeper",
            ca_named="TXSINK_ZOOKEEPER_CA_FILE",
            ca_advice="set TXSINK_ZOOKEEPER_CA_FILE to the CA of its certificate")
        self.url = url
        self.protected: list[str] = []  # sinks left out: their ACL names other credentials
        self._credentials = (user, password)

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()

    def client_for(self, url: str | None = None) -> ClickHouseClient:
        """A client for ``url`` (a branch's server) or, for None, for ``--url``."""
        url = url or self.url
        if url is None:
            raise ValueError("this command needs --url")
        user, password = self._credentials
        return connections.clickhouse_client(url, user, password)

    def _sinks(self, only: str | None, must_exist: bool = False) -> list[str]:
        """The sinks a command works on: ``only``, or every sink of the root that this
        session may read. Sinks whose records carry an ACL for other credentials
        (``zookeeper_auth``) are left out and listed in ``self.protected``; naming one
        with ``only`` is refused with :class:`AccessDenied`."""
        sinks = Coordinator.sinks(self.zk, self.root)
        if must_exist and only is not None and only not in sinks:
            raise UnknownSink(f"no sink {only!r} under {self.root_identity} (known: "
                              f"{', '.join(sinks[:10]) or 'none'})")
        chosen = [s for s in sinks if only is None or s == only]
        readable = [s for s in chosen if self._readable(s)]
        if only is not None and chosen and not readable:
            raise access_denied(f"sink {only}'s")
        return readable

    def _readable(self, sink_id: str) -> bool:
        if self._coordinator(sink_id).readable():
            return True
        if sink_id not in self.protected:
            self.protected.append(sink_id)
        return False

    def _protected_note(self) -> dict[str, Any]:
        """What a command's result says of the sinks it had to leave out."""
        return {"protected_sinks": sorted(self.protected)} if self.protected else {}

    def _coordinator(self, sink_id: str) -> Coordinator:
        return Coordinator(self.zk, sink_id, root=self.root, role="txsink operator")

    def status(self, sink: str | None = None, recent: int = 5,
               unwatched_after: float | None = None) -> dict[str, Any]:
        now = time.time()
        sinks = []
        for sink_id in self._sinks(sink, must_exist=True):
            coord = self._coordinator(sink_id)
            open_xids = coord.xids(states=OPEN_STATES)
            verdicts = {v.record.epoch: v for v in coord.verdicts(unwatched_after)}
            every_committed = coord.xids(states=(XidState.COMMITTED,))
            committed = every_committed[-recent:]
            last = coord.last_committed()
            health = sink_health(
                sink_id, self.root_identity, open_xids, verdicts.values(),
                next((x for x in reversed(every_committed) if x.epoch == last), None), last,
                coord.branches, self.client_for, self.url, now)
            sinks.append({
                "sink_id": sink_id,
                "generation": coord.generation(),
                "last_committed": last,
                "health": health.to_json(),
                "open": [
                    {"epoch": x.epoch, "state": x.state.value,
                     "age_s": round(now - x.created, 1), "winners": list(x.winners),
                     **_liveness(coord, verdicts.get(x.epoch))}
                    for x in open_xids
                ],
                "in_doubt": [x.epoch for x in open_xids if x.state == XidState.COMMITTING],
                "recent": [{"epoch": x.epoch, **_commit_metrics(coord, x)} for x in committed],
                "operator_decisions": _decisions(open_xids, every_committed),
            })
        return {"sinks": sinks, **self._protected_note()}

    def recover(self, sink: str | None = None, epoch: int | None = None,
                strategy: str | None = None,
                unwatched_after: float | None = None) -> dict[str, Any]:
        """Finish unfinished xids and roll back abandoned ones (``coordinator/liveness.py``:
        the writer's session gone, its generation superseded, or, with
        ``unwatched_after``, an unwatched xid not updated for that many seconds); a live
        writer's xid is left. With ``epoch`` only that xid of ``sink``; with
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
            coord = self._coordinator(sink_id)
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
                            for hint in self.way_out(coord, a.epoch)],
            })
        return {"sinks": reports}

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
            records = coord.xids(states=(XidState.COMMITTING,))
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
            moved: list[str] = []
            if cleared and switch.old == "move":
                staged = read_staged_partitions(
                    self.client_for(switch.server), switch.manifest.staging_database,
                    switch.manifest.staging_table, purpose="read staging before a switch")
                moved = sorted(p for p in cleared if p not in staged)
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

    def _server_view(self, branch: BranchRecord, manifest: server_ext.Manifest
                     ) -> tuple[server_ext.Capabilities, server_ext.TargetTable]:
        """Capabilities of the branch's server and its target as that server describes it."""
        client = self.client_for(server_of(branch))
        target = server_ext.describe_table(
            client, qualified_name(manifest.target_database, manifest.target_table))
        return server_ext.detect_capabilities(client), target

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
        for branch in coord.branches(epoch, record.winners):
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
                server_ext.resolve_partition(manifest, pid, ledger, attached=attached)
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
            published = sorted(set(partition_ids) & done)
            if published:
                raise RecoverRefused(f"partition(s) {published} of branch {branch_id} are "
                                     "recorded as published already; nothing to give up")
            now, by = round(time.time(), 3), _operator()
            given = {pid: GivenUp(staged[pid].rows, reason, now, by) for pid in partition_ids}
            GivenUpPartitions.load(ledger).adding(given).store(ledger)
            for pid in partition_ids:
                server_ext.resolve_partition(manifest, pid, ledger, attached=True)
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

    def _is_live(self, name: server_ext.StagingName) -> bool:
        """A staging table is live while its xid may still publish or roll it back.

        Answers for this root only: an xid this root does not know (no such sink or
        epoch) is not live here. The sweeper asks only about this root's tables; a table
        of any other root is treated as live, so it can never be dropped from here.
        """
        if name.root_tag != root_tag(self.root_identity):
            return True
        for sink_id in Coordinator.sinks(self.zk, self.root):
            if server_ext.staging_sink_key(sink_id) != name.sink_key:
                continue
            if not self._readable(sink_id):
                return True  # its state is not ours to read: never drop its staging
            record = self._coordinator(sink_id).xid(name.epoch)
            if record is not None and record.state in OPEN_STATES:
                return True
        return False

    def gc(self, grace_seconds: float, prune_older_than: float | None,
           servers: list[str] | None = None,
           forget_one_off_after: float | None = ONE_OFF_RETENTION,
           unwatched_after: float | None = None) -> dict[str, Any]:
        """Roll back abandoned xids, then sweep ``servers`` (every server of a sharded
        target; default ``--url``).

        First every sink's abandoned xids are rolled back as ``recover`` does (their
        branches' staging and staging views dropped through ``BranchPublisher.rollback``,
        the xid ``Aborted``); ``abandoned`` lists them, and every undecided xid left
        with why. Then the sweep drops what no xid accounts for any more.

        Drops only this root's staging (see ``server_ext.sweeper``); every table of the
        staging database that belongs to another root, has no root tag or is not a
        staging name is listed under ``foreign_staging`` and left alone. Then forgets the
        one-off sinks (batch jobs without ``sink_id``) idle for ``forget_one_off_after``
        seconds, after their staging was swept.
        """
        abandoned = self._roll_back_abandoned(unwatched_after)
        dropped: list[str] = []
        foreign: list[dict[str, Any]] = []
        for url in servers or [None]:
            result = sweep(self.client_for(url), self.root_identity, self._is_live,
                           grace_seconds)
            dropped += result.dropped
            foreign += [{"server": url or self.url, "table": f.table, "reason": f.reason,
                         "root_tag": f.root_tag, "age_s": round(f.age_seconds)}
                        for f in result.foreign]
        pruned: dict[str, list[int]] = {}
        if prune_older_than is not None:
            for sink_id in self._sinks(None):
                pruned[sink_id] = self._coordinator(sink_id).prune(prune_older_than)
        forgotten: dict[str, float] = {}
        if forget_one_off_after is not None:
            for sink_id in filter(is_one_off, self._sinks(None)):
                age = self._coordinator(sink_id).forget_sink(forget_one_off_after)
                if age is not None:
                    forgotten[sink_id] = round(age)
        return {"root": self.root_identity, "root_tag": root_tag(self.root_identity),
                "abandoned": abandoned,
                "dropped_staging": dropped, "foreign_staging": foreign, "pruned": pruned,
                "forgotten_sinks": forgotten, **self._protected_note()}

    def _roll_back_abandoned(self, unwatched_after: float | None) -> dict[str, Any]:
        """gc's first step: per sink, the xids rolled back as abandoned (with their
        staging), those that could not be, and every undecided xid left, with why."""
        rolled: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        left: list[dict[str, Any]] = []
        for sink_id in self._sinks(None):
            coord = self._coordinator(sink_id)
            verdicts = {v.record.epoch: v for v in coord.verdicts(unwatched_after)}
            staging = {e: _staging_of(coord, e) for e, v in verdicts.items() if v.abandoned}
            with BranchPublisher(self.client_for, coord) as publisher:
                report = coord.recover(publish=publisher.publish, rollback=publisher.rollback,
                                       raise_on_failure=False, abandoned=True,
                                       unwatched_after=unwatched_after)
            done = {a.epoch: a for a in report.actions
                    if a.from_state is XidState.INITIALIZED}
            for epoch, verdict in sorted(verdicts.items()):
                entry = {"sink_id": sink_id, "epoch": epoch, "reason": verdict.reason,
                         "detail": verdict.detail(), "age_s": verdict.age_s}
                action = done.get(epoch)
                if action is not None and action.action == ROLLED_BACK:
                    rolled.append({**entry, "staging": staging.get(epoch, [])})
                elif action is not None:
                    failed.append({**entry, "detail": str(action)})
                elif verdict.abandoned:
                    left.append({**entry, "detail": "changed since it was judged "
                                 "abandoned (adopted or decided meanwhile)"})
                else:
                    left.append(entry)
        return {"rolled_back": rolled, "failed": failed, "left": left}

    def verify(self, sink: str | None = None, committing_older_than: float = 300.0,
               target: bool = True, writers: Writers = "unknown") -> dict[str, Any]:
        """Audit each sink's history and, with ``target``, compare its target partitions
        with what its committed xids put there (``txsink.verify_target``).

        ``anomalies`` lists every finding as a sentence (history and target alike: any
        makes the command fail); ``target`` has the target findings as data, the
        partitions it could not judge and why, and how many matched.
        """
        sinks = self._sinks(sink)
        reports = (check_targets(self.zk, self.root, sinks, self.client_for, self.url, writers)
                   if target and sinks else {})
        result = []
        for sink_id in sinks:
            anomalies = [str(a) for a in audit(self.zk, self.root, sink_id,
                                               committing_older_than=committing_older_than)]
            report = reports.get(sink_id)
            if report is not None:
                anomalies += [a["detail"] for a in report["anomalies"]]
            result.append({"sink_id": sink_id, "anomalies": anomalies,
                           "target": report or {"checked": False}})
        return {"sinks": result}

    def reset(self, sink_id: str, forget_epochs: bool = False,
              committed_through: int | None = None) -> dict[str, Any]:
        """The way out of a stream state mismatch (``coordinator/stream.py``).

        ``forget_epochs``: a new query (new or deleted checkpoint) takes the sink over,
        its micro-batches counted from 0. ``committed_through=N``: the sink's state was
        lost and micro-batches ``0..N`` are in the target; the query goes on at ``N+1``.
        Refused while the sink has open xids. Stop the query first.
        """
        if not forget_epochs and committed_through is None:
            raise ValueError("reset needs --forget-epochs, --committed-through N, or both")
        outcome = self._coordinator(sink_id).reset_stream(forget_epochs, committed_through)
        return {"sinks": [outcome.to_dict()]}


def access_denied(whose: str = "a sink's") -> AccessDenied:
    """The operator's refusal when ZooKeeper keeps ``whose`` records from this session."""
    return AccessDenied(f"ZooKeeper refuses this session access to {whose} records (their "
                        "ACL); set TXSINK_ZOOKEEPER_AUTH=user:password to the credentials "
                        "the sink was written with")


_FOREIGN_REASONS = {
    "other_root": "another root's (tag r{tag}): run gc with that root",
    "untagged": "no root tag (older name format): check its xid, then drop it by hand",
    "unparseable": "not a staging table name",
}


def _decisions(*groups: list[Any]) -> list[dict[str, Any]]:
    """Operators' recorded decisions (given-up partitions, strategy switches), per xid."""
    found = []
    for record in sorted((x for g in groups for x in g), key=lambda x: x.epoch):
        metrics = EpochMetrics.from_dict(record.metrics)
        if metrics.given_up or metrics.strategy_switches:
            found.append({"epoch": record.epoch, "state": record.state.value,
                          "given_up": [g.to_dict() for g in metrics.given_up],
                          "strategy_switches": metrics.strategy_switches})
    return found


def _render_decisions(decisions: list[dict[str, Any]]) -> list[str]:
    lines = []
    for d in decisions:
        for g in d["given_up"]:
            why = f": {g['reason']}" if g.get("reason") else ""
            lines.append(f"epoch {d['epoch']} ({d['state']}): GIVEN UP partition "
                         f"{g['partition']} of branch {g['branch']}, {g['rows']} rows for "
                         f"{g['table']} never published{why}")
        for branch, switch in d["strategy_switches"].items():
            lines.append(f"epoch {d['epoch']} ({d['state']}): branch {branch} published with "
                         f"{switch['to']} instead of {switch['from']} (operator)")
    return lines


class _Switch:
    """One branch to publish with ``new`` instead of ``old`` (see ``recover``)."""

    def __init__(self, branch_id: str, manifest: server_ext.Manifest, server: str | None,
                 old: str, new: str, why: str) -> None:
        self.branch_id, self.manifest, self.server = branch_id, manifest, server
        self.old, self.new, self.why = old, new, why

    def __str__(self) -> str:
        return f"branch {self.branch_id} published with {self.new} instead of {self.old}"


def render(command: str, result: dict[str, Any]) -> str:
    """Human-readable text for one command's result."""
    if command == "reset":
        return _render_reset(result)
    protected = result.get("protected_sinks") or []
    lines: list[str] = [f"left out {len(protected)} sink(s) whose records need other "
                        f"ZooKeeper credentials (TXSINK_ZOOKEEPER_AUTH): {', '.join(protected)}"
                        ] if protected else []
    if command == "gc":
        abandoned = result.get("abandoned", {})
        for a in abandoned.get("rolled_back", []):
            lines.append(f"rolled back abandoned xid {a['sink_id']}/{a['epoch']} ({a['detail']}, "
                         f"{a['age_s']:.0f} s old); staging: {', '.join(a['staging']) or 'none'}")
        for a in abandoned.get("failed", []):
            lines.append(f"NOT rolled back: {a['detail']}")
        for a in abandoned.get("left", []):
            lines.append(f"left undecided xid {a['sink_id']}/{a['epoch']}: {a['detail']}")
        lines.append(f"root {result['root']} (staging tag r{result['root_tag']}): "
                     f"dropped {len(result['dropped_staging'])} staging table(s)")
        lines += [f"  {name}" for name in result["dropped_staging"]]
        if result["foreign_staging"]:
            lines.append(f"left {len(result['foreign_staging'])} table(s) of the staging "
                         "database that this root does not own (not dropped):")
            lines += [f"  {f['server']}  {f['table']}  "
                      + _FOREIGN_REASONS[f["reason"]].format(tag=f["root_tag"])
                      for f in result["foreign_staging"]]
        for sink_id, epochs in result["pruned"].items():
            lines.append(f"pruned {len(epochs)} finished xid(s) of {sink_id}")
        for sink_id, age in result.get("forgotten_sinks", {}).items():
            lines.append(f"forgot one-off sink {sink_id} (idle {age / 86400:.1f} days)")
        return "\n".join(lines)
    if not result["sinks"]:
        return "\n".join(lines + ["no sinks under this root (--zookeeper host:port[/chroot], "
                                   "--zk-root)"])
    for sink in result["sinks"]:
        if command == "status":
            lines.append(f"{sink['sink_id']}: generation {sink['generation']}, "
                         f"last committed epoch {sink['last_committed']}")
            lines.append(f"  {_render_health(SinkHealth.from_json(sink['health']))}")
            for x in sink["open"]:
                flag = "  IN DOUBT: run txsink recover" if x["epoch"] in sink["in_doubt"] else ""
                if x.get("abandoned"):
                    flag = (f"  ABANDONED ({x['liveness_detail']}): txsink recover or gc rolls "
                            f"it back; staging: {', '.join(x['staging']) or 'none recorded'}")
                elif x.get("liveness"):
                    flag = f"  ({x['liveness_detail']})"
                lines.append(f"  epoch {x['epoch']}: {x['state']} for {x['age_s']}s{flag}")
            for m in sink["recent"]:
                timing = ("finished by recovery" if m.get("finished_by") == "recovery" else
                          "no timings recorded (finished by an unknown actor)"
                          if m.get("finished_by") == "unknown" else
                          f"commit {m.get('commit_ms', '?')} ms, "
                          f"latency {m.get('latency_ms', '?')} ms")
                lines.append(f"  epoch {m['epoch']}: {m.get('rows', '?')} rows, "
                             f"{m.get('branches', '?')} branches, {timing}")
            lines += [f"  {line}" for line in _render_decisions(sink.get("operator_decisions",
                                                                         []))]
        elif command in ("recover", "resolve"):
            lines.append(f"{sink['sink_id']}: " + ("; ".join(sink["actions"]) or "nothing to do"))
            lines += [f"  NOT FINISHED: {a}" for a in sink["failed"]]
            lines += [f"  WHAT TO DO: {hint}" for hint in sink.get("way_out", [])]
        else:
            lines += _render_verify(sink)
    lines += [f"gave up partition {g['partition']} of branch {g['branch']} "
              f"({g['rows']} rows for {g['table']}, never published; they are dropped with "
              f"the staging table txsink_staging.{g['staging']} when the xid finishes)"
              for g in result.get("given_up", [])]
    return "\n".join(lines)


def _render_health(health: SinkHealth) -> str:
    """``status``'s one line of the alert figures (``txsink/status_report.py``)."""
    opened = ", ".join(f"{n.count} {state}" + (f" (oldest {n.oldest_age_s:.0f} s)"
                                                 if n.oldest_age_s is not None else "")
                       for state, n in health.open.items() if n.count) or "none"
    age = (f", {health.last_committed_age_s:.0f} s ago"
           if health.last_committed_age_s is not None else "")
    staging = "staging not measured (no server known: --url)"
    if health.staging is not None:
        s = health.staging
        staging = (f"staging {s.tables} table(s), {s.bytes} bytes, {s.leftover_tables} of no "
                   "open xid" + (f" (unread: {', '.join(s.servers_unread)})"
                                 if s.servers_unread else ""))
    return (f"health: open xids {opened}; abandoned {health.abandoned.count}; {staging}; "
            f"last commit epoch {health.last_committed_epoch}{age}")


def _staging_of(coord: Coordinator, epoch: int) -> list[str]:
    """The staging tables (and staging views) the xid's branches recorded as theirs."""
    names = []
    for branch in coord.branches(epoch):
        owner = BranchOwner.from_record(branch.owner)
        names += [name for name in (owner.staging, owner.view) if name] if owner else []
    return sorted(names)


def _liveness(coord: Coordinator, verdict: Verdict | None) -> dict[str, Any]:
    """``status``'s view of an undecided xid: abandoned or not, why, and its staging."""
    if verdict is None:
        return {}
    found: dict[str, Any] = {"abandoned": verdict.abandoned, "liveness": verdict.reason,
                             "liveness_detail": verdict.detail()}
    if verdict.abandoned:
        found["staging"] = _staging_of(coord, verdict.record.epoch)
    return found


def _commit_metrics(coord: Coordinator, record: XidRecord) -> dict[str, Any]:
    """A committed xid's figures as ``status`` shows them, and who finished it.

    The writer records its metrics (``finished_by: writer``) right after its commit;
    recovery marks the xids it published (``finished_by: recovery``). Where neither is
    recorded (a writer killed between its ``Committed`` write and its metrics, or a
    record older than these marks) nothing is claimed: ``finished_by`` is ``unknown``.
    Rows and branches come from the winners' records when the writer did not record
    them.
    """
    metrics = EpochMetrics.from_dict(record.metrics)
    if metrics.by_writer:
        return replace(metrics, finished_by=WRITER).shown()
    return _winners_metrics(coord, record, metrics)


def _winners_metrics(coord: Coordinator, record: XidRecord,
                     metrics: EpochMetrics) -> dict[str, Any]:
    """What the winners' records say of an xid whose writer recorded no metrics:
    rows and task branches, no timings."""
    payloads = [from_record(b.manifest) for b in coord.branches(record.epoch, record.winners)]
    return replace(metrics, finished_by=metrics.finished_by or UNKNOWN,
                   rows=sum(p.rows for p in payloads if p is not None),
                   branches=sum(len(p.sources) if isinstance(p, CombinedBranch) and p.sources
                                else 1 for p in payloads if p is not None)).shown()


def _render_verify(sink: dict[str, Any]) -> list[str]:
    """``ok`` only when nothing is anomalous *and* nothing went unjudged."""
    found, target = sink["anomalies"], sink.get("target") or {"checked": False}
    unjudged, unknown = target.get("not_judged", []), target.get("unknown_history", [])
    spans = [f"{u['first']}..{u['last']}" if u["first"] != u["last"] else str(u["first"])
             for u in unknown]
    epochs = ", ".join(spans)
    if found:
        verdict = f"{len(found)} anomalies"
    elif unjudged:
        verdict = f"no anomaly found, but {len(unjudged)} target partition(s) not judged"
    elif unknown:
        verdict = f"no anomaly found, but what committed epochs {epochs} wrote is not checked"
    else:
        verdict = "ok" if target["checked"] else "ok (history only; target not checked)"
    lines = [f"{sink['sink_id']}: {verdict}"] + [f"  {a}" for a in found]
    if target["checked"]:
        lines.append(f"  target ({target['writers']} writers): {target['partitions_ok']} "
                     f"partition(s) match, {len(target['anomalies'])} anomalous, "
                     f"{len(unjudged)} not judged")
        lines += [f"    not judged: {n['detail']}" for n in unjudged]
        lines += [f"    not checked: committed epoch(s) {span}: {u['reason']}; what they "
                  "wrote is unknown" for span, u in zip(spans, unknown, strict=True)]
    return lines


def _render_reset(result: dict[str, Any]) -> str:
    lines = []
    for sink in result["sinks"]:
        done = []
        if sink["forget_epochs"]:
            done.append(f"forgot {sink['forgotten_epochs']} xid(s) (last committed epoch "
                        f"was {sink['last_committed_before']})")
        if sink["committed_through"] is not None:
            done.append(f"micro-batches 0..{sink['committed_through']} count as committed")
        lines.append(f"{sink['sink_id']}: " + "; ".join(done) + f"; generation "
                     f"{sink['generation']}; the next streaming query to write adopts the "
                     f"sink (was {sink['previous_owner'] or 'not recorded'})")
    return "\n".join(lines)
