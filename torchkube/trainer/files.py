"""Files the trainer writes for other processes that may read them at any moment."""

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, record: dict[str, Any]) -> None:
    """Write then rename, so a reader (the operator) never sees half a record."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)
