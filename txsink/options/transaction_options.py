"""The options that name the sink's transactions: ``sink_id``, ``txn_version``,
``recover_on_start``, ``retention``, Spark's ``checkpointLocation`` and the internal
options by which :func:`txsink.transaction` joins a write to its xid.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from txsink.options.parse_util import OptionError, given, numbers
from txsink.options.sink_ids import stream_sink_id_of_checkpoint

#: Internal options set by :func:`txsink.transaction` to join its xid.
TX_SINK_ID = "txsink.tx.sink_id"
TX_EPOCH = "txsink.tx.epoch"
TX_GENERATION = "txsink.tx.generation"
#: The option ``retention`` (seconds): finished xids older than this are folded into the
#: sink's summary and removed by the writers; 0 keeps them for ever.
DEFAULT_RETENTION, MAX_RETENTION = 3600.0, 10 * 365 * 86_400.0

OPTION_NAMES = ("sink_id", "txn_version", "recover_on_start", "retention")
FIELDS = (*OPTION_NAMES, "checkpoint_location", "tx_epoch", "tx_generation")


@dataclass(frozen=True)
class TransactionOptions:
    """Which sink the write's xids belong to, and how its records are kept."""

    sink_id: str | None = None
    txn_version: int | None = None  # with sink_id: names a batch job's data across reruns
    checkpoint_location: str | None = None  # streaming: Spark's checkpointLocation
    recover_on_start: bool = True
    # seconds a finished xid's records stay before the writers fold and remove them
    # (coordinator/upkeep/retention.py); 0: kept for ever
    retention: float = DEFAULT_RETENTION
    tx_epoch: int | None = None  # txsink.transaction(): the xid this write joins
    tx_generation: int | None = None

    def in_transaction(self) -> bool:
        return self.tx_epoch is not None

    def resolved_sink_id(self, streaming: bool) -> str:
        """The sink id: the option, else (streaming) one derived from the checkpoint.

        A streaming query keeps its checkpoint across restarts, so the derived id is
        stable; a batch job without ``sink_id`` gets a fresh one (each job is its own
        writer).
        """
        if self.sink_id:
            return self.sink_id
        if streaming:
            if not self.checkpoint_location:
                raise OptionError("streaming writes need sink_id or a checkpointLocation")
            return stream_sink_id_of_checkpoint(self.checkpoint_location)
        return f"batch-{uuid.uuid4().hex[:16]}"


ONE_OFF_SINK = re.compile(r"^batch-[0-9a-f]{16}$")  # what resolved_sink_id gives a batch job


def is_one_off(sink_id: str) -> bool:
    """Whether ``sink_id`` is a one-off batch job's (written once, never again)."""
    return ONE_OFF_SINK.match(sink_id) is not None


def parse(values: dict[str, object]) -> TransactionOptions:
    """These options of ``values``, checked, as a record."""
    numbers(values, (("tx_epoch", int, 0, 2**63 - 1), ("tx_generation", int, 0, 2**31 - 1),
                     ("txn_version", int, 0, 2**63 - 1), ("retention", float, 0.0, MAX_RETENTION)))
    if "recover_on_start" in values:
        flag = str(values["recover_on_start"]).lower()
        if flag not in ("true", "false"):
            raise OptionError(f"option recover_on_start={flag!r} must be true or false")
        values["recover_on_start"] = flag == "true"
    if "txn_version" in values and not values.get("sink_id"):
        raise OptionError("option txn_version needs sink_id: the pair (sink_id, txn_version) "
                          "names the job's data across reruns")
    return TransactionOptions(**given(values, FIELDS))  # type: ignore[arg-type]
