"""Typed errors for everything server_ext says to ClickHouse.

Callers decide what to do from the type and from ``retryable``, never by matching message
text: a ``ClickHouseError`` carries the server's numeric ``code``, its symbolic ``name``
(``UNKNOWN_TABLE``), the HTTP ``status`` and the ``purpose`` of the statement ("create
staging table"), so an operator can tell which step of a transaction failed.

Contract: no error message, ``repr`` or attribute ever contains a password. The client
redacts the password from server text before building an error (some servers echo parts
of the request back).
"""

from __future__ import annotations

import re

# Server error codes this project meets, by number (names as in ClickHouse's ErrorCodes.cpp).
ERROR_NAMES: dict[int, str] = {
    6: "CANNOT_PARSE_TEXT",
    16: "NO_SUCH_COLUMN_IN_TABLE",
    27: "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
    33: "CANNOT_READ_ALL_DATA",
    36: "BAD_ARGUMENTS",
    38: "CANNOT_PARSE_DATE",
    41: "CANNOT_PARSE_DATETIME",
    43: "ILLEGAL_TYPE_OF_ARGUMENT",
    44: "ILLEGAL_COLUMN",
    46: "UNKNOWN_FUNCTION",
    47: "UNKNOWN_IDENTIFIER",
    48: "NOT_IMPLEMENTED",
    49: "LOGICAL_ERROR",
    50: "UNKNOWN_TYPE",
    53: "TYPE_MISMATCH",
    57: "TABLE_ALREADY_EXISTS",
    60: "UNKNOWN_TABLE",
    62: "SYNTAX_ERROR",
    69: "ARGUMENT_OUT_OF_BOUND",
    70: "CANNOT_CONVERT_TYPE",
    72: "CANNOT_PARSE_NUMBER",
    73: "UNKNOWN_FORMAT",
    81: "UNKNOWN_DATABASE",
    82: "DATABASE_ALREADY_EXISTS",
    84: "DIRECTORY_ALREADY_EXISTS",
    107: "FILE_DOESNT_EXIST",
    115: "UNKNOWN_SETTING",
    117: "INCORRECT_DATA",
    159: "TIMEOUT_EXCEEDED",
    164: "READONLY",
    192: "UNKNOWN_USER",
    193: "WRONG_PASSWORD",
    194: "REQUIRED_PASSWORD",
    202: "TOO_MANY_SIMULTANEOUS_QUERIES",
    209: "SOCKET_TIMEOUT",
    210: "NETWORK_ERROR",
    241: "MEMORY_LIMIT_EXCEEDED",
    242: "TABLE_IS_READ_ONLY",
    248: "INVALID_PARTITION_VALUE",
    252: "TOO_MANY_PARTS",
    319: "UNKNOWN_STATUS_OF_INSERT",
    341: "UNFINISHED",
    344: "SUPPORT_IS_DISABLED",
    394: "QUERY_WAS_CANCELLED",
    395: "FUNCTION_THROW_IF_VALUE_IS_NON_ZERO",
    425: "SYSTEM_ERROR",
    497: "ACCESS_DENIED",
    516: "AUTHENTICATION_FAILED",
    999: "KEEPER_EXCEPTION",
}

# Transient server conditions: the statement did not take effect and may succeed later.
# 252 (too many parts) clears once merges catch up; the rest are replica, keeper, network
# or load conditions. Everything else (syntax, unknown objects, bad data) fails fast.
RETRYABLE_CODES: frozenset[int] = frozenset({159, 202, 209, 210, 242, 252, 425, 999})

# 252 is also the server's refusal of an INSERT block spanning more partitions than
# ``max_partitions_per_insert_block``: the same block is refused again, however late.
_PARTITIONS_PER_BLOCK_RE = re.compile(r"Too many partitions for single INSERT block")


def is_transient(code: int | None, message: str) -> bool:
    """Whether a server error of ``code`` may clear if the statement is repeated later."""
    return code in RETRYABLE_CODES and not _PARTITIONS_PER_BLOCK_RE.search(message)

# "Code: 60, e.displayText() = DB::Exception: ..." (18.x) and
# "Code: 60. DB::Exception: ... (UNKNOWN_TABLE) (version 23.8.1.1)" (modern servers).
_EXCEPTION_RE = re.compile(
    r"Code: (?P<code>\d+)[.,] (?:e\.displayText\(\) = )?(?:DB::Exception: )?(?P<msg>.*)",
    re.DOTALL,
)
_OLD_SUFFIX_RE = re.compile(r",? e\.what\(\) = \S+\s*$")
_NEW_SUFFIX_RE = re.compile(r"(?: \((?P<name>[A-Z_]+)\))?(?: \(version [^)]*\))?\s*$")


def code_name(code: int | None) -> str:
    """Symbolic name of a server error code, ``"UNKNOWN"`` for codes not listed here."""
    if code is None:
        return "UNKNOWN"
    return ERROR_NAMES.get(code, f"CODE_{code}")


def parse_exception(text: str) -> tuple[int, str, str | None] | None:
    """Split a server exception text into (code, message, name given by the server).

    Returns None when ``text`` does not start with a ClickHouse exception.
    """
    match = _EXCEPTION_RE.match(text.strip())
    if match is None:
        return None
    message = _OLD_SUFFIX_RE.sub("", match.group("msg").strip())
    suffix = _NEW_SUFFIX_RE.search(message)
    name = suffix.group("name") if suffix else None
    if suffix is not None:
        message = message[: suffix.start()]
    return int(match.group("code")), message.strip(), name


OUTCOME_UNKNOWN = ("CONNECTION_LOST", "TIMEOUT")  # names the client gives a lost answer


#: The codes callers test for: a table or database that is not there; a keeper failure.
UNKNOWN_TABLE, UNKNOWN_DATABASE, DIRECTORY_ALREADY_EXISTS, FILE_DOESNT_EXIST = 60, 81, 84, 107
KEEPER_EXCEPTION = 999


class ClickHouseError(Exception):
    """A statement failed on (or could not reach) the ClickHouse server.

    ``retryable`` says whether repeating the same statement is safe and may succeed; the
    client has already retried those a few times before raising.
    """

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        name: str | None = None,
        purpose: str = "",
        retryable: bool = False,
        status: int | None = None,
        query_id: str | None = None,
    ) -> None:
        self.code = code
        self.name = name or code_name(code)
        self.purpose = purpose
        self.retryable = retryable
        self.status = status
        self.query_id = query_id
        self.server_message = message
        super().__init__(self._render(message))

    @property
    def outcome_unknown(self) -> bool:
        """The request was sent but no answer came: the statement may or may not have run."""
        return self.name in OUTCOME_UNKNOWN

    def _render(self, message: str) -> str:
        prefix = f"{self.purpose} failed" if self.purpose else "ClickHouse request failed"
        code = f" (code {self.code})" if self.code is not None else ""
        return f"{prefix}: {self.name}{code}: {message}"


class SchemaMismatch(ClickHouseError):
    """Incoming Arrow data cannot be written to the target table.

    Raised before anything is created or inserted. ``problems`` holds one line per bad
    column, and the message lists all of them, so one run shows every fix needed.
    """

    def __init__(self, table: str, problems: list[str], *, purpose: str = "check schema") -> None:
        self.table = table
        self.problems = list(problems)
        listing = "; ".join(self.problems)
        super().__init__(
            f"data does not fit {table}: {listing}", name="SCHEMA_MISMATCH", purpose=purpose
        )


class InvalidValue(ClickHouseError):
    """A value in a batch cannot be stored in its column (null, out of range, too long).

    Raised by the per-batch checks before the batch is sent, so nothing of the batch
    reaches the server. Names the column, the row index within the batch and the value.
    """

    def __init__(self, column: str, row: int, value: object, reason: str, *,
                 purpose: str = "check batch") -> None:
        self.column = column
        self.row = row
        self.value = value
        self.reason = reason
        super().__init__(
            f"column `{column}`: {reason} (row {row} of the batch, value {value!r})",
            name="INVALID_VALUE",
            purpose=purpose,
        )


class PartitionLimitExceeded(ClickHouseError):
    """A write's rows spread over more partitions than its bound allows
    (``server_ext.staging.partition_bound``). Raised before the decision: nothing is visible.

    ``count`` is None when the server refused a block for crossing it (how far beyond,
    it does not say); ``examples`` are a few partition values, as the server shows them.
    """

    def __init__(self, table: str, limit: int, count: int | None, examples: list[str],
                 option: str, *, scope: str) -> None:
        self.table = table
        self.limit = limit
        self.count = count
        found = f"{count} partitions" if count is not None else f"more than {limit} partitions"
        shown = f" (e.g. {', '.join(examples)})" if examples else ""
        super().__init__(
            f"{scope} span {found} of {table}{shown}, more than the bound {option}={limit}: "
            f"raise the option (0: no bound), or write fewer partitions per write",
            name="TOO_MANY_PARTITIONS", purpose="check partitions")


def partitions_per_block_refused(exc: ClickHouseError) -> bool:
    """Whether the server refused an INSERT block for spanning more partitions than its
    ``max_partitions_per_insert_block``."""
    return exc.code == 252 and bool(_PARTITIONS_PER_BLOCK_RE.search(exc.server_message))


class ServerUnreachable(ClickHouseError):
    """No connection to the server could be made, even after the retries."""


class PublishError(Exception):
    """Publish cannot go on without someone looking; the xid stays Committing."""

    def __init__(self, message: str, *, target: str, staging: str,
                 partition_ids: list[str]) -> None:
        self.target = target
        self.staging = staging
        self.partition_ids = list(partition_ids)
        super().__init__(message)

    @property
    def partition_id(self) -> str:
        return self.partition_ids[0]


class StagingChanged(PublishError):
    """The staging table no longer holds the parts sealed in the manifest."""


class InDoubtPublish(PublishError):
    """Whether partitions were attached cannot be decided; ``found`` says what was seen."""

    def __init__(self, *, target: str, staging: str, partition_ids: list[str],
                 found: str) -> None:
        self.found = found
        super().__init__(
            f"publish of partitions {partition_ids} from {staging} into {target} is in "
            f"doubt: {found}. Publish stopped there; decide with resolve_partition after "
            "looking at the target",
            target=target, staging=staging, partition_ids=partition_ids,
        )


class PartsDeduplicated(PublishError):
    """A Replicated target dropped staged parts as duplicates of identical earlier parts."""


class ShardingError(ValueError):
    """A shard layout, a shard URL option or a sharding key cannot be used.

    A ``ValueError`` like the sink's option errors: it is raised before anything is staged.
    Messages name the bad part but never a URL's credentials.
    """
