"""The data order is a pure function of (seed, epoch, position), whatever the world size."""

from pathlib import Path

import pytest
import torch

from torchkube.trainer.data import Layout, StepLoader, TokenDataset, permuted_index, sample_at


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


@pytest.mark.parametrize(("micro", "accum", "world"), [(4, 4, 1), (4, 2, 2), (2, 2, 4), (1, 1, 16)])
def test_every_layout_covers_the_step_exactly_once(micro: int, accum: int, world: int) -> None:
    layout = Layout(micro, accum, world)
    assert layout.global_batch_size == 16
    consumed = 3 * 16
    seen = [
        p
        for rank in range(world)
        for step in range(accum)
        for p in layout.positions(consumed, rank, step)
    ]
    assert sorted(seen) == list(range(consumed, consumed + 16))


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
    """World 2 × accum 2 and world 1 × accum 4 see one global batch of the same samples."""
    ds = TokenDataset(str(token_data / "train.bin"), seq_len=16)
    cpu = torch.device("cpu")

    def step_samples(world: int, accum: int, consumed: int) -> list[tuple[int, ...]]:
        rows = []
        for rank in range(world):
            loader = StepLoader(ds, seed=7, layout=Layout(2, accum, world), rank=rank, device=cpu)
            for x, _ in loader.micro_batches(consumed):
                rows += [tuple(r.tolist()) for r in x]
        return sorted(rows)

    assert step_samples(2, 2, consumed=8) == step_samples(1, 4, consumed=8)
    assert step_samples(1, 4, consumed=8) != step_samples(1, 4, consumed=16)
