"""Which publish strategy a target gets on a server, and whether a chosen one can work.

``choose_strategy`` picks from the server's detected capabilities and the target's engine
(never from the version number); ``strategy_problem`` says why a given strategy cannot
publish into a target (and what to use instead), ``target_engine_problem`` why no strategy
can. Pure functions of their arguments: no server, safe from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from server_ext.capabilities import Capabilities


class Strategy(StrEnum):
    """How a branch's partitions are made visible (``server_ext/publish/`` has one module each).

    A member is its name as a string: options, payloads and ledgers store the text."""

    MOVE = "move"
    ATTACH_REPLICATED = "attach_replicated"
    ATTACH_MARKED = "attach_marked"

    def __repr__(self) -> str:
        return repr(self.value)  # messages quote the name as the user spells it


STRATEGIES: tuple[Strategy, ...] = tuple(Strategy)


class ReplicatedTarget(Protocol):
    """Anything that says whether a target table is Replicated (``TargetTable`` does)."""

    replicated: bool


def choose_strategy(caps: Capabilities, target: ReplicatedTarget) -> Strategy:
    """The publish strategy for ``target`` on this server.

    A Replicated target always gets ``attach_replicated``: MOVE PARTITION needs source and
    destination of the same engine family and staging is a plain MergeTree, while the
    target's replication log deduplicates a repeated attach. A plain target gets ``move``
    where the server has it (a repeat moves nothing) and ``attach_marked`` otherwise.
    """
    if target.replicated:
        return Strategy.ATTACH_REPLICATED
    return Strategy.MOVE if caps.move_partition else Strategy.ATTACH_MARKED


# -- checking a strategy against a server and a target (before anything is staged) --------

MOVE_STATEMENT = "ALTER TABLE ... MOVE PARTITION ... TO TABLE"


class DescribedTarget(ReplicatedTarget, Protocol):
    """A target as ``describe_table`` reports it (``TargetTable`` is one)."""

    engine: str
    engine_full: str


@dataclass(frozen=True)
class StrategyProblem:
    """Why ``strategy`` cannot publish into a target on a server, and what to use instead.

    ``statement_runs`` says whether the server would still execute the strategy's
    publishing statement. False means it refuses that statement outright (or publish
    refuses before sending it), so a publish with this strategy can never have made a
    row visible: that is what lets ``txsink recover --strategy`` switch a stuck xid to
    ``instead`` without reading the failed strategy's ledger intent as evidence of an
    attach. True (``attach_marked`` on a Replicated target) means rows may be attached,
    only the strategy's reasoning about a repeat is unsound there.
    """

    strategy: str
    lacks: str  # a sentence: what the server or the target lacks
    instead: Strategy  # the strategy to use instead
    statement_runs: bool


def strategy_problem(caps: Capabilities, target: DescribedTarget | None,
                     strategy: str) -> StrategyProblem | None:
    """None if ``strategy`` can publish into ``target`` on the server of ``caps``.

    ``target=None`` asks about the server alone (any target): what a multi-table
    transaction can check before it knows its tables. The rules, each measured or read
    from the server's behaviour:

    - ``move`` needs MOVE PARTITION (probed, absent on 18.16) and a non-Replicated target:
      MOVE PARTITION needs source and destination of the same engine family and staging
      is a plain MergeTree (the server refuses the statement, NOT_IMPLEMENTED).
    - ``attach_replicated`` needs a Replicated target (its repeat relies on the
      replication log's block ids; publish refuses a plain target before any statement)
      and hence a server with ZooKeeper/Keeper.
    - ``attach_marked`` needs a non-Replicated target: a Replicated table numbers blocks
      per partition in ZooKeeper and may drop attached parts as duplicates, so the
      watermark cannot decide a repeat (the ATTACH itself would run).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown publish strategy {strategy!r}; expected one of "
                         f"{', '.join(STRATEGIES)}")
    replicated = target is not None and target.replicated
    engine = f" ({target.engine})" if target is not None else ""
    if strategy == Strategy.MOVE:
        fallback = Strategy.ATTACH_REPLICATED if replicated else Strategy.ATTACH_MARKED
        if not caps.move_partition:
            return StrategyProblem(strategy, f"the server (ClickHouse {caps.version_text}) has "
                                   f"no {MOVE_STATEMENT}", fallback, statement_runs=False)
        if replicated:
            return StrategyProblem(strategy, f"the target is Replicated{engine} and "
                                   f"{MOVE_STATEMENT} needs source and target of one engine "
                                   "family (staging is a plain MergeTree)", fallback,
                                   statement_runs=False)
        return None
    if strategy == Strategy.ATTACH_REPLICATED:
        fallback = Strategy.MOVE if caps.move_partition else Strategy.ATTACH_MARKED
        if target is None and not caps.keeper:
            return StrategyProblem(strategy, "the server has no ZooKeeper/Keeper configured, "
                                   "so none of its tables is Replicated", fallback,
                                   statement_runs=False)
        if target is not None and not replicated:
            return StrategyProblem(strategy, f"the target is not Replicated{engine}; "
                                   "attach_replicated relies on the replication log to "
                                   "deduplicate a repeated attach", fallback,
                                   statement_runs=False)
        return None
    if replicated:
        return StrategyProblem(strategy, f"the target is Replicated{engine}: its block numbers "
                               "are allocated per partition and it may drop attached parts as "
                               "duplicates, so the attach_marked watermark cannot decide a "
                               "repeat", Strategy.ATTACH_REPLICATED, statement_runs=True)
    return None


def supported_strategies(caps: Capabilities, target: DescribedTarget) -> list[Strategy]:
    """Every strategy that can publish into ``target`` on this server, the one
    :func:`choose_strategy` picks first."""
    first = choose_strategy(caps, target)
    ordered = [first, *(s for s in STRATEGIES if s != first)]
    return [s for s in ordered if strategy_problem(caps, target, s) is None]


def target_engine_problem(target: DescribedTarget, *, through_distributed: bool = True
                   ) -> str | None:
    """None if staged partitions can be published into a table of this engine.

    Publishing hands whole partitions of a staging MergeTree to the target (ATTACH, MOVE
    or REPLACE PARTITION), which only a MergeTree-family table accepts (measured on 18.16
    and the 26.x engine: Replacing/Summing/Collapsing/Aggregating targets accept a plain
    MergeTree's partitions). The deprecated ``MergeTree(date, key, granularity)`` syntax
    has another part format and cannot be staged. A ``Null`` table (an ingest table whose
    rows live only in its materialized views) is staged as ``Null``: its staging views
    fire, and nothing is published into it. ``through_distributed``: the table is a
    target, which may also be a Distributed table over such tables (a view's table may not).
    """
    if target.engine == "Null":
        return None
    if not target.engine.endswith("MergeTree"):
        over = " (or a Distributed table over such tables)" if through_distributed else ""
        return (f"its engine is {target.engine}; clickhouse_tx publishes whole partitions, "
                f"which only a MergeTree-family table{over} accepts")
    if " ORDER BY " not in f" {target.engine_full} ":
        return ("it uses the deprecated MergeTree(date, key, granularity) syntax, whose "
                "parts have another format; recreate it with PARTITION BY / ORDER BY")
    return None
