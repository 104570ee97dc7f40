"""Times as Kubernetes writes them (RFC 3339, UTC): one parser and one formatter for the
operator, the CLI, the trainer's reports and the test harness; and durations as kubectl
prints them."""

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


def human_duration(seconds: float) -> str:
    """A duration the way kubectl prints ages (apimachinery's ``HumanDuration``)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    years = days // 365
    if hours < 24 * 365 * 8:
        return f"{years}y{days % 365}d" if days % 365 else f"{years}y"
    return f"{years}y"
