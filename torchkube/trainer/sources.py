"""Where ``spec.data`` text comes from: a path (in the image, or on a mounted claim), a URL, or
a Hugging Face dataset. Each source yields documents (strings); nothing here tokenises.

Errors are :class:`SourceError`, with ``permanent`` set when retrying cannot help (a missing
path, an HTTP 4xx): the prepare pod then exits with the configuration-error code and the job
fails with the message, instead of retrying for ever.
"""

import gzip
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path

from torchkube.api.data import DataSource, HuggingFaceSource

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
HF_ROWS_ENDPOINT = "https://datasets-server.huggingface.co/rows"
HF_ENDPOINT_ENV = "TORCHKUBE_HF_ROWS_ENDPOINT"
"""Another datasets server (a mirror) than Hugging Face's own."""
HF_PAGE = 100  # the most rows the datasets server returns per request
TIMEOUT_S = 60
_PARAGRAPHS = re.compile(r"\n\s*\n")


class SourceError(RuntimeError):
    """The source cannot be read; ``permanent`` when a retry would fail the same way."""

    def __init__(self, message: str, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


def iter_text_files(inputs: Iterable[Path]) -> Iterator[Path]:
    """Each input file, or the text files under each input folder in sorted order."""
    for path in inputs:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES)
        elif path.is_file():
            yield path
        else:
            raise SourceError(f"input {path} does not exist", permanent=True)


def file_documents(inputs: Iterable[Path]) -> Iterator[str]:
    """Each text file is one document."""
    for path in iter_text_files(inputs):
        yield path.read_text(encoding="utf-8", errors="replace")


def _get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            data: bytes = response.read()
            return data
    except urllib.error.HTTPError as error:
        permanent = 400 <= error.code < 500 and error.code not in (408, 429)
        raise SourceError(f"GET {url}: HTTP {error.code} {error.reason}", permanent) from error
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise SourceError(f"GET {url}: {reason}", permanent=False) from error


def url_documents(url: str) -> Iterator[str]:
    """A UTF-8 text file (gunzipped when the URL ends in .gz), one document per paragraph."""
    data = _get(url)
    if urllib.parse.urlparse(url).path.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as error:
            raise SourceError(f"{url} is not gzip data: {error}", permanent=True) from error
    text = data.decode("utf-8", errors="replace")
    yield from (part for part in _PARAGRAPHS.split(text) if part.strip())


def hugging_face_documents(source: HuggingFaceSource) -> Iterator[str]:
    """Rows of a Hub dataset's split through the datasets server, ``column`` of each."""
    endpoint = os.environ.get(HF_ENDPOINT_ENV) or HF_ROWS_ENDPOINT
    offset = 0
    while offset < source.max_rows:
        query = urllib.parse.urlencode(
            {
                "dataset": source.dataset,
                "config": source.config,
                "split": source.split,
                "offset": offset,
                "length": min(HF_PAGE, source.max_rows - offset),
            }
        )
        try:
            page = json.loads(_get(f"{endpoint}?{query}"))
            rows = [item["row"] for item in page["rows"]]
        except (ValueError, KeyError, TypeError) as error:
            raise SourceError(f"{endpoint}: unexpected answer ({error})", False) from error
        for row in rows:
            if source.column not in row:
                raise SourceError(
                    f"{source.dataset} has no column {source.column!r} (it has {sorted(row)}); "
                    "set data.source.huggingFace.column",
                    permanent=True,
                )
            yield str(row[source.column])
        offset += len(rows)
        if len(rows) < HF_PAGE or offset >= int(page.get("num_rows_total") or 0):
            return


def documents(source: DataSource, claim_mount: Path | None = None) -> Iterator[str]:
    """The documents of ``source``; a claim's path is read under ``claim_mount`` (where the
    prepare pod mounts it)."""
    if source.path is not None:
        return file_documents([Path(source.path)])
    if source.claim is not None:
        if claim_mount is None:
            raise SourceError("a claim source needs the claim mounted (--claim-mount)", True)
        return file_documents([claim_mount / source.claim.path])
    if source.url is not None:
        return url_documents(source.url)
    assert source.hugging_face is not None
    return hugging_face_documents(source.hugging_face)
