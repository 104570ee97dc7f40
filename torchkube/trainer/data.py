"""Training data: a memory-mapped token dataset and an order that is a pure function.

Exactness after a restart rests on one rule: which sample a worker reads is a function of
(seed, epoch, position) only — never of iterator state, worker count or wall clock. The job's
position is a single integer, the number of samples consumed so far, which the checkpoint
stores. The samples of optimizer step ``s`` are the positions ``[s·G, (s+1)·G)`` (``G`` the
global batch), dealt out to (micro-step, rank) pairs; whatever the world size, the same step
sees the same set of samples, none twice and none skipped.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_map
from torch.utils.data import Dataset, default_collate

from torchkube.trainer.tokens import HEADER_BYTES, read_header, resolve_token_files

_MASK64 = (1 << 64) - 1
_FEISTEL_ROUNDS = 4


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a fast, well-spread 64-bit hash."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def permuted_index(index: int, n: int, seed: int, epoch: int) -> int:
    """The sample at ``index`` of epoch ``epoch``'s shuffled order of ``n`` samples.

    A keyed Feistel network over the smallest even-bit power of two ≥ n, with cycle-walking
    back into [0, n): a bijection on [0, n) for every (seed, epoch), computed in O(1) memory
    and identical on every machine and Python version (integer arithmetic only).
    """
    if not 0 <= index < n:
        raise IndexError(f"index {index} outside [0, {n})")
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = (1 << half) - 1
    key = _mix64((seed * 0x9E3779B97F4A7C15 + epoch) & _MASK64)
    x = index
    while True:
        left, right = x >> half, x & mask
        for rnd in range(_FEISTEL_ROUNDS):
            f = _mix64(key ^ ((rnd + 1) * 0xD1B54A32D192ED03 & _MASK64) ^ right) & mask
            left, right = right, left ^ f
        x = (left << half) | right
        if x < n:
            return x


def sample_at(position: int, n: int, seed: int) -> int:
    """The dataset index read at a global sample position (epochs follow one another)."""
    epoch, index = divmod(position, n)
    return permuted_index(index, n, seed, epoch)


class TokenDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Non-overlapping windows of ``seq_len`` + 1 tokens from one or more token files.

    Sample ``i`` is ``(x, y)`` with ``y`` the next token of every ``x`` position. Files are
    memory-mapped read-only, so a dataset of any size costs page cache, not process memory,
    and every process on a node shares the same pages.
    """

    def __init__(self, pattern: str, seq_len: int):
        self.seq_len = seq_len
        infos = [read_header(p) for p in resolve_token_files(pattern)]
        self.vocab_size = max(info.vocab_size for info in infos)
        self._files: list[tuple[Path, np.memmap | None]] = []
        counts = []
        for info in infos:
            samples = max(0, (info.num_tokens - 1) // seq_len)
            if samples:
                self._files.append((info.path, None))
                counts.append(samples)
        if not counts:
            raise ValueError(f"{pattern} holds fewer than seq_len + 1 = {seq_len + 1} tokens")
        self._starts = np.cumsum([0, *counts])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _tokens(self, file_index: int) -> np.memmap:
        path, mm = self._files[file_index]
        if mm is None:  # opened lazily, so a dataset object pickles cheaply
            mm = np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES)
            self._files[file_index] = (path, mm)
        return mm

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        f = int(np.searchsorted(self._starts, i, side="right")) - 1
        start = (i - int(self._starts[f])) * self.seq_len
        window = torch.from_numpy(
            self._tokens(f)[start : start + self.seq_len + 1].astype(np.int64)
        )
        return window[:-1], window[1:]


@dataclass(frozen=True)
class Layout:
    """How one optimizer step's global batch is dealt out: G = micro × accum × world."""

    micro_batch_size: int
    grad_accum_steps: int
    world_size: int

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.grad_accum_steps * self.world_size

    def positions(self, consumed: int, rank: int, micro_step: int) -> range:
        """Sample positions of one (rank, micro-step) of the step that starts at ``consumed``."""
        start = consumed + (micro_step * self.world_size + rank) * self.micro_batch_size
        return range(start, start + self.micro_batch_size)


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a (nested) batch, asynchronously from pinned memory on GPU."""
    if device.type == "cuda":
        return tree_map(
            lambda t: (
                t.pin_memory().to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t
            ),
            batch,
        )
    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, batch)


class StepLoader:
    """The micro-batches of this rank for one optimizer step, in the shuffled order.

    Stateless apart from configuration: the caller passes the consumed-sample count, which
    is all a resume needs.
    """

    def __init__(
        self, dataset: Dataset, seed: int, layout: Layout, rank: int, device: torch.device
    ):
        self.dataset, self.seed, self.layout = dataset, seed, layout
        self.rank, self.device = rank, device
        self.n = len(dataset)  # type: ignore[arg-type]

    def micro_batches(self, consumed: int) -> Iterator[Any]:
        for micro_step in range(self.layout.grad_accum_steps):
            positions = self.layout.positions(consumed, self.rank, micro_step)
            items = [self.dataset[sample_at(p, self.n, self.seed)] for p in positions]
            yield to_device(default_collate(items), self.device)


def eval_batches(
    dataset: Dataset,
    micro_batch_size: int,
    batches: int,
    rank: int,
    world_size: int,
    device: torch.device,
) -> Iterator[Any]:
    """A fixed evaluation set: the first ``batches × world × micro`` samples, in file order."""
    n = len(dataset)  # type: ignore[arg-type]
    for b in range(batches):
        start = (b * world_size + rank) * micro_batch_size
        items = [dataset[(start + j) % n] for j in range(micro_batch_size)]
        yield to_device(default_collate(items), device)
