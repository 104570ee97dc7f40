"""Times as Kubernetes writes them (RFC 3339, UTC): one parser and one formatter for the
operator, the CLI, the trainer's reports and the test harness."""

from datetime import UTC, datetime
from typing import Any


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 time (``Z`` or an offset, any fraction of a second) as an aware datetime;
    None when absent or malformed. A time without a zone is taken as UTC."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def format_time(value: datetime) -> str:
    """The way Kubernetes stores a time: UTC, whole seconds."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339(timestamp: float) -> str:
    """A Unix time, formatted as :func:`format_time` does."""
    return format_time(datetime.fromtimestamp(timestamp, UTC))


def now() -> str:
    """The current time as :func:`format_time` writes it."""
    return format_time(datetime.now(UTC))
