"""Fault-run drivers start from a class-data-sharing archive of Spark's JVM, and their
Python workers with ``worker_site`` first on their path."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from tests.harness.chaos import jvm


def test_archive_is_built_once_then_reused():
    first = jvm.ensure_archive()
    assert first is not None and first.stat().st_size > 0
    assert jvm.ensure_archive() == first


def test_driver_java_options_name_the_archive(monkeypatch):
    monkeypatch.delenv(jvm.SUBMIT_ARGS, raising=False)
    args = shlex.split(jvm.submit_env()[jvm.SUBMIT_ARGS])
    assert args[0] == "--driver-java-options" and args[-1] == "pyspark-shell"
    assert f"-XX:SharedArchiveFile={jvm.ensure_archive()}" in args[1].split()


def test_explicit_submit_args_are_kept(monkeypatch):
    monkeypatch.setenv(jvm.SUBMIT_ARGS, "--driver-memory 2g pyspark-shell")
    assert jvm.SUBMIT_ARGS not in jvm.submit_env()


def test_drivers_python_workers_find_the_worker_site_first(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", f"/elsewhere{os.pathsep}{jvm.WORKER_SITE}")
    paths = jvm.submit_env()["PYTHONPATH"].split(os.pathsep)
    assert paths == [str(jvm.WORKER_SITE), "/elsewhere"]
    assert (jvm.WORKER_SITE / "sitecustomize.py").is_file()


def test_a_failed_build_is_not_tried_again(tmp_path, monkeypatch):
    monkeypatch.delenv(jvm.SUBMIT_ARGS, raising=False)
    path = jvm.archive_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.with_suffix(".failed").touch()
    assert jvm.ensure_archive(tmp_path) is None
    assert "SharedArchiveFile" not in jvm.submit_env(tmp_path)[jvm.SUBMIT_ARGS]


def test_worker_site_takes_pyspark_from_the_installed_package_not_sparks_zip():
    import pyspark

    spark_zip = Path(pyspark.__file__).parent / "python" / "lib" / "pyspark.zip"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(spark_zip), str(jvm.WORKER_SITE)])}
    found = subprocess.run([sys.executable, "-c", "import pyspark; print(pyspark.__file__)"],
                           env=env, capture_output=True, text=True, check=True).stdout
    assert found.strip() == pyspark.__file__
