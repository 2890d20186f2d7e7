"""How many standby drivers :class:`DriverProcess` boots (fast tier: no process starts).

A standby costs a whole driver start of CPU; one left unused when the run ends was paid
for nothing, so with ``restarts`` known no more are booted than restarts remain.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.chaos.launcher import DriverProcess, PipelineSpec


class _Running:
    pid = 1

    def poll(self) -> None:
        return None


def driver(tmp_path: Path, standby: int, restarts: int | None) -> DriverProcess:
    spec = PipelineSpec(tmp_path / "in", tmp_path / "checkpoint", "db.t", "http://x", "zk")
    process = DriverProcess(spec, tmp_path / "logs", standby=standby, restarts=restarts)

    def spawn(go_file: Path | None):
        process._spawned += 1
        return _Running(), tmp_path / f"driver-{process._spawned}.log"

    process._spawn = spawn
    (tmp_path / "logs").mkdir()
    return process


@pytest.mark.parametrize("restarts", [0, 1, 2, 5])
def test_no_standby_is_booted_beyond_the_restarts_left(tmp_path: Path, restarts: int) -> None:
    process = driver(tmp_path, standby=2, restarts=restarts)
    process.start()
    for _ in range(restarts):
        process.start()
    # the first driver, then one standby per restart, none left over
    assert process._spawned == 1 + restarts
    assert process._warm == []


def test_without_a_known_number_of_restarts_the_standbys_are_kept_booted(
        tmp_path: Path) -> None:
    process = driver(tmp_path, standby=2, restarts=None)
    process.start()
    process.start()
    assert len(process._warm) == 2 and process._spawned == 4
