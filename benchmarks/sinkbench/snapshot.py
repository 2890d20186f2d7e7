"""Run a long benchmark on a frozen copy of the sink's code.

The sink is edited while benchmarks run (a shared working tree), and Spark imports it
afresh in every new Python worker: a 40-minute run could measure several versions, or
mix two in one job (a module of the new version importing a name the old one, already
loaded, lacks). :func:`run_frozen` copies ``txsink``, ``server_ext`` and ``coordinator`` into
a temporary directory once, then re-executes the benchmark with that directory first on
``PYTHONPATH``: this process, the Spark JVM it starts and every Python worker import
that copy, whatever happens to the working tree meanwhile. :func:`info` says what was
frozen (git revision, files that differed from it, a digest of the copy); :func:`remove`
deletes the copy at the end. Standard library only: it runs before anything imports the
sink.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGES = ("txsink", "server_ext", "coordinator")
ENV = "TXSINK_BENCH_FROZEN_CODE"  # JSON: what was frozen, where; set in the re-run


def _git(repo: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                              timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def freeze(repo: Path) -> dict:
    """Copy the sink's packages out of ``repo``; returns what was copied, and where."""
    target = Path(tempfile.mkdtemp(prefix="txsink-bench-code-"))
    digest = hashlib.sha256()
    for name in PACKAGES:
        shutil.copytree(repo / name, target / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path in sorted(target.rglob("*.py")):
        digest.update(str(path.relative_to(target)).encode() + b"\0" + path.read_bytes())
    changed = _git(repo, "status", "--porcelain", "--", *PACKAGES)
    return {"dir": str(target), "sha256": digest.hexdigest()[:16],
            "revision": _git(repo, "rev-parse", "--short", "HEAD").strip(),
            "uncommitted_sink_files": [line[3:] for line in changed.splitlines()]}


def run_frozen(repo: Path) -> None:
    """Re-execute this program on a frozen copy of the sink, unless it already runs on
    one. Call it first thing in ``main()``; it does not return in the first process."""
    if os.environ.get(ENV):
        return
    frozen = freeze(repo)
    script_dir = str(Path(sys.argv[0]).resolve().parent)
    paths = [frozen["dir"], script_dir,
             *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    # Spark starts its Python workers with ``python -m`` in the JVM's working directory
    # (the repository, here), which Python would put first on sys.path, ahead of the
    # copy; PYTHONSAFEPATH keeps the working directory and the script's directory off.
    os.environ["PYTHONSAFEPATH"] = "1"
    os.environ[ENV] = json.dumps(frozen)
    print(f"sink code frozen: revision {frozen['revision']} + "
          f"{len(frozen['uncommitted_sink_files'])} uncommitted file(s), copy "
          f"{frozen['sha256']} in {frozen['dir']}", flush=True)
    os.execv(sys.executable, [sys.executable, *sys.argv])


def info() -> dict:
    """What this process runs on: the frozen copy's record, or ``{"frozen": False}``."""
    raw = os.environ.get(ENV)
    if not raw:
        return {"frozen": False}
    frozen = json.loads(raw)
    import txsink  # the copy is first on sys.path: check that it is the one imported

    frozen["frozen"] = Path(txsink.__file__).resolve().is_relative_to(
        Path(frozen["dir"]).resolve())
    return frozen


def worker_paths(spark) -> list[str]:
    """Where Spark's Python workers import the sink from (one answer per task)."""
    def where(_):
        import txsink
        yield txsink.__file__
    return sorted(set(spark.sparkContext.parallelize(range(2), 2).mapPartitions(where)
                      .collect()))


def remove() -> None:
    """Delete the frozen copy (the Spark workers that imported it are gone by then)."""
    raw = os.environ.get(ENV)
    if raw:
        shutil.rmtree(json.loads(raw)["dir"], ignore_errors=True)
