"""The KeeperMap node store: the coordinator's tree in a KeeperMap table, one log per sink.

A second implementation of :class:`~coordinator.plumbing.nodes.NodeStore` for deployments without a
ZooKeeper of their own (ClickHouse Cloud): every record the coordinator keeps lives in a
KeeperMap table of the ClickHouse the sink writes to, reached through a small key-value
table (:class:`KeyValueTable`; ``server_ext.ddl.KeeperMapTable`` is the SQL one).

Its parts: ``table.py`` (the key-value table it writes through, and its keys), ``log.py``
(why a log, and the fold of a sink's log into its tree), ``log_store.py`` (the store
itself: reads, appends, sessions with an expiry), ``heartbeat.py`` (the thread that
refreshes a session), ``snapshot.py`` (snapshots of the fold, and the retention that
trims the log).

Limits: an entry is one Keeper node, so a record near the coordinator's 900 kB cap
(escaped once more inside its entry) may exceed Keeper's 1 MB node limit.
"""

from coordinator.plumbing.keepermap.log import CLOCK_MARGIN, Stat
from coordinator.plumbing.keepermap.log_store import KeeperMapNodes
from coordinator.plumbing.keepermap.table import KeyValueTable

__all__ = ["CLOCK_MARGIN", "KeeperMapNodes", "KeyValueTable", "Stat"]
