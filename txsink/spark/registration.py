"""Registering the data sources with a Spark session (``txsink.register``)."""

from __future__ import annotations

import logging
import os

from txsink.options import CREDENTIAL_VARIABLES
from txsink.spark.versions import has_data_source, no_data_source

log = logging.getLogger(__name__)


class DataSourceUnavailable(RuntimeError):
    """This PySpark has no Python data source API (3.5): ``format("clickhouse_tx")``
    cannot exist; the message names the forms that work."""


def register(spark, *, credentials_as_options: bool = False) -> None:
    """Register ``clickhouse_tx`` (and the at-least-once baseline ``clickhouse_plain``)
    and make ``spark`` the calling thread's active session.

    An installed txsink is found by Spark without it (``pyspark_txsink``), but not an
    editable install. Where Spark registered it already, that registration is kept
    (PySpark 4.0 refuses a second one). And Spark looks a Python data source up in the
    *active* session of the thread that runs the write, also one it found by itself, and a
    new Python thread has none (measured with PySpark 4.3: ``save()`` then fails with
    ``DATA_SOURCE_NOT_FOUND``). So call it once in every thread that writes; repeating it,
    or calling it where Spark found the source, is harmless on every PySpark from 4.0.

    It also hands the credential variables (``TXSINK_CLICKHOUSE_USER`` and the others of
    ``CREDENTIAL_VARIABLES``) as they are now in this process to the Python workers of
    the sources it registers: those workers otherwise see the environment the session
    started with, so a variable set later would be ignored and the job would run as
    ``default``. Spark takes a source's environment from ``SparkContext.environment``
    when the source is registered (measured with PySpark 4.3), so the variables must be
    set before this call. A Spark Connect client has no SparkContext to hand them to: it
    logs a WARNING naming the variables that stay behind, unless the caller passes them
    as options itself (``credentials_as_options``).

    PySpark 3.5 has no Python data source API: it raises :class:`DataSourceUnavailable`
    naming ``txsink.write`` and ``txsink.foreach_batch``, which work there (and need no
    registration).
    """
    if not has_data_source():
        raise DataSourceUnavailable(no_data_source())
    from txsink.spark.datasource import ClickHouseTxDataSource
    from txsink.spark.plain import PlainDataSource

    jvm_session = getattr(spark, "_jsparkSession", None)
    if jvm_session is not None:  # classic PySpark (Spark Connect has no JVM session)
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(jvm_session)
        _pass_credential_variables(spark.sparkContext.environment)
    elif not credentials_as_options:
        _warn_credentials_stay_here(os.environ)
    kept = [source for source in (ClickHouseTxDataSource, PlainDataSource)
            if not _register_once(spark, source)]
    if kept and jvm_session is not None:
        _warn_credentials_not_passed(spark)


#: Spark's error for a second registration of a name it registered from an installed
#: ``pyspark_*`` module (PySpark 4.0; 4.1 and later replace the registration instead).
ALREADY_EXISTS = "DATA_SOURCE_ALREADY_EXISTS"


def _register_once(spark, source) -> bool:
    """Register ``source`` (True), or keep the registration Spark made of it by itself
    (False): an installed txsink's ``pyspark_txsink`` hands every call to the same sink."""
    try:
        spark.dataSource.register(source)
        return True
    except Exception as exc:  # noqa: BLE001 - PySpark's AnalysisException, classic or Connect
        condition = getattr(exc, "getCondition", getattr(exc, "getErrorClass", None))
        if condition is None or condition() != ALREADY_EXISTS:
            raise
        log.debug("data source %s: Spark's own registration kept", source.name())
        return False


def _warn_credentials_not_passed(spark) -> None:
    """Spark's own registration runs the sink's workers with the environment the JVM
    started with (PySpark 4.0 hands it no ``SparkContext.environment``): a credential
    variable set or changed since then does not reach them, and is named."""
    system = spark._jvm.java.lang.System
    changed = [variable for variable in CREDENTIAL_VARIABLES.values()
               if os.environ.get(variable) != system.getenv(variable)]
    if changed:
        log.warning("txsink.register: this Spark keeps its own registration of "
                    "clickhouse_tx, whose workers see the environment the session started "
                    "with: %s set or changed since then do not reach them; set them before "
                    "the session starts, or give the write the options %s",
                    ", ".join(changed), ", ".join(name for name, variable in
                                                  CREDENTIAL_VARIABLES.items()
                                                  if variable in changed))


def _pass_credential_variables(environment: dict[str, str]) -> None:
    """Mirror this process's credential variables into a SparkContext's ``environment``:
    set ones are passed, unset ones are no longer passed by it."""
    for variable in CREDENTIAL_VARIABLES.values():
        if variable in os.environ:
            environment[variable] = os.environ[variable]
        else:
            environment.pop(variable, None)


def _warn_credentials_stay_here(environ) -> None:
    """On a Spark Connect client: credential variables set here do not reach the server's
    workers, which would write as the server's own (or ``default``)."""
    here = [variable for variable in CREDENTIAL_VARIABLES.values() if environ.get(variable)]
    if here:
        log.warning("txsink.register on a Spark Connect session: %s set in this client do "
                    "not reach the Connect server's workers; set them in the server's "
                    "environment, or give the write the options %s", ", ".join(here),
                    ", ".join(name for name, variable in CREDENTIAL_VARIABLES.items()
                              if variable in here))
