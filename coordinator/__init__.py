"""coordinator: the driver-side two-phase-commit coordinator of txsink.

Transactions (xids), their branches, decisions, fencing, recovery, retention and the
audit verifier, kept in ZooKeeper (or ClickHouse Keeper) through kazoo. It knows nothing
about Spark or SQL: publishing and rolling back a branch are callbacks it is handed.
"""

from coordinator.audit import Anomaly, AnomalyKind, audit
from coordinator.callbacks import CallbackPolicy
from coordinator.coordinator import Coordinator
from coordinator.errors import (
    CallbackFailed,
    CoordinatorError,
    Fenced,
    InvalidTransition,
    PublishFailed,
    RecordTooLarge,
    RecoveryIncomplete,
    RollbackFailed,
    UnknownBranch,
    UnknownXid,
    WinnerNotPrepared,
    XidAborted,
    XidDecided,
)
from coordinator.ledger import Ledger
from coordinator.records import BranchRecord, XidRecord
from coordinator.recovery import RecoveryAction, RecoveryReport
from coordinator.states import BranchState, XidState

__all__ = [
    "Anomaly",
    "AnomalyKind",
    "BranchRecord",
    "BranchState",
    "CallbackFailed",
    "CallbackPolicy",
    "Coordinator",
    "CoordinatorError",
    "Fenced",
    "InvalidTransition",
    "Ledger",
    "PublishFailed",
    "RecordTooLarge",
    "RecoveryAction",
    "RecoveryIncomplete",
    "RecoveryReport",
    "RollbackFailed",
    "UnknownBranch",
    "UnknownXid",
    "WinnerNotPrepared",
    "XidAborted",
    "XidDecided",
    "XidRecord",
    "XidState",
    "audit",
]
