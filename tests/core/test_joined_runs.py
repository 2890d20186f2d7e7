"""A streaming run's later task attempts skip the stream check and the claim
(``txsink.core.attempt.JoinedRuns``): pure logic, with a stand-in coordinator.

That a newer run still refuses them is shown against the real servers
(``tests/spark/test_sink_streaming.py``)."""

from __future__ import annotations

from txsink.core.attempt import JoinedRuns

RUN = ("/txsink", "events", "query-1", "run-1")


class Claims:
    """Records the coordinator calls a join makes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def own_stream(self, query_id: str, epoch: int) -> None:
        self.calls.append(("own_stream", (query_id, epoch)))

    def claim(self, owner: str) -> int:
        self.calls.append(("claim", owner))
        return 7


def test_the_first_attempt_of_a_run_checks_the_stream_then_claims():
    runs, coord = JoinedRuns(), Claims()
    assert runs.join(RUN, coord, 3) == 7
    assert coord.calls == [("own_stream", ("query-1", 3)), ("claim", "run-1")]


def test_a_later_attempt_of_the_run_finds_its_generation():
    runs = JoinedRuns()
    runs.join(RUN, Claims(), 3)
    assert runs.generation(RUN) == 7
    assert runs.generation(("/txsink", "events", "query-1", "run-2")) is None


def test_a_forgotten_run_is_joined_again():
    runs = JoinedRuns()
    runs.join(RUN, Claims(), 3)
    runs.forget(RUN)
    assert runs.generation(RUN) is None


def test_at_most_kept_runs_are_remembered():
    runs = JoinedRuns()
    for n in range(JoinedRuns.KEPT + 1):
        runs.join(("/txsink", "events", "q", f"run-{n}"), Claims(), 0)
    assert runs.generation(("/txsink", "events", "q", f"run-{JoinedRuns.KEPT}")) == 7
    assert runs.generation(("/txsink", "events", "q", "run-0")) is None
