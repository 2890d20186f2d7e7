"""Older PySparks for the guarantee tests: one cached virtualenv per Spark version.

``./run test`` runs the whole suite on the main environment's PySpark, then the tests
marked ``every_spark`` once under each version of :data:`EVERY_RUN`, each in its own
virtualenv made here: ``python -m venv``, then one ``pip install`` of the project's wheel
beside ``pyspark==<pin>`` and the test runner's packages. The project is installed as users
install it, a regular (not editable) install: Spark then finds ``clickhouse_tx`` by itself
(``pyspark_txsink``), as on a platform. The project's own ``pyspark>=`` bound decides
whether it installs beside that PySpark, as on a platform that ships one; an install that
would replace the pinned PySpark fails instead.

The wheel is built once per content of the product's files (:func:`project_wheel`) and put
into a virtualenv whenever that content changed (``pip install --no-deps``), so the tests
always run the checkout's code. They import the wheel's ``txsink``: the checkout is on
their path only after site-packages (a ``.pth`` file, for ``tests``), ``PYTHONSAFEPATH``
keeps the working directory off it, and pytest imports with ``--import-mode=append``;
``TXSINK_TEST_INSTALLED`` tells the tests so.

A virtualenv lives under ``${XDG_CACHE_HOME:-~/.cache}/txsink/venvs/pyspark-<minor>`` and
is reused while its key is unchanged: the pin, the extra pins, the project's dependency
list and test packages (read from ``pyproject.toml``), the Python and the checkout's path
(the ``.pth`` file points there). Any change rebuilds it. A virtualenv is complete only
once its key file is written (last), so an interrupted build is rebuilt; a lock file per
version keeps two runs from building the same one at once.

The tests in a virtualenv connect to the services the main environment started (the
harness's ``Services.up`` leaves running servers alone): the virtualenv needs neither
chdb nor the Debian packages.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Every PySpark a virtualenv can be made for, by minor version: the newest patch of each.
VERSIONS: dict[str, str] = {"3.5": "3.5.9", "4.0": "4.0.5", "4.1": "4.1.4", "4.3": "4.3.0"}
#: The versions ``./run test`` runs the ``every_spark`` tests under (beside the full suite
#: on the main environment's PySpark); ``TXSINK_SPARK_VERSIONS`` overrides ("" for none).
EVERY_RUN: tuple[str, ...] = ("3.5", "4.0", "4.1", "4.3")
#: Versions of :data:`EVERY_RUN` that run only the newcomer's tests by default (the
#: README's forms and SQL users', :data:`NEWCOMER_FILES`): 4.1 and 4.3 share 4.0's write
#: path, and the main environment runs every test on 4.3 already (editable).
NEWCOMER_ONLY: tuple[str, ...] = ("4.1", "4.3")
NEWCOMER_FILES = ("tests/spark/test_readme.py", "tests/spark/test_sql.py")
#: Pins a version needs beside ``pyspark==`` (none so far: PySpark 3.5.9's Arrow, pandas
#: and streaming paths work with pandas 3, NumPy 2 and pyarrow 26).
EXTRA_PINS: dict[str, tuple[str, ...]] = {}
#: The test runner's packages, as ``pyproject.toml``'s dev extra names them.
TEST_PACKAGES = ("pytest", "pytest-timeout", "hypothesis")
#: What ``spark-venv --bench`` adds for ``benchmarks/bench_spark_versions.py``: the
#: clients of its baselines, as ``pyproject.toml``'s dev extra names them.
BENCH_PACKAGES = ("clickhouse-connect", "clickhouse-driver")
#: The guarantee tests' marker: the default selection when no pytest arguments are given.
MARKER = "every_spark"
#: Marks the run of an ``every_spark`` test through ``mapInArrow`` (``txsink.write``,
#: ``foreach_batch``, ``transaction``) on its second server (``[ch26]``); the older
#: PySparks leave these out (:data:`SELECTION`). What a PySpark
#: changes on those ways in is Spark's side: the tasks get the Arrow schema of
#: ``arrow_schema(df.schema)`` on each (``test_the_arrow_schema_is_the_one_the_tasks_receive``,
#: run under every version), so the server and the store see the same batches and the same
#: commit whatever the PySpark; their side of the same tests runs on both servers in the
#: main environment. The data source's forms (README, SQL) keep both servers
#: everywhere: their batches are Spark's own.
SECOND_SERVER = "second_server"
#: What the virtualenvs run by default.
SELECTION = f"{MARKER} and not {SECOND_SERVER}"
KEY_FILE = "txsink-venv.json"
#: The virtualenv's record of the wheel content it holds (:func:`product_digest`).
WHEEL_FILE = "txsink-wheel.txt"
#: What the wheel is built from (pyproject.toml's packages, and the files it names).
PRODUCT = ("pyproject.toml", "README.md", "txsink", "coordinator", "server_ext")
#: Set in the tests' environment: txsink is the installed wheel, not the checkout.
INSTALLED_VARIABLE = "TXSINK_TEST_INSTALLED"


class SparkVenvError(RuntimeError):
    """A virtualenv could not be made (pip's failure, or a replaced PySpark)."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "txsink" / "venvs"


def every_run_versions() -> tuple[str, ...]:
    """:data:`EVERY_RUN`, or the versions ``TXSINK_SPARK_VERSIONS`` names (space/comma)."""
    named = os.environ.get("TXSINK_SPARK_VERSIONS")
    if named is None:
        return EVERY_RUN
    return tuple(v for v in re.split(r"[\s,]+", named) if v)


def guarantee_files() -> list[str]:
    """The test files that name :data:`MARKER`. Only these are collected by default:
    other test modules may import what an older PySpark lacks at import time (4.x's
    ``pyspark.sql.datasource``, ``VariantType``) and would fail collection there."""
    return sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
                  if MARKER in path.read_text())


def _project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def product_digest() -> str:
    """The content of the files the wheel is built from (bytecode caches left out)."""
    digest = hashlib.sha256()
    for name in PRODUCT:
        top = ROOT / name
        for path in sorted([top] if top.is_file() else top.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0")
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def project_wheel() -> Path:
    """The project's wheel for the checkout as it is now: built (``pip wheel``, from a
    copy of :data:`PRODUCT`, so the checkout gets no build folders) unless one of the
    same content is cached."""
    folder = cache_root() / "wheels" / product_digest()
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / "wheels.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = sorted(folder.glob("txsink-*.whl"))
        if found:
            return found[0]
        shutil.rmtree(cache_root() / "wheels", ignore_errors=True)  # older contents
        with tempfile.TemporaryDirectory() as source:
            for name in PRODUCT:
                copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
                copy(ROOT / name, Path(source) / name)
            _say("building the project's wheel ...")
            done = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
                 "--progress-bar", "off", "-w", str(folder), source],
                capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SparkVenvError("pip wheel of the project failed:\n"
                                 + "\n".join(_pip_lines(done.stdout + done.stderr)[-25:]))
        return sorted(folder.glob("txsink-*.whl"))[0]


def dev_requirements(names: Sequence[str] = TEST_PACKAGES) -> list[str]:
    """The dev extra's entries for ``names`` (their bounds included)."""
    dev = _project()["optional-dependencies"]["dev"]
    found = [r for r in dev if _requirement_name(r) in names]
    missing = set(names) - {_requirement_name(r) for r in found}
    if missing:
        raise SparkVenvError(f"pyproject.toml's dev extra has no {sorted(missing)}")
    return found


@dataclass(frozen=True)
class SparkVenv:
    """The virtualenv of one PySpark minor version (``3.5``)."""

    minor: str

    def __post_init__(self) -> None:
        if self.minor not in VERSIONS:
            raise SparkVenvError(f"no PySpark {self.minor!r}: choose one of "
                                 f"{', '.join(VERSIONS)} (tests/harness/spark_versions.py)")

    @property
    def pin(self) -> str:
        return VERSIONS[self.minor]

    @property
    def path(self) -> Path:
        return cache_root() / f"pyspark-{self.minor}"

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def requirements(self) -> list[str]:
        return [f"pyspark=={self.pin}", *EXTRA_PINS.get(self.minor, ()), *dev_requirements()]

    def key(self) -> dict[str, object]:
        """What the virtualenv was made from; any change rebuilds it."""
        return {"pyspark": self.pin, "requirements": self.requirements(),
                "dependencies": _project()["dependencies"], "project": str(ROOT),
                "python": f"{os.path.realpath(sys.executable)} {sys.version.split()[0]}"}

    def cached(self) -> bool:
        try:
            return json.loads((self.path / KEY_FILE).read_text()) == self.key()
        except (OSError, ValueError):
            return False

    def ensure(self) -> bool:
        """Make the virtualenv unless the cached one has the same key; True if made."""
        cache_root().mkdir(parents=True, exist_ok=True)
        with open(cache_root() / f"pyspark-{self.minor}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.cached():
                self._install_project()
                return False
            self._build()
            return True

    def _install_project(self) -> None:
        """The checkout's wheel into the (made) virtualenv, unless it holds that content."""
        wheel = project_wheel()
        if (self.path / WHEEL_FILE).exists() and \
                (self.path / WHEEL_FILE).read_text() == wheel.parent.name:
            return
        with open(cache_root() / f"pyspark-{self.minor}.log", "a") as out:
            self._step(out, f"pip install --no-deps {wheel.name}",
                       [str(self.python), "-m", "pip", "install", "--disable-pip-version-check",
                        "--progress-bar", "off", "--no-deps", "--force-reinstall", str(wheel)])
        (self.path / WHEEL_FILE).write_text(wheel.parent.name)

    def site_packages(self) -> Path:
        return Path(subprocess.run(
            [str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True).stdout.strip())

    def _build(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        log = cache_root() / f"pyspark-{self.minor}.log"
        _say(f"PySpark {self.pin}: making {self.path} (pip's output: {log})")
        started = time.monotonic()
        with open(log, "w") as out:
            self._step(out, "virtualenv", [sys.executable, "-m", "venv", str(self.path)])
            wheel = project_wheel()
            self._step(out, f"pip install {wheel.name} pyspark=={self.pin} "
                            f"{' '.join(self.requirements()[1:])}",
                       [str(self.python), "-m", "pip", "install", "--disable-pip-version-check",
                        "--progress-bar", "off", str(wheel), *self.requirements()])
        (self.path / WHEEL_FILE).write_text(wheel.parent.name)
        (self.site_packages() / "txsink-tests.pth").write_text(f"{ROOT}\n")
        installed = self.installed_pyspark()
        if installed != self.pin:
            raise SparkVenvError(f"installing the project replaced PySpark {self.pin} by "
                                 f"{installed}: its pyspark bound excludes {self.pin}")
        (self.path / KEY_FILE).write_text(json.dumps(self.key(), indent=2) + "\n")
        _say(f"PySpark {self.pin}: virtualenv ready in {time.monotonic() - started:.0f} s")

    def _step(self, out, what: str, command: list[str]) -> None:
        started = time.monotonic()
        _say(f"  {what} ...")
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                              check=False)
        if done.returncode != 0:
            tail = "\n".join(_pip_lines(Path(out.name).read_text())[-25:])
            raise SparkVenvError(f"{what} failed (exit {done.returncode}):\n{tail}")
        _say(f"  {what}: {time.monotonic() - started:.0f} s")

    def add_bench_packages(self) -> None:
        """Install :data:`BENCH_PACKAGES` into the (made) virtualenv, its PySpark kept.

        Not part of the key: a rebuilt virtualenv lacks them until asked again."""
        constraint = self.path / "pyspark-constraint.txt"
        constraint.write_text(f"pyspark=={self.pin}\n")
        with open(cache_root() / f"pyspark-{self.minor}.log", "a") as out:
            self._step(out, f"pip install {' '.join(dev_requirements(BENCH_PACKAGES))}",
                       [str(self.python), "-m", "pip", "install", "--disable-pip-version-check",
                        "--progress-bar", "off", "-c", str(constraint),
                        *dev_requirements(BENCH_PACKAGES)])

    def installed_pyspark(self) -> str:
        return subprocess.run(
            [str(self.python), "-c", "import pyspark; print(pyspark.__version__)"],
            capture_output=True, text=True, check=True).stdout.strip()

    def pytest(self, args: Sequence[str]) -> int:
        """Run pytest in the virtualenv from the checkout; its exit status (5: no test).

        ``args`` that name no test path (``tests/...``) are added to the default selection,
        the ``every_spark`` tests of :func:`guarantee_files` but their second servers'
        runs (:data:`SELECTION`; ``-x``, ``-k name``)."""
        args = list(args)
        if not any(a.startswith("tests") for a in args):
            if not guarantee_files():
                _say(f"PySpark {self.pin}: no test file names {MARKER}")
                return 5
            files = NEWCOMER_FILES if self.minor in NEWCOMER_ONLY else guarantee_files()
            args = [*files, "-m", SELECTION, *args]
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                 if p and Path(p).resolve() != ROOT]  # the checkout comes after the wheel
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONSAFEPATH": "1",
               INSTALLED_VARIABLE: "1", "VIRTUAL_ENV": str(self.path)}
        env.pop("PYSPARK_PYTHON", None)  # the tests' Spark takes this interpreter
        env.pop("PYSPARK_DRIVER_PYTHON", None)
        env.pop("SPARK_HOME", None)  # the virtualenv's PySpark brings its own jars
        _say(f"PySpark {self.pin}: pytest {' '.join(args)}")
        # append: pytest's default (prepend) would put the checkout first for conftest.py
        return subprocess.run([str(self.python), "-m", "pytest", "-p", "no:cacheprovider",
                               "--import-mode=append", *args], cwd=ROOT, env=env,
                              check=False).returncode


def _pip_lines(text: str) -> list[str]:
    """pip's output less its notes on the extra indexes' missing folders."""
    return [line for line in text.splitlines()
            if not (line.startswith("WARNING: Location") and "is ignored" in line)]


def _say(line: str) -> None:
    """Progress, on stderr: ``spark-venv``'s stdout is the virtualenv's python alone."""
    print(f"[spark-versions] {line}", file=sys.stderr, flush=True)


@dataclass
class Outcome:
    minor: str
    pin: str
    venv: str  # "made in N s", "cached", or the error
    test_s: float | None = None
    status: int | None = None


def run(minors: Sequence[str], pytest_args: Sequence[str]) -> int:
    """The tests under each version, one after another; 0 only if every run passed.

    A version whose virtualenv cannot be made counts as failed and the others still run.
    pytest's exit 5 (no test selected) is a failure: a guarantee that selected nothing
    was not checked.
    """
    outcomes = []
    for minor in minors:
        venv = SparkVenv(minor)
        outcome = Outcome(minor, venv.pin, "cached")
        outcomes.append(outcome)
        started = time.monotonic()
        try:
            if venv.ensure():
                outcome.venv = f"made in {time.monotonic() - started:.0f} s"
            else:
                _say(f"PySpark {venv.pin}: cached virtualenv {venv.path}")
        except (SparkVenvError, OSError, subprocess.CalledProcessError) as exc:
            outcome.venv = f"FAILED: {exc}"
            _say(f"PySpark {venv.pin}: {outcome.venv}")
            continue
        started = time.monotonic()
        outcome.status = venv.pytest(pytest_args)
        outcome.test_s = time.monotonic() - started
        if outcome.status == 5:
            selection = " ".join(["-m", repr(SELECTION), *pytest_args])
            _say(f"PySpark {venv.pin}: no test selected by {selection}")
    _say("summary:")
    for o in outcomes:
        result = ("passed" if o.status == 0 else "not run" if o.status is None
                  else f"FAILED (pytest exit {o.status})")
        tests = f"tests {o.test_s:.0f} s" if o.test_s is not None else "tests –"
        _say(f"  PySpark {o.pin:<6} venv {o.venv.splitlines()[0]:<16} {tests:<12} {result}")
    return 0 if outcomes and all(o.status == 0 for o in outcomes) else 1
