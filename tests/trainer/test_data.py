"""The data order is a pure function of (seed, epoch, position), whatever the world size; the
evaluation set and the dataset's identity do not depend on it either."""

from pathlib import Path

import pytest
import torch

from torchkube.trainer.data import (
    Layout,
    StepLoader,
    TokenDataset,
    dataset_identity,
    eval_batches,
    permuted_index,
    sample_at,
)
from torchkube.trainer.tokens import read_header


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000, 4097])
def test_permutation_is_a_bijection(n: int) -> None:
    order = [permuted_index(i, n, seed=3, epoch=0) for i in range(n)]
    assert sorted(order) == list(range(n))


def test_order_depends_on_seed_and_epoch_only() -> None:
    n = 500
    first = [permuted_index(i, n, seed=1, epoch=0) for i in range(n)]
    assert first == [permuted_index(i, n, seed=1, epoch=0) for i in range(n)]
    assert first != [permuted_index(i, n, seed=1, epoch=1) for i in range(n)]
    assert first != [permuted_index(i, n, seed=2, epoch=0) for i in range(n)]
    assert first != list(range(n))  # it does shuffle
    # positions past the end start the next epoch
    assert [sample_at(n + i, n, seed=1) for i in range(5)] == [
        permuted_index(i, n, seed=1, epoch=1) for i in range(5)
    ]
    with pytest.raises(IndexError):
        permuted_index(n, n, seed=1, epoch=0)


@pytest.mark.parametrize(
    ("global_batch", "micro", "world", "accum"),
    [
        (16, 4, 1, 4),
        (16, 4, 2, 2),
        (16, 2, 4, 2),
        (16, 1, 16, 1),
        (8, 2, 3, 2),  # 3, 3, 2 sequences: micro-batches of 2 and 1
        (64, 8, 3, 3),
        (10, 1, 4, 3),  # 3, 3, 2, 2: the last two ranks fill one micro-step with nothing
        (8, 2, 16, 1),  # more ranks than sequences: half the ranks only keep in step
    ],
)
def test_every_world_size_covers_the_step_exactly_once(
    global_batch: int, micro: int, world: int, accum: int
) -> None:
    """Any world size reads the step's global batch, each sample once, in micro-batches of at
    most ``micro``; ranks hold ⌊G/W⌋ or ⌈G/W⌉ sequences, all in the same number of
    micro-steps; the loss weights make the gradient the mean over the whole global batch."""
    layout = Layout(global_batch, micro, world)
    assert layout.grad_accum_steps == accum
    consumed = 3 * global_batch
    seen = []
    for rank in range(world):
        batches = layout.micro_batches(consumed, rank)
        assert len(batches) == accum
        held = sum(len(b.positions) for b in batches)
        assert held == layout.samples(rank) in (global_batch // world, -(-global_batch // world))
        assert all(len(b.positions) <= micro for b in batches)
        for b in batches:
            assert b.weight == pytest.approx(len(b.positions) * world / global_batch)
        seen += [p for b in batches for p in b.positions]
    assert sorted(seen) == list(range(consumed, consumed + global_batch))


def test_token_dataset_windows(token_data: Path) -> None:
    ds = TokenDataset(str(token_data / "train.bin"), seq_len=32)
    x, y = ds[5]
    assert x.shape == y.shape == (32,) and x.dtype == torch.int64
    assert torch.equal(x[1:], y[:-1])  # y is x shifted by one token
    assert torch.equal(ds[6][0][0:1], y[-1:])  # windows tile the file without overlap
    assert ds.vocab_size == 257


def test_token_dataset_over_shards(token_data: Path, tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"shard-{i}.bin").write_bytes((token_data / "val.bin").read_bytes())
    one = TokenDataset(str(token_data / "val.bin"), seq_len=16)
    three = TokenDataset(str(tmp_path / "shard-*.bin"), seq_len=16)
    assert len(three) == 3 * len(one)
    assert torch.equal(three[len(one) + 2][0], one[2][0])


def test_resized_job_reads_the_same_samples_per_step(token_data: Path) -> None:
    """1, 2 and 3 processes see one global batch of the same samples, and the weights add up
    to one sample's share each."""
    ds = TokenDataset(str(token_data / "train.bin"), seq_len=16)
    cpu = torch.device("cpu")

    def step_samples(world: int, consumed: int) -> list[tuple[tuple[int, ...], float]]:
        rows = []
        for rank in range(world):
            loader = StepLoader(ds, seed=7, layout=Layout(8, 2, world), rank=rank, device=cpu)
            for (x, _), weight in loader.micro_batches(consumed):
                rows += [(tuple(r.tolist()), weight / len(x) / world) for r in x]
        return sorted(rows)

    one = step_samples(1, consumed=8)
    assert step_samples(2, consumed=8) == one
    assert [row for row, _ in step_samples(3, consumed=8)] == [row for row, _ in one]
    assert all(w == pytest.approx(1 / 8) for _, w in step_samples(3, consumed=8))
    assert one != step_samples(1, consumed=16)


def test_layout_in_words() -> None:
    assert (
        Layout(16, 4, 2).describe()
        == "8 sequences per rank in 2 micro-steps of at most 4 sequences"
    )
    assert Layout(8, 2, 3).describe() == (
        "2 ranks hold 3 sequences and 1 rank holds 2, in 2 micro-steps of at most 2 sequences"
    )
    assert Layout(10, 4, 4).describe().startswith("2 ranks hold 3 sequences and 2 ranks hold 2,")


def test_a_rank_without_samples_computes_a_weightless_filler(token_data: Path) -> None:
    ds = TokenDataset(str(token_data / "train.bin"), seq_len=16)
    loader = StepLoader(ds, seed=7, layout=Layout(2, 2, 3), rank=2, device=torch.device("cpu"))
    [((x, _), weight)] = list(loader.micro_batches(0))
    assert len(x) == 1 and weight == 0.0


@pytest.mark.parametrize("world", [2, 3])
def test_eval_set_is_the_same_samples_at_any_world_size(token_data: Path, world: int) -> None:
    """``evalBatches × microBatchSize`` windows from the start of the eval data, whatever the
    world size, so eval losses before and after a resize compare."""
    ds = TokenDataset(str(token_data / "val.bin"), seq_len=16)
    cpu = torch.device("cpu")

    def rows(world: int) -> list[tuple[int, ...]]:
        found = []
        for rank in range(world):
            for (x, _), weight in eval_batches(ds, 4, 5, rank, world, cpu):
                found += [tuple(r.tolist()) for r in x] if weight else []
        return sorted(found)

    assert rows(world) == rows(1) == sorted(tuple(ds[i][0].tolist()) for i in range(20))


def test_dataset_identity_names_files_and_sizes(token_data: Path, tmp_path: Path) -> None:
    train = TokenDataset(str(token_data / "train.bin"), seq_len=16)
    identity = dataset_identity(train)
    assert identity == {
        "samples": len(train),
        "files": [
            {"name": "train.bin", "tokens": read_header(token_data / "train.bin").num_tokens}
        ],
    }
    (tmp_path / "train.bin").write_bytes((token_data / "val.bin").read_bytes())
    assert dataset_identity(TokenDataset(str(tmp_path / "train.bin"), seq_len=16)) != identity
    assert dataset_identity(torch.utils.data.TensorDataset(torch.zeros(5))) == {"samples": 5}
