"""``torchkube prepare-data`` for spec.data: every source kind read for real (files, an HTTP
server on loopback for URLs and for the Hugging Face datasets server's rows API), the
tokenizer choice stated in the report, the marker that makes a second run a no-op, and the
exit codes the operator's preparation policy keys on."""

from __future__ import annotations

import gzip
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from stub_http import Reply, StubServer

from torchkube.api.contract import PREPARED_MARKER, ExitCode, PrepareReport
from torchkube.api.data import DataSource
from torchkube.cli.main import main as torchkube_cli
from torchkube.trainer import sources
from torchkube.trainer.prepare import prepare_source
from torchkube.trainer.tokenizers import TokenizerUnavailable, choose
from torchkube.trainer.tokens import BYTE_VOCAB_SIZE, read_header

TEXT = "The first paragraph.\n\nThe second one,\nover two lines.\n\n\nA third.\n"
ROWS = [{"text": f"story number {i}", "id": i} for i in range(250)]


def site_answer(path: str) -> Reply | None:
    """/corpus.txt, /corpus.txt.gz, /rows (the datasets server's paginated JSON); 404 else."""
    url = urllib.parse.urlparse(path)
    if url.path == "/corpus.txt":
        return Reply(TEXT.encode())
    if url.path == "/corpus.txt.gz":
        return Reply(gzip.compress(TEXT.encode()))
    if url.path == "/rows":
        query = dict(urllib.parse.parse_qsl(url.query))
        offset, length = int(query["offset"]), int(query["length"])
        rows = [{"row_idx": i, "row": r} for i, r in enumerate(ROWS)]
        page = {"rows": rows[offset : offset + length], "num_rows_total": len(ROWS)}
        return Reply(json.dumps(page).encode())
    return None


@pytest.fixture(scope="module")
def site() -> Iterator[StubServer]:
    served = StubServer(site_answer)
    yield served
    served.close()


def texts(folder: Path) -> Path:
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("alpha " * 50)
    (folder / "sub" / "b.md").write_text("beta " * 50)
    (folder / "skip.bin").write_bytes(b"\0\1")
    return folder


def test_a_folder_is_prepared_once_then_found_by_its_marker(tmp_path: Path) -> None:
    source = DataSource(path=str(texts(tmp_path / "in")))
    out = tmp_path / "out"
    report = prepare_source(source, out, "bytes", 0.1)
    assert report.documents == 2 and report.tokenizer == "bytes" and not report.reused
    assert report.train_tokens + report.val_tokens == 300 + 250 + 2  # the bytes and two EOTs
    assert read_header(out / "train.bin").vocab_size == BYTE_VOCAB_SIZE
    marker = PrepareReport.model_validate_json((out / PREPARED_MARKER).read_text())
    assert marker.source == source.describe() and marker.train_tokens == report.train_tokens
    written = (out / "train.bin").stat().st_mtime_ns
    again = prepare_source(source, out, "auto", 0.1)  # auto accepts what is there
    assert again.reused and again.train_tokens == report.train_tokens
    assert (out / "train.bin").stat().st_mtime_ns == written
    # Another source in the same folder is prepared anew, not mistaken for the first.
    other = prepare_source(DataSource(path=str(tmp_path / "in" / "a.txt")), out, "bytes", 0.1)
    assert not other.reused and other.documents == 1


def test_a_claim_source_is_read_under_its_mount(tmp_path: Path) -> None:
    texts(tmp_path / "claim" / "texts")
    source = DataSource.model_validate({"claim": {"name": "corpus", "path": "texts"}})
    report = prepare_source(source, tmp_path / "out", "bytes", 0.0, tmp_path / "claim")
    assert report.documents == 2 and report.source == "claim:corpus/texts"
    assert report.val_tokens == 0 and not (tmp_path / "out" / "val.bin").exists()


def test_a_url_is_split_into_paragraphs_plain_or_gzipped(site: StubServer, tmp_path: Path) -> None:
    assert list(sources.url_documents(f"{site.url}/corpus.txt")) == [
        "The first paragraph.",
        "The second one,\nover two lines.",
        "A third.\n",
    ]
    report = prepare_source(DataSource(url=f"{site.url}/corpus.txt.gz"), tmp_path, "bytes", 0)
    assert report.documents == 3


def test_http_errors_say_whether_a_retry_can_help(site: StubServer) -> None:
    with pytest.raises(sources.SourceError, match="HTTP 404") as missing:
        list(sources.url_documents(f"{site.url}/nothing.txt"))
    assert missing.value.permanent
    with pytest.raises(sources.SourceError) as refused:  # nothing listens on port 9 here
        list(sources.url_documents("http://127.0.0.1:9/corpus.txt"))
    assert not refused.value.permanent


def test_a_hugging_face_dataset_is_read_page_by_page(
    site: StubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(sources.HF_ENDPOINT_ENV, f"{site.url}/rows")
    source = DataSource.model_validate(
        {"huggingFace": {"dataset": "someone/stories", "maxRows": 230}}
    )
    site.requests.clear()
    report = prepare_source(source, tmp_path, "bytes", 0.0)
    assert report.documents == 230
    assert report.source == "huggingface:someone/stories/default/train[:230]"
    offsets = [dict(urllib.parse.parse_qsl(r.split("?")[1]))["offset"] for r in site.requests]
    assert offsets == ["0", "100", "200"]
    wrong = DataSource.model_validate({"huggingFace": {"dataset": "a/b", "column": "story"}})
    with pytest.raises(sources.SourceError, match="no column 'story'") as error:
        list(sources.documents(wrong))
    assert error.value.permanent


def test_gpt2_falls_back_to_bytes_with_the_reason_where_tiktoken_cannot_load() -> None:
    """This machine has no tiktoken (and no internet for its vocabulary): auto says so."""
    chosen = choose("auto")
    assert chosen.name == "bytes" and chosen.note is not None
    assert "tiktoken" in chosen.note or "vocabulary" in chosen.note
    with pytest.raises(TokenizerUnavailable):
        choose("gpt2")


def test_the_command_reports_for_the_operator_and_exits_3_when_retrying_cannot_help(
    site: StubServer, tmp_path: Path
) -> None:
    runner = CliRunner()
    report = tmp_path / "termination-log"
    source = json.dumps({"url": f"{site.url}/corpus.txt"})
    args = ["prepare-data", "--source", source, "-o", str(tmp_path / "d"), "--report", str(report)]
    result = runner.invoke(torchkube_cli, [*args, "--tokenizer", "auto"])
    assert result.exit_code == 0, result.output
    written = PrepareReport.model_validate_json(report.read_text())
    assert written.documents == 3 and written.tokenizer == "bytes" and written.tokenizer_note
    assert "note: bytes:" in result.output

    gone = json.dumps({"url": f"{site.url}/gone.txt"})
    args = ["prepare-data", "--source", gone, "-o", str(tmp_path / "e"), "--report", str(report)]
    result = runner.invoke(torchkube_cli, args)
    assert result.exit_code == ExitCode.CONFIG_ERROR
    assert report.read_text().startswith("torchkube prepare-data: GET ")
    assert "HTTP 404" in report.read_text()

    result = runner.invoke(torchkube_cli, [*args[:2], source, *args[3:], "--tokenizer", "gpt2"])
    assert result.exit_code == ExitCode.CONFIG_ERROR and "tokenizer: bytes" in report.read_text()

    result = runner.invoke(torchkube_cli, ["prepare-data", "-o", str(tmp_path)])
    assert result.exit_code == 2 and "exactly one of INPUTS, --url, --source" in result.output
