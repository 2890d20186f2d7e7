"""coordinator: the driver-side two-phase-commit coordinator of txsink.

Transactions (xids), their branches, decisions, fencing, recovery, retention and the
audit verifier (writers use :class:`Coordinator`, operators :class:`SinkAdmin` too), kept
in a node store (``nodes.py``): ZooKeeper (or ClickHouse Keeper) through kazoo, or
KeeperMap tables of ClickHouse (``keepermap/``). It knows nothing about Spark or SQL:
publishing and rolling back a branch are callbacks it is handed.
"""

from coordinator.audit import Anomaly, AnomalyKind, audit
from coordinator.auth import AccessDenied, DigestAuth, hosts_problem
from coordinator.branch_ledger import Ledger
from coordinator.callbacks import CallbackPolicy
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
from coordinator.records import BranchRecord, StreamRecord, XidRecord
from coordinator.recovery import RecoveryAction, RecoveryReport
from coordinator.sink_admin import SinkAdmin
from coordinator.states import BranchState, XidState
from coordinator.stream import ResetOutcome
from coordinator.tls import ZooKeeperTLS, ZooKeeperTLSError, tls_hint

__all__ = [
    "AccessDenied",
    "Anomaly",
    "AnomalyKind",
    "BranchRecord",
    "BranchState",
    "CallbackFailed",
    "CallbackPolicy",
    "CheckpointReplaced",
    "Coordinator",
    "CoordinatorError",
    "DigestAuth",
    "Fenced",
    "GaveUp",
    "InvalidTransition",
    "Ledger",
    "MalformedRecord",
    "PublishFailed",
    "PublishInProgress",
    "PublishLeaseLost",
    "RecordTooLarge",
    "RecoveryAction",
    "RecoveryIncomplete",
    "RecoveryReport",
    "ResetOutcome",
    "ResetRefused",
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
