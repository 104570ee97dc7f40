"""Token files, the byte tokenizer, the sample corpus and `torchkube prepare-data`."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from torchkube.api.contract import PREPARED_MARKER, ExitCode, PrepareReport
from torchkube.cli.main import main as torchkube_cli
from torchkube.trainer import corpus
from torchkube.trainer.prepare import prepare_data, prepare_text_files
from torchkube.trainer.tokenizers import choose
from torchkube.trainer.tokens import (
    BYTE_VOCAB_SIZE,
    EOT,
    GPT2_VOCAB_SIZE,
    HEADER_BYTES,
    MAGIC,
    decode_bytes,
    encode_bytes,
    read_header,
    resolve_token_files,
    write_token_file,
)


def test_byte_tokenizer_round_trips_any_text() -> None:
    text = "Grüße, 世界! tabs\tand\nnewlines"
    assert decode_bytes(encode_bytes(text)) == text


def test_token_file_is_llm_c_format(tmp_path: Path) -> None:
    tokens = np.array([1, 2, 3, 256], dtype=np.uint16)
    info = write_token_file(tmp_path / "t.bin", tokens, BYTE_VOCAB_SIZE)
    raw = (tmp_path / "t.bin").read_bytes()
    header = np.frombuffer(raw[:HEADER_BYTES], dtype="<i4")
    assert list(header[:4]) == [MAGIC, 1, 4, BYTE_VOCAB_SIZE]
    assert np.array_equal(np.frombuffer(raw[HEADER_BYTES:], dtype="<u2"), tokens)
    assert read_header(tmp_path / "t.bin") == info


def test_header_problems_are_named(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    write_token_file(path, np.arange(10, dtype=np.uint16), 16)
    with path.open("ab") as f:
        f.write(b"\0\0")
    with pytest.raises(
        ValueError, match="truncated or padded: header says 10 tokens, file holds 11"
    ):
        read_header(path)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        write_token_file(path, np.array([300], dtype=np.uint16), 257)
    llm_c = tmp_path / "llmc.bin"  # llm.c leaves the vocabulary slot at 0: GPT-2's
    header = np.zeros(256, dtype="<i4")
    header[:3] = (MAGIC, 1, 1)
    llm_c.write_bytes(header.tobytes() + b"\x01\x00")
    assert read_header(llm_c).vocab_size == GPT2_VOCAB_SIZE
    with pytest.raises(ValueError, match="no token files match"):
        resolve_token_files(str(tmp_path / "shard-*.bin"))


def test_prepare_splits_the_tail_for_validation(tmp_path: Path) -> None:
    result = prepare_data(["a" * 90, "b" * 8], tmp_path, val_fraction=0.1)
    assert result.documents == 2
    assert result.train.num_tokens + result.val.num_tokens == 100  # type: ignore[union-attr]
    tail = np.memmap(tmp_path / "val.bin", dtype="<u2", mode="r", offset=HEADER_BYTES)
    assert tail[-1] == EOT and decode_bytes(tail) == "\n" + "b" * 8 + "\n"


def test_prepare_text_files_reads_folders(tmp_path: Path) -> None:
    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "in" / "a.txt").write_text("first")
    (tmp_path / "in" / "sub" / "b.md").write_text("second")
    (tmp_path / "in" / "skip.bin").write_bytes(b"\0")
    result = prepare_text_files([tmp_path / "in"], tmp_path / "out", val_fraction=0.0)
    assert result.documents == 2 and result.val is None
    tokens = np.memmap(result.train.path, dtype="<u2", mode="r", offset=HEADER_BYTES)
    assert decode_bytes(tokens) == "first\nsecond\n"


def test_sample_corpus_is_deterministic() -> None:
    assert corpus.generate(20, seed=1) == corpus.generate(20, seed=1)
    assert corpus.generate(20, seed=1) != corpus.generate(20, seed=2)


def test_prepare_data_command(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        torchkube_cli, ["prepare-data", "--sample", "--sample-docs", "30", "-o", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "30 documents" in result.output
    assert read_header(tmp_path / "train.bin").vocab_size == BYTE_VOCAB_SIZE
    result = runner.invoke(torchkube_cli, ["prepare-data", "-o", str(tmp_path)])
    assert result.exit_code == 2 and "exactly one of INPUTS" in result.output


def test_vocabularies_beyond_uint16_use_llm_c_llama3_files(tmp_path: Path) -> None:
    """Llama 3's 128,256 tokens do not fit uint16: llm.c's Llama 3 header (magic 20240801,
    version 7) and uint32 tokens; the trainer reads both kinds."""
    from torchkube.trainer.data import TokenDataset

    tokens = np.array([5, 70_000, 128_255, 65_536, 1], dtype=np.uint32)
    info = write_token_file(tmp_path / "wide.bin", tokens, 128_256)
    header = np.frombuffer((tmp_path / "wide.bin").read_bytes()[:HEADER_BYTES], dtype="<i4")
    assert list(header[:4]) == [20240801, 7, 5, 128_256]
    assert read_header(tmp_path / "wide.bin") == info and info.vocab_size == 128_256
    x, y = TokenDataset(str(tmp_path / "wide.bin"), seq_len=4)[0]
    assert x.tolist() == tokens[:4].tolist() and y.tolist() == tokens[1:].tolist()


def fake_tokenizers(vocab: dict[str, int]) -> object:
    """A stand-in for the ``tokenizers`` package: whitespace-split words by id."""

    class Tokenizer:
        @staticmethod
        def from_file(path: str) -> "Tokenizer":
            assert path.endswith("tokenizer.json")
            return Tokenizer()

        def encode(self, text: str, add_special_tokens: bool = True) -> object:
            assert not add_special_tokens
            return type("Encoding", (), {"ids": [vocab[w] for w in text.split()]})

        def token_to_id(self, token: str) -> int | None:
            return vocab.get(token)

    return type("tokenizers", (), {"Tokenizer": Tokenizer})


def test_prepare_data_with_the_weights_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--tokenizer DIR``: the folder's tokenizer.json through the ``tokenizers`` package,
    each document followed by the end-of-sequence token tokenizer_config.json names, in uint32
    files for its 100,000 tokens; the marker names the folder, so the same folder finds the
    data again and another tokenizer does not take it for its own."""
    folder = tmp_path / "llama"
    folder.mkdir()
    vocab = {"hello": 70_000, "world": 3, "</s>": 2, "<pad>": 99_999}
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}}))
    (folder / "tokenizer_config.json").write_text('{"eos_token": {"content": "</s>"}}')
    (tmp_path / "doc.txt").write_text("hello world")
    runner = CliRunner()
    args = ["prepare-data", str(tmp_path / "doc.txt"), "-o", str(tmp_path / "out")]
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # not installed
    result = runner.invoke(torchkube_cli, [*args, "--tokenizer", str(folder)])
    assert result.exit_code == ExitCode.CONFIG_ERROR and "pip install tokenizers" in result.output

    monkeypatch.setitem(sys.modules, "tokenizers", fake_tokenizers(vocab))
    args += ["--val-fraction=0"]
    result = runner.invoke(torchkube_cli, [*args, "--tokenizer", str(folder)])
    assert result.exit_code == 0, result.output
    info = read_header(tmp_path / "out" / "train.bin")
    assert info.vocab_size == 100_000
    tokens = np.fromfile(info.path, dtype="<u4", offset=HEADER_BYTES)
    assert tokens.tolist() == [70_000, 3, 2]
    marker = PrepareReport.model_validate_json((tmp_path / "out" / PREPARED_MARKER).read_text())
    assert marker.tokenizer == str(folder.resolve()) and marker.vocab_size == 100_000

    result = runner.invoke(torchkube_cli, [*args, "--tokenizer", str(folder)])
    assert result.exit_code == 0 and "already there" in result.output
    result = runner.invoke(torchkube_cli, [*args, "--tokenizer", "bytes"])
    assert result.exit_code == 0 and "written" in result.output
    assert read_header(tmp_path / "out" / "train.bin").vocab_size == BYTE_VOCAB_SIZE


def test_tokenizer_option_takes_a_name_or_a_folder(tmp_path: Path) -> None:
    runner = CliRunner()
    out = ["-o", str(tmp_path / "out")]
    result = runner.invoke(torchkube_cli, ["prepare-data", "--sample", *out, "--tokenizer", "x"])
    assert result.exit_code == 2 and "not auto, gpt2, bytes or a tokenizer folder" in result.output
    args = ["prepare-data", "--sample", *out, "--tokenizer", str(tmp_path)]
    result = runner.invoke(torchkube_cli, args)
    assert result.exit_code == 2 and "--sample is byte-level" in result.output
    (tmp_path / "doc.txt").write_text("text")
    args = ["prepare-data", str(tmp_path / "doc.txt"), *out, "--tokenizer", str(tmp_path)]
    result = runner.invoke(torchkube_cli, args)
    assert result.exit_code == ExitCode.CONFIG_ERROR and "no tokenizer.json" in result.output


def test_the_end_of_sequence_token_may_come_from_config_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without tokenizer_config.json, config.json's eos_token_id (the first of a list)."""
    vocab = {"a": 0, "b": 1, "<eot>": 7}
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}}))
    (tmp_path / "config.json").write_text('{"eos_token_id": [7, 1]}')
    monkeypatch.setitem(sys.modules, "tokenizers", fake_tokenizers(vocab))
    tokenizer = choose(tmp_path)
    assert (tokenizer.vocab_size, tokenizer.eot) == (8, 7)
    result = prepare_data(["a b", "b"], tmp_path / "out", 0.0, tokenizer)
    tokens = np.fromfile(result.train.path, dtype="<u2", offset=HEADER_BYTES)
    assert tokens.tolist() == [0, 1, 7, 1, 7]
