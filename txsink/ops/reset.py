"""``txsink reset``: the way out of a stream state mismatch (``coordinator/protocol/stream.py``)."""

from __future__ import annotations

from typing import Any

from coordinator.sink_admin import SinkAdmin
from txsink.ops.session import Session, shown_epoch


class ResetCommand(Session):
    def reset(self, sink_id: str, forget_epochs: bool = False,
              committed_through: int | None = None) -> dict[str, Any]:
        """The way out of a stream state mismatch (``coordinator/protocol/stream.py``).

        ``forget_epochs``: a new query (new or deleted checkpoint) takes the sink over,
        its micro-batches counted from 0. ``committed_through=N``: the sink's state was
        lost and micro-batches ``0..N`` are in the target; the query goes on at ``N+1``.
        Refused while the sink has open xids. Stop the query first. A sink the root does
        not hold is made (a sink whose records were deleted whole), and the output says so:
        a mistyped ``--sink`` makes a sink of its own.
        """
        if not forget_epochs and committed_through is None:
            raise ValueError("reset needs --forget-epochs, --committed-through N, or both")
        known = sink_id in SinkAdmin.sinks(self.zk, self.root)
        outcome = self._admin(sink_id).reset_stream(forget_epochs, committed_through)
        return {"sinks": [{**outcome.to_dict(), "created": not known}]}


def render(result: dict[str, Any]) -> str:
    lines = []
    for sink in result["sinks"]:
        done = []
        if sink["forget_epochs"]:
            done.append(f"forgot {sink['forgotten_epochs']} xid(s) (last committed epoch "
                        f"was {shown_epoch(sink['last_committed_before'])})")
        if sink["committed_through"] is not None:
            done.append(f"micro-batches 0..{sink['committed_through']} count as committed")
        lines.append(f"{sink['sink_id']}: " + "; ".join(done) + f"; generation "
                     f"{sink['generation']}; the next streaming query to write adopts the "
                     f"sink (was {sink['previous_owner'] or 'not recorded'})")
        if sink.get("created"):
            lines.append(f"NOTE: the root held no sink {sink['sink_id']}; it was created "
                         "now. That is right for a sink whose records were deleted. If "
                         "--sink is mistyped, the new sink's declared epochs keep txsink "
                         "verify from judging partitions under this root.")
    return "\n".join(lines)
