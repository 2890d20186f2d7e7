"""The harness's command line, run from a checkout (``./run`` calls it):

    python -m tests.harness services up|down|status   real ClickHouse + ZooKeeper on 127.0.0.1
        [--shards N --replicas M]       ... plus an N×M ClickHouse cluster (txsink_cluster)
        [--modern | --modern-only]      ... plus (or only) a modern ClickHouse 26.x (chdb)
    python -m tests.harness demo [--server modern]   the exactly-once demo under faults
        [--coordinator keepermap]       ... records in a KeeperMap table (--server modern)
        [--way foreach_batch]           ... through writeStream.foreachBatch (PySpark 3.5+)
    python -m tests.harness spark-test [--spark 3.5]... [-- PYTEST ARGS]
                                        pytest (default: -m every_spark) under other
                                        PySparks, each in its cached virtualenv
    python -m tests.harness spark-venv [3.5 ...] [--bench]   make (or find) a version's
                                        virtualenv (--bench: and the benchmark's clients)

The harness is not part of the sink: a ``pip install txsink`` has none of it.
"""

from __future__ import annotations

import argparse
import logging
import sys

from tests.harness.services import Services
from txsink.ops.cli import _count, _positive


def _services(args: argparse.Namespace) -> int:
    services = Services.from_env()
    if args.shards is not None:
        services.shards = args.shards
    if args.replicas is not None:
        services.replicas = args.replicas
    if args.modern_http_port is not None:
        services.modern_http_port = args.modern_http_port
    if args.modern_tcp_port is not None:
        services.modern_tcp_port = args.modern_tcp_port
    if args.action == "up":
        services.up(modern=args.modern, modern_only=args.modern_only)
        if not args.modern_only:
            print(f"ZooKeeper  {services.zookeeper.hosts}  ready")
            _print_zookeeper_tls(services.zookeeper)
            print(f"ClickHouse {services.clickhouse.url}  ready")
            _print_https(services.clickhouse)
        if services.has_cluster and not args.modern_only:
            cluster = services.cluster()
            print(f"cluster    {cluster.name}: {cluster.shard_count} shard(s) x "
                  f"{cluster.replica_count} replica(s)  ready")
            for number, urls in enumerate(cluster.shard_urls(), start=1):
                print(f"  shard {number}: {'  '.join(urls)}")
        if args.modern or args.modern_only:
            modern = services.modern
            print(f"ClickHouse {modern.url}  ready (modern {modern.version()}, "
                  f"native port {modern.tcp_port})")
    elif args.action == "down":
        stopped = services.down(modern_only=args.modern_only)
        print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    else:
        for name, info in services.status(modern=args.modern or args.modern_only).items():
            state = info.get("state") or (
                "ready" if info["ready"] else ("starting" if info["pid"] else "down"))
            version = f" version={info['version']}" if info.get("version") else ""
            ca_file = f" ca_file={info['ca_file']}" if info.get("ca_file") else ""
            print(f"{name:<18} {info['address']:<24} pid={info['pid']} {state}{version}"
                  f"{ca_file}")
            if info.get("problem"):
                print(f"warning: {info['problem']}", file=sys.stderr)
    return 0


def _print_zookeeper_tls(zookeeper) -> None:
    """ZooKeeper's TLS port, as :func:`_print_https` (a server from an older config has
    none, and ``up`` leaves it running)."""
    if zookeeper.secure_hosts is None:
        return
    problem = zookeeper.tls_problem()
    if problem is None:
        print(f"ZooKeeper  {zookeeper.secure_hosts}  ready (TLS, ca_file {zookeeper.ca_file})")
    else:
        print(f"warning: {problem}", file=sys.stderr)


def _print_https(clickhouse) -> None:
    """The HTTPS listener of a server ``up`` found or started; a server still running from
    an older config has none, and ``up`` leaves it running (other runs may be using it)."""
    problem = clickhouse.https_problem()
    if problem is None:
        print(f"ClickHouse {clickhouse.https_url}  ready (ca_file {clickhouse.ca_file})")
    else:
        print(f"warning: {problem}", file=sys.stderr)


def demo_problem(args: argparse.Namespace) -> str | None:
    """Why ``./run demo`` cannot run with these arguments (None: it can)."""
    if args.coordinator == "keepermap" and args.server != "modern":
        return (f"--coordinator keepermap needs --server modern: ClickHouse {args.server} "
                "has no KeeperMap table engine to keep the coordinator's records in")
    if args.way == "datasource":
        from txsink.spark.versions import has_stream_arrow_writer

        if not has_stream_arrow_writer():
            import pyspark

            return (f"--way datasource needs PySpark 4.1 or later to stream through the data "
                    f"source (this is {pyspark.__version__}): use --way foreach_batch")
    return None


def _demo(args: argparse.Namespace) -> int:
    problem = demo_problem(args)
    if problem is not None:  # before anything starts
        print(f"./run demo: {problem}", file=sys.stderr)
        return 2
    from tests.harness import demo

    return demo.main(args)


def _spark_test(args: argparse.Namespace) -> int:
    from tests.harness import spark_versions

    minors = args.spark or list(spark_versions.every_run_versions())
    if not minors:
        print("spark-test: no PySpark version to run (TXSINK_SPARK_VERSIONS is empty)")
        return 0
    unknown = [m for m in minors if m not in spark_versions.VERSIONS]
    if unknown:
        print(f"spark-test: no PySpark {', '.join(unknown)}: choose among "
              f"{', '.join(spark_versions.VERSIONS)}", file=sys.stderr)
        return 2
    return spark_versions.run(minors, args.pytest_args)


def _spark_venv(args: argparse.Namespace) -> int:
    from tests.harness import spark_versions

    unknown = [m for m in args.version if m not in spark_versions.VERSIONS]
    if unknown:
        print(f"spark-venv: no PySpark {', '.join(unknown)}: choose among "
              f"{', '.join(spark_versions.VERSIONS)}", file=sys.stderr)
        return 2
    for minor in args.version or spark_versions.every_run_versions():
        venv = spark_versions.SparkVenv(minor)
        try:
            venv.ensure()
            if args.bench:
                venv.add_bench_packages()
        except spark_versions.SparkVenvError as exc:
            print(f"spark-venv: {exc}", file=sys.stderr)
            return 1
        print(venv.python)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.harness",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    svc = sub.add_parser("services", help="install/start/stop the local servers")
    svc.add_argument("action", choices=["up", "down", "status"],
                     help="start (installing what is missing), stop, or list the servers")
    svc.add_argument("--shards", type=_count, default=None,
                     help="also run a cluster of this many shards (default $TXSINK_SHARDS "
                          "or 0: no cluster); down stops any cluster server anyway")
    svc.add_argument("--replicas", type=_count, default=None,
                     help="replicas per cluster shard (default $TXSINK_REPLICAS or 0)")
    modern = svc.add_mutually_exclusive_group()
    modern.add_argument("--modern", action="store_true",
                        help="up: also start a modern ClickHouse 26.x (from chdb) beside the "
                             "18.16 server; status: always list it. down stops it anyway")
    modern.add_argument("--modern-only", action="store_true",
                        help="up/down: only the modern ClickHouse (no ZooKeeper, no 18.16)")
    svc.add_argument("--modern-http-port", type=_positive, default=None,
                     help="HTTP port of the modern server (default $TXSINK_MODERN_HTTP_PORT "
                          "or 8124)")
    svc.add_argument("--modern-tcp-port", type=_positive, default=None,
                     help="native port of the modern server (default $TXSINK_MODERN_TCP_PORT "
                          "or 9001)")
    svc.set_defaults(func=_services)

    demo = sub.add_parser("demo", help="exactly-once demo under injected faults")
    demo.add_argument("--epochs", type=_positive, default=12,
                      help="micro-batches per sink (default 12)")
    demo.add_argument("--rows-per-epoch", type=_positive, default=20_000,
                      help="rows per micro-batch (default 20,000)")
    demo.add_argument("--seed", type=int, default=None,
                      help="fixes which fault strikes which epoch (default: random, printed)")
    demo.add_argument("--server", choices=["18.16", "modern"], default="18.16",
                      help="the private ClickHouse the demo runs against and kills: the "
                           "18.16 server (default) or the modern 26.x one from chdb "
                           "(needs the chdb package)")
    demo.add_argument("--coordinator", choices=("zookeeper", "keepermap"),
                      default="zookeeper",
                      help="where clickhouse_tx keeps its coordinator's records: the demo's "
                           "ZooKeeper (default), or keepermap: a KeeperMap table of the "
                           "demo's ClickHouse, whose Keeper is that ZooKeeper (needs "
                           "--server modern; the sink gets no ZooKeeper)")
    demo.add_argument("--without-plain", action="store_true",
                      help="run clickhouse_tx alone, without the at-least-once comparison "
                           "through clickhouse_plain (half the time)")
    demo.add_argument("--way", choices=("datasource", "foreach_batch"), default=None,
                      help="how the stream reaches the sink: its data source (format("
                           "'clickhouse_tx'), PySpark 4.1+) or foreach_batch "
                           "(writeStream.foreachBatch(txsink.foreach_batch(...)) against a "
                           "plain foreachBatch insert; every PySpark from 3.5). Default: the "
                           "data source where this PySpark streams through it")
    demo.set_defaults(func=_demo)

    from tests.harness.spark_versions import EVERY_RUN, VERSIONS

    versions = ", ".join(f"{minor} (= {pin})" for minor, pin in VERSIONS.items())
    spark_test = sub.add_parser(
        "spark-test", help="pytest under other PySparks, each in its cached virtualenv")
    spark_test.add_argument(
        "--spark", action="append", choices=list(VERSIONS), metavar="MINOR",
        help=f"a PySpark to run under, repeatable: {versions} (default "
             f"$TXSINK_SPARK_VERSIONS or {' '.join(EVERY_RUN)})")
    spark_test.add_argument("pytest_args", nargs="*",
                            help="pytest's arguments, after -- (default: -m every_spark)")
    spark_test.set_defaults(func=_spark_test)

    spark_venv = sub.add_parser("spark-venv",
                                help="make (or find) a PySpark's virtualenv; prints its python")
    # no ``choices``: argparse checks an empty list against them (``_spark_venv`` checks)
    spark_venv.add_argument("version", nargs="*", metavar="VERSION",
                            help=f"of {', '.join(VERSIONS)} (default: those ./run test runs)")
    spark_venv.add_argument("--bench", action="store_true",
                            help="also install the benchmark's clients (clickhouse-connect, "
                                 "clickhouse-driver) for benchmarks/bench_spark_versions.py")
    spark_venv.set_defaults(func=_spark_venv)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.func(args)
