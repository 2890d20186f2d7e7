"""coordinator: the driver-side two-phase-commit coordinator of txsink.

Transactions (xids), their branches, decisions, fencing, recovery, retention and the
audit verifier (writers use :class:`Coordinator`, operators :class:`SinkAdmin` too), kept
in a node store (``plumbing/nodes.py``): ZooKeeper (or ClickHouse Keeper) through kazoo,
or KeeperMap tables of ClickHouse (``plumbing/keepermap/``). It knows nothing about Spark
or SQL: publishing and rolling back a branch are callbacks it is handed.

At the top, the two fronts (``coordinator.py``, ``sink_admin.py``) and the package's
errors; below them the wings ``protocol/``, ``upkeep/``, ``plumbing/`` and ``formats/``.
"""

from coordinator.coordinator import Coordinator
from coordinator.errors import (
    CallbackFailed,
    CheckpointReplaced,
    CoordinatorError,
    Fenced,
    GaveUp,
    InvalidTransition,
    MalformedRecord,
    PublishFailed,
    PublishInProgress,
    PublishLeaseLost,
    RecordTooLarge,
    RecoveryIncomplete,
    ResetRefused,
    RollbackFailed,
    SinkStateLost,
    SinkTakenOver,
    SinkTreeDamaged,
    StreamStateMismatch,
    UnknownBranch,
    UnknownXid,
    WinnerNotPrepared,
    XidAborted,
    XidDecided,
)
from coordinator.formats.records import BranchRecord, StreamRecord, XidRecord
from coordinator.formats.states import BranchState, XidState
from coordinator.plumbing.auth import AccessDenied, DigestAuth, hosts_problem
from coordinator.plumbing.tls import ZooKeeperTLS, ZooKeeperTLSError, tls_hint
from coordinator.protocol.branch_ledger import Ledger, put_together
from coordinator.protocol.callbacks import (
    AlreadyDone,
    BranchCallback,
    CallbackPolicy,
    Done,
    Failed,
    GroupCallback,
    Outcome,
    RetryLater,
)
from coordinator.protocol.completion import PublishGroups, grouped_by
from coordinator.protocol.recovery import RecoveryAction, RecoveryReport
from coordinator.protocol.stream import ResetOutcome
from coordinator.sink_admin import SinkAdmin
from coordinator.upkeep.audit import Anomaly, AnomalyKind, audit

__all__ = [
    "AccessDenied",
    "AlreadyDone",
    "Anomaly",
    "AnomalyKind",
    "BranchCallback",
    "BranchRecord",
    "BranchState",
    "CallbackFailed",
    "CallbackPolicy",
    "CheckpointReplaced",
    "Coordinator",
    "CoordinatorError",
    "DigestAuth",
    "Done",
    "Failed",
    "Fenced",
    "GaveUp",
    "InvalidTransition",
    "Ledger",
    "put_together",
    "GroupCallback",
    "PublishGroups",
    "grouped_by",
    "MalformedRecord",
    "Outcome",
    "PublishFailed",
    "PublishInProgress",
    "PublishLeaseLost",
    "RecordTooLarge",
    "RecoveryAction",
    "RecoveryIncomplete",
    "RecoveryReport",
    "ResetOutcome",
    "ResetRefused",
    "RetryLater",
    "RollbackFailed",
    "SinkAdmin",
    "SinkStateLost",
    "SinkTakenOver",
    "SinkTreeDamaged",
    "StreamRecord",
    "StreamStateMismatch",
    "UnknownBranch",
    "UnknownXid",
    "WinnerNotPrepared",
    "XidAborted",
    "XidDecided",
    "XidRecord",
    "XidState",
    "ZooKeeperTLS",
    "ZooKeeperTLSError",
    "audit",
    "hosts_problem",
    "tls_hint",
]
