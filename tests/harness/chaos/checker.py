"""The independent checker: count every source id in the target, over plain HTTP.

The proof of exactly-once must not trust the code it checks. This module shares nothing
with the sink's bookkeeping: it never imports ``txsink``'s writers, ``coordinator`` or
``server_ext``, never reads ZooKeeper, and asks ClickHouse one ``GROUP BY id`` with bare
``requests``. Every source row carries a unique id, so

- an id seen more than once is a **duplicate**,
- an expected id not seen is a **loss**,
- an id seen that was never sent is **unexpected** (a corrupted or foreign row).

The audit verifier's anomalies (``txsink verify --json``, the sink's own view of its
history) are reported next to the counts, never instead of them.

Usage::

    result = check(url, "db.events", expected=range(0, 10_000))
    print(result.summary())
    assert result.ok
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import requests


class CheckerError(RuntimeError):
    """The target could not be read; no verdict is possible."""


@dataclass(frozen=True)
class CheckResult:
    """What the target holds compared to what the source sent."""

    expected: int
    found_rows: int           # rows in the target, duplicates included
    found_ids: int            # distinct ids in the target
    duplicates: int           # extra copies: found_rows - found_ids
    duplicated_ids: tuple[int, ...]   # a sample of ids seen more than once
    losses: int
    lost_ids: tuple[int, ...]         # a sample of expected ids not found
    unexpected: int
    unexpected_ids: tuple[int, ...]
    anomalies: tuple[str, ...] = field(default=())  # from the audit verifier, if given

    @property
    def exactly_once(self) -> bool:
        """No duplicate, no loss, nothing unexpected."""
        return self.duplicates == 0 and self.losses == 0 and self.unexpected == 0

    @property
    def ok(self) -> bool:
        """Exactly once, and the audit verifier (if asked) found nothing."""
        return self.exactly_once and not self.anomalies

    def summary(self) -> str:
        text = (f"expected={self.expected} found={self.found_rows} "
                f"duplicates={self.duplicates} losses={self.losses} "
                f"unexpected={self.unexpected}")
        if self.duplicated_ids:
            text += f" (duplicated e.g. {list(self.duplicated_ids)})"
        if self.lost_ids:
            text += f" (lost e.g. {list(self.lost_ids)})"
        if self.anomalies:
            text += f" anomalies={len(self.anomalies)}: {'; '.join(self.anomalies[:3])}"
        return text


def _quote(identifier: str) -> str:
    return "`" + identifier.replace("\\", "\\\\").replace("`", "\\`") + "`"


def id_counts(url: str, table: str, id_column: str = "id", timeout: float = 60.0,
              auth: tuple[str, str] | None = None) -> dict[int, int]:
    """How many times each id is visible in ``table`` (``db.name``)."""
    db, name = table.split(".", 1)
    sql = (f"SELECT {_quote(id_column)}, count() FROM {_quote(db)}.{_quote(name)} "
           f"GROUP BY {_quote(id_column)} FORMAT TabSeparated")
    try:
        resp = requests.post(url, data=sql.encode(), timeout=timeout, auth=auth,
                             params={"wait_end_of_query": "1"})
    except requests.RequestException as exc:
        raise CheckerError(f"cannot read {table} at {url}: {exc}") from None
    body = resp.content.decode("utf-8")
    if resp.status_code != 200:
        raise CheckerError(f"cannot read {table}: {body.strip()[:300]}")
    counts: dict[int, int] = {}
    for line in body.splitlines():
        key, count = line.split("\t")
        counts[int(key)] = int(count)
    return counts


def count_in_range(url: str, table: str, low: int, high: int, id_column: str = "id",
                   timeout: float = 10.0) -> int:
    """Rows of ``table`` whose id is in ``[low, high)``: one epoch's share, for triggers."""
    db, name = table.split(".", 1)
    column = _quote(id_column)
    sql = (f"SELECT count() FROM {_quote(db)}.{_quote(name)} "
           f"WHERE {column} >= {int(low)} AND {column} < {int(high)}")
    try:
        resp = requests.post(url, data=sql.encode(), timeout=timeout)
    except requests.RequestException as exc:
        raise CheckerError(f"cannot read {table} at {url}: {exc}") from None
    body = resp.content.decode("utf-8")
    if resp.status_code != 200:
        raise CheckerError(f"cannot read {table}: {body.strip()[:300]}")
    return int(body.strip())


def compare(counts: dict[int, int], expected: Iterable[int],
            anomalies: Iterable[str] = (), sample: int = 5) -> CheckResult:
    """Pure comparison of observed id counts with the ids the source sent."""
    wanted = set(expected)
    duplicated = sorted(i for i, c in counts.items() if c > 1)
    lost = sorted(wanted - counts.keys())
    unexpected = sorted(counts.keys() - wanted)
    rows = sum(counts.values())
    return CheckResult(
        expected=len(wanted), found_rows=rows, found_ids=len(counts),
        duplicates=rows - len(counts), duplicated_ids=tuple(duplicated[:sample]),
        losses=len(lost), lost_ids=tuple(lost[:sample]),
        unexpected=len(unexpected), unexpected_ids=tuple(unexpected[:sample]),
        anomalies=tuple(anomalies),
    )


def check(url: str, table: str, expected: Iterable[int], *,
          verifier: dict | None = None, id_column: str = "id") -> CheckResult:
    """Count ids in ``table`` against ``expected``; add the verifier's anomalies if given."""
    return compare(id_counts(url, table, id_column), expected, verifier_anomalies(verifier))


def verifier_anomalies(verifier: dict | None) -> list[str]:
    """Flatten a ``txsink verify --json`` result into one line per anomaly."""
    if not verifier:
        return []
    lines = []
    for sink in verifier.get("sinks", []):
        for anomaly in sink.get("anomalies", []):
            lines.append(f"{sink.get('sink_id', sink.get('sink', '?'))}: {anomaly}")
    return lines


def run_verifier(zookeeper: str, zk_root: str = "/txsink", sink: str | None = None,
                 timeout: float = 120.0, store: Mapping[str, str] | None = None) -> dict:
    """Run the operator's audit verifier (``txsink verify --json``) as its own process.

    It is the sink's own account of its history; running the CLI keeps this module free
    of the sink's code while still reporting what the verifier sees. ``store``: the sink's
    options that name its coordinator's store (``coordinator``, ``records_url``, ...),
    each given as the verifier's argument of the same name; none: the records are in
    ``zookeeper``.
    """
    argv = [sys.executable, "-m", "txsink", "verify", "--json", "--zookeeper", zookeeper,
            "--zk-root", zk_root]
    for name, value in (store or {}).items():
        argv += [f"--{name.replace('_', '-')}", value]
    if sink:
        argv += ["--sink", sink]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise CheckerError(f"txsink verify failed (exit {proc.returncode}): {detail[0]}") from None
