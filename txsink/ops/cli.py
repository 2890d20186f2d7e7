"""The ``txsink`` command line: the operator commands.

    txsink status  --zookeeper H        sinks, last committed epoch, open xids, metrics
    txsink recover --zookeeper H --url U   roll committing xids forward, abandoned back
        [--sink S --epoch E] [--strategy T]  ... one xid; publish with T where the
                                        recorded strategy cannot run on the server
    txsink resolve ... --attached yes|no   an operator's decision on an in-doubt partition
    txsink resolve ... --give-up           give up partitions that can never be published
    txsink gc      --zookeeper H --url U   roll back abandoned xids; drop leftover staging
    txsink verify  --zookeeper H --url U   audit every sink's history, and its targets'
                                        rows against what its committed xids put there
    txsink reset   --sink S --forget-epochs | --committed-through N
                                        way out of a stream state mismatch (stop the query)

ClickHouse credentials come from TXSINK_CLICKHOUSE_USER / TXSINK_CLICKHOUSE_PASSWORD,
never from the command line (it would show in ``ps``); ZooKeeper's TLS CA file from
TXSINK_ZOOKEEPER_CA_FILE.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server_ext.ddl import KeeperMapTable


#: ``txsink records create --keeper-path``: the records table's path in the server's Keeper
RECORDS_KEEPER_PATH = "/txsink_records"


def create_records_table(url: str, records_table: str,
                         keeper_path: str = RECORDS_KEEPER_PATH,
                         credentials: dict[str, str] | None = None) -> KeeperMapTable:
    """Create the records table of ``coordinator=keepermap`` (``database.table``) on the
    ClickHouse at ``url``, idempotently, and return it: what
    ``txsink records create`` runs. Raises ``RecordsUnusable`` naming why the table cannot
    hold the records (a server without KeeperMap, a Keeper it cannot reach, ...)."""
    from server_ext.ddl import KeeperMapTable
    from txsink.core import connections

    database, _, table = records_table.partition(".")
    if not table:
        raise ValueError(f"--records-table {records_table!r} must be database.table")
    credentials = credentials or {}
    client = connections.clickhouse_client(url, credentials.get("user"),
                                           credentials.get("password"))
    records = KeeperMapTable(client, database, table)
    records.create(keeper_path)
    problem = records.problem()
    if problem is not None:
        raise connections.RecordsUnusable(problem)
    return records


def _records(args: argparse.Namespace, credentials: dict[str, str]) -> int:
    """``txsink records create``: the records table of ``coordinator=keepermap``."""
    from txsink.core.connections import RecordsUnusable

    try:
        records = create_records_table(args.records_url or args.url, args.records_table,
                                       args.keeper_path, credentials)
    except RecordsUnusable as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{args.records_table} on {records.client.url}: ready for coordinator=keepermap "
          f"(records_table={args.records_table})")
    return 0


def _operations(args: argparse.Namespace) -> int:
    from server_ext.sharding import url_problem
    from txsink.ops import commands
    from txsink.options import ZOOKEEPER_CA_FILE_VARIABLE, credentials_from, require_file

    url = getattr(args, "url", None)
    if url and url_problem(url):  # before any request: a query string may hold a password
        raise ValueError(f"--url: {url_problem(url)}")
    credentials = credentials_from(os.environ)
    ca_file = os.environ.get(ZOOKEEPER_CA_FILE_VARIABLE) or None
    require_file(ZOOKEEPER_CA_FILE_VARIABLE, ca_file)
    if args.command == "records":
        return _records(args, credentials)
    ops = commands.Operations(
        zookeeper=args.zookeeper, zk_root=args.zk_root, url=getattr(args, "url", None),
        user=credentials.get("user"), password=credentials.get("password"),
        zookeeper_auth=credentials.get("zookeeper_auth"), zookeeper_ca_file=ca_file,
        coordinator=args.coordinator, records_url=args.records_url,
        records_table=args.records_table,
    )
    try:
        if args.command == "status":
            result = ops.status(args.sink, unwatched_after=args.abandoned_after)
        elif args.command == "recover":
            result = ops.recover(args.sink, args.epoch, args.strategy,
                                 unwatched_after=args.abandoned_after)
        elif args.command == "resolve" and args.give_up:
            result = ops.give_up(args.sink, args.epoch, args.branch, args.partition,
                                 reason=args.reason or "")
        elif args.command == "resolve":
            result = ops.resolve(args.sink, args.epoch, args.branch, args.partition,
                                 attached=args.attached == "yes")
        elif args.command == "gc":
            from server_ext.sharding import parse_shard_urls

            servers = ([url for shard in parse_shard_urls(args.shards) for url in shard]
                       if args.shards else None)
            forget = args.forget_one_off_sinks_after
            result = ops.gc(args.grace, args.prune_older_than, servers,
                            commands.ONE_OFF_RETENTION if forget is None else forget or None,
                            unwatched_after=args.abandoned_after)
        elif args.command == "reset":
            result = ops.reset(args.sink, args.forget_epochs, args.committed_through)
        else:
            writers = ("exclusive" if args.exclusive_target else
                       "shared" if args.shared_target else "unknown")
            result = ops.verify(args.sink, args.committing_older_than,
                                target=not args.no_target, writers=writers)
    finally:
        ops.close()
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(commands.render(args.command, result))
    if args.command == "verify" and any(s["anomalies"] for s in result["sinks"]):
        return 1
    if args.command == "verify" and unjudged(result):
        return 4
    if args.command == "status" and any(s["in_doubt"] or s["damaged"] for s in result["sinks"]):
        return 3
    if args.command in ("recover", "resolve") and any(s["failed"] for s in result["sinks"]):
        return 3
    if args.command == "gc" and result["abandoned"]["failed"]:
        return 3
    return 0


def unjudged(result: dict) -> bool:
    """Whether verify left a target partition unjudged for a reason that fails it (a
    server it could not read, an xid publishing, replicas catching up, merges)."""
    from txsink.ops.verify_target import FAILING_CAUSES

    return any(n.get("cause") in FAILING_CAUSES for s in result["sinks"]
               for n in (s.get("target") or {}).get("not_judged", []))


def _seconds(text: str) -> float:
    """argparse type of a duration: a finite number of seconds, at least 0 (``nan``
    would compare false with every age, ``inf`` never comes)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of seconds, "
                                         "at least 0")
    return value


def _count(text: str, minimum: int = 0) -> int:
    """argparse type of an epoch, a count or a port: an integer of at least ``minimum``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least {minimum}")
    return value


def _positive(text: str) -> int:
    return _count(text, 1)


def _zk_root(text: str) -> str:
    """argparse type of ``--zk-root``: the sinks' rule
    (``coordinator.plumbing.paths.check_root``)."""
    from coordinator.plumbing.paths import check_root

    try:
        return check_root(text, "root")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


CREDENTIALS = ("ClickHouse credentials: TXSINK_CLICKHOUSE_USER and TXSINK_CLICKHOUSE_PASSWORD "
               "(environment), the same variables the sink reads; never put them in --url. "
               "ZooKeeper credentials of sinks written with zookeeper_auth: "
               "TXSINK_ZOOKEEPER_AUTH=user:password.")
ZOOKEEPER_TLS = ("ZooKeeper over TLS (--zookeeper naming its secureClientPort): "
                 "TXSINK_ZOOKEEPER_CA_FILE=<PEM file of the CA that verifies the server>, "
                 "as the sink's zookeeper_ca_file option.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="txsink", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    def ops_parser(name: str, help_text: str, url: bool,
                   credentials: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text,
                           epilog=f"{CREDENTIALS} {ZOOKEEPER_TLS}" if url or credentials
                           else ZOOKEEPER_TLS)
        p.add_argument("--zookeeper", default="127.0.0.1:2181",
                       help="host:port[/chroot] (default 127.0.0.1:2181)")
        p.add_argument("--zk-root", default="/txsink", type=_zk_root,
                       help="root of the sinks' records in ZooKeeper (the sinks' zk_root)")
        p.add_argument("--coordinator", choices=("zookeeper", "keepermap"),
                       default="zookeeper", help="where the sinks keep their records (the "
                       "sinks' coordinator option); keepermap: --records-url/--records-table")
        p.add_argument("--records-url", help="keepermap: the ClickHouse of the records "
                       "table (default: --url)")
        p.add_argument("--records-table", default="txsink.records",
                       help="keepermap: database.table of the records (the sinks' "
                       "records_table)")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if url:
            p.add_argument("--url", default="http://127.0.0.1:8123", help="ClickHouse HTTP URL")
        p.set_defaults(func=_operations)
        return p

    records = ops_parser("records", "create the KeeperMap table of the coordinator's "
                         "records (coordinator=keepermap)", url=True)
    records.add_argument("action", choices=("create",),
                         help="create: the table, with its format row (idempotent)")
    records.add_argument("--keeper-path", default=RECORDS_KEEPER_PATH,
                         help="the table's path in the server's Keeper")
    status = ops_parser("status", "sinks, committed epochs, in-doubt xids, metrics", url=False,
                        credentials=True)
    status.add_argument("--sink", help="only this sink id")
    status.add_argument("--url", default=None,
                        help="also count each sink's staging tables on this ClickHouse HTTP "
                             "URL (the servers its open xids recorded are always read)")
    abandoned_after = (
        "also count as abandoned an undecided xid that no writer watches (a streaming "
        "micro-batch, or one begun before writers recorded their liveness) once it has not "
        "changed for this many seconds; without it such xids are left. A running "
        "micro-batch is not watched either: give more than the longest micro-batch")
    status.add_argument("--abandoned-after", type=_seconds, default=None, metavar="SECONDS",
                        help=abandoned_after)
    recover = ops_parser("recover", "finish or roll back unfinished xids", url=True)
    recover.add_argument("--sink", help="only this sink id")
    recover.add_argument("--epoch", type=_count, default=None,
                         help="only this xid of --sink")
    recover.add_argument("--strategy", choices=["move", "attach_replicated", "attach_marked"],
                         default=None,
                         help="publish the winners of --sink's Committing xids (or --epoch's) "
                              "whose recorded strategy the server cannot run with this one "
                              "(recorded; see docs/ops.md)")
    recover.add_argument("--abandoned-after", type=_seconds, default=None, metavar="SECONDS",
                         help=abandoned_after + " (rolled back)")
    resolve = ops_parser("resolve", "decide an in-doubt partition, or give partitions up",
                         url=True)
    resolve.add_argument("--sink", required=True, help="the sink id of the in-doubt xid")
    resolve.add_argument("--epoch", type=_count, required=True, help="the xid's epoch")
    resolve.add_argument("--branch", required=True,
                         help="the winner branch (txsink status lists the winners)")
    resolve.add_argument("--partition", required=True, action="append",
                         help="partition id (repeat for several)")
    decision = resolve.add_mutually_exclusive_group(required=True)
    decision.add_argument("--attached", choices=["yes", "no"],
                          help="are the partition's rows in the target? (look first)")
    decision.add_argument("--give-up", action="store_true",
                          help="the partitions' rows can never be published: record that, "
                               "skip them and finish the xid (their staged rows are dropped)")
    resolve.add_argument("--reason", default=None,
                         help="with --give-up: why, recorded with the decision")
    gc = ops_parser("gc", "drop staging of finished xids; prune old xids", url=True)
    gc.add_argument("--shards", default=None,
                    help="sweep every server of a sharded target: 'u1,u2;u3,u4' (as the "
                         "shards option)")
    gc.add_argument("--grace", type=_seconds, default=3600.0,
                    help="seconds a staging table of an unknown xid is kept (default 3600)")
    gc.add_argument("--prune-older-than", type=_seconds, default=None,
                    help="also remove finished xids older than this many seconds")
    gc.add_argument("--forget-one-off-sinks-after", type=_seconds, default=None,
                    metavar="SECONDS",
                    help="remove the whole record of a one-off sink (a batch job without "
                         "sink_id) with nothing open and idle this long (default 7 days; "
                         "0: never)")
    gc.add_argument("--abandoned-after", type=_seconds, default=None, metavar="SECONDS",
                    help=abandoned_after + " (rolled back)")
    verify = ops_parser("verify", "audit the history; compare targets with committed rows",
                        url=True)
    verify.add_argument("--sink", help="only this sink id")
    verify.add_argument("--committing-older-than", type=_seconds, default=300.0,
                        help="report a Committing xid older than this many seconds as "
                             "stuck (default 300)")
    verify.add_argument("--no-target", action="store_true",
                        help="audit the ZooKeeper history only; do not read the targets")
    writers = verify.add_mutually_exclusive_group()
    writers.add_argument("--exclusive-target", action="store_true",
                         help="the sinks under --zk-root are their targets' only writers: "
                              "extra rows are duplicates")
    writers.add_argument("--shared-target", action="store_true",
                         help="the targets have other writers: extra rows are not judged")

    reset = ops_parser(
        "reset", "way out of a stream state mismatch: forget a streaming sink's epochs "
        "and/or record micro-batches 0..N as committed; the next query to write adopts "
        "the sink (stop the query first; refused while xids are open)", url=False)
    reset.add_argument("--sink", required=True, help="the sink id the error named")
    reset.add_argument("--forget-epochs", action="store_true",
                       help="the checkpoint was deleted or replaced: forget every epoch "
                            "the sink committed, so a new query takes the sink over with "
                            "its micro-batches counted from 0")
    reset.add_argument("--committed-through", type=_count, default=None, metavar="N",
                       help="the sink's state was lost: micro-batches 0..N are in the "
                            "target (look first), so a replay of N writes nothing and the "
                            "query goes on at N+1")

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:  # the client's reconnect chatter; failures come as one line
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)
        warnings.filterwarnings("ignore", message="No chroot path exists")
    try:
        return args.func(args)
    except BrokenPipeError:  # the reader went away (`txsink status | head`): say nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as exc:  # noqa: BLE001 - operator-facing: one clear line, no trace
        if args.verbose:
            raise
        from kazoo.exceptions import NoAuthError

        from txsink.ops.commands import access_denied

        if isinstance(exc, NoAuthError):
            exc = access_denied()
        print(f"txsink {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
