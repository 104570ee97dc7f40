"""Training data: a memory-mapped token dataset and an order that is a pure function.

Exactness after a restart rests on one rule: which sample a worker reads is a function of
(seed, epoch, position) only — never of iterator state, worker count or wall clock. The job's
position is a single integer, the number of samples consumed so far, which the checkpoint
stores. The samples of optimizer step ``s`` are the positions ``[s·G, (s+1)·G)`` (``G`` the
global batch), dealt out to (rank, micro-step) pairs by :class:`Layout`; whatever the world
size, the same step sees the same set of samples, none twice and none skipped.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_map
from torch.utils.data import Dataset, default_collate

from torchkube.api.trainer import micro_steps
from torchkube.trainer.tokens import (
    HEADER_BYTES,
    TokenFileInfo,
    read_header,
    resolve_token_files,
)

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
        self.file_sizes = [(info.path.name, info.num_tokens) for info in infos]
        self._infos: list[TokenFileInfo] = []
        self._maps: list[np.memmap | None] = []
        counts = []
        for info in infos:
            samples = max(0, (info.num_tokens - 1) // seq_len)
            if samples:
                self._infos.append(info)
                self._maps.append(None)
                counts.append(samples)
        if not counts:
            raise ValueError(f"{pattern} holds fewer than seq_len + 1 = {seq_len + 1} tokens")
        self._starts = np.cumsum([0, *counts])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _tokens(self, file_index: int) -> np.memmap:
        mm = self._maps[file_index]
        if mm is None:  # opened lazily, so a dataset object pickles cheaply
            info = self._infos[file_index]
            mm = np.memmap(info.path, dtype=info.dtype, mode="r", offset=HEADER_BYTES)
            self._maps[file_index] = mm
        return mm

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        f = int(np.searchsorted(self._starts, i, side="right")) - 1
        start = (i - int(self._starts[f])) * self.seq_len
        window = torch.from_numpy(
            self._tokens(f)[start : start + self.seq_len + 1].astype(np.int64)
        )
        return window[:-1], window[1:]


def dataset_identity(dataset: Dataset) -> dict[str, Any]:
    """What a checkpoint records about its training data, to notice a resume onto other data:
    the sample count, which the order depends on, and for token files their names and sizes
    (names, not paths, so a volume mounted elsewhere is still the same data)."""
    identity: dict[str, Any] = {"samples": len(dataset)}  # type: ignore[arg-type]
    if isinstance(dataset, TokenDataset):
        identity["files"] = [
            {"name": name, "tokens": tokens} for name, tokens in dataset.file_sizes
        ]
    return identity


def describe_dataset(identity: dict[str, Any]) -> str:
    """A dataset identity in words: "train.bin (85,116 tokens)", or its sample count."""
    files = identity.get("files")
    if not files:
        return f"a dataset of {identity.get('samples')} samples"
    return ", ".join(f"{f['name']} ({f['tokens']:,} tokens)" for f in files)


@dataclass(frozen=True)
class MicroBatch:
    """One micro-step of one rank: which sample positions it reads, and its loss multiplier.

    ``weight`` is the micro-batch's share of the global batch times the world size, so that
    the mean over ranks (DDP's and FSDP's gradient averaging) of every rank's weighted losses
    is the mean loss over the whole global batch. A rank with fewer samples than micro-steps
    gets empty micro-batches: it computes a filler with weight 0 to keep its collectives in
    step with the others.
    """

    positions: range
    weight: float


@dataclass(frozen=True)
class Layout:
    """How one optimizer step's global batch of ``G`` sequences is dealt out to ``W`` ranks.

    Rank ``r`` holds a contiguous run of ⌊G/W⌋ or ⌈G/W⌉ of the step's positions (the first
    ``G mod W`` ranks one more), split into :attr:`grad_accum_steps` micro-batches of at most
    ``micro_batch_size`` — the same number of micro-steps on every rank, as FSDP's per-micro-
    step reduce-scatter needs, and no rank idle while another computes a micro-batch more.
    """

    global_batch_size: int
    micro_batch_size: int
    world_size: int

    @property
    def grad_accum_steps(self) -> int:
        return micro_steps(self.global_batch_size, self.micro_batch_size, self.world_size)

    def samples(self, rank: int) -> int:
        """Sequences this rank reads per step."""
        base, extra = divmod(self.global_batch_size, self.world_size)
        return base + (rank < extra)

    def micro_batches(self, consumed: int, rank: int) -> list[MicroBatch]:
        """This rank's micro-batches of the step that starts at position ``consumed``."""
        base, extra = divmod(self.global_batch_size, self.world_size)
        start = consumed + rank * base + min(rank, extra)
        size, bigger = divmod(self.samples(rank), self.grad_accum_steps)
        out = []
        for micro_step in range(self.grad_accum_steps):
            n = size + (micro_step < bigger)
            out.append(
                MicroBatch(range(start, start + n), n * self.world_size / self.global_batch_size)
            )
            start += n
        return out

    def describe(self) -> str:
        """The split in words, e.g. "2 ranks hold 3 sequences and 1 rank holds 2, in 2
        micro-steps of at most 2 sequences"."""
        steps = (
            f"in {self.grad_accum_steps} micro-steps of at most {self.micro_batch_size} sequences"
        )
        base, extra = divmod(self.global_batch_size, self.world_size)
        if not extra:
            return f"{base} sequences per rank {steps}"
        rest = self.world_size - extra
        more = f"{extra} rank{'s hold' if extra > 1 else ' holds'} {base + 1} sequences"
        less = f"{rest} rank{'s hold' if rest > 1 else ' holds'} {base}"
        return f"{more} and {less}, {steps}"


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

    def micro_batches(self, consumed: int) -> Iterator[tuple[Any, float]]:
        """(batch on the device, loss weight) for each micro-step of the step at ``consumed``."""
        for micro in self.layout.micro_batches(consumed, self.rank):
            positions = micro.positions or range(consumed, consumed + 1)  # a filler
            items = [self.dataset[sample_at(p, self.n, self.seed)] for p in positions]
            yield to_device(default_collate(items), self.device), micro.weight


def eval_batches(
    dataset: Dataset,
    micro_batch_size: int,
    batches: int,
    rank: int,
    world_size: int,
    device: torch.device,
) -> Iterator[tuple[Any, float]]:
    """This rank's part of the fixed evaluation set, with loss weights as in training.

    The set is the first ``batches × micro_batch_size`` samples in file order (all of them if
    the data holds fewer), the same at every world size, dealt out like a training step.
    """
    size = min(batches * micro_batch_size, len(dataset))  # type: ignore[arg-type]
    for micro in Layout(size, micro_batch_size, world_size).micro_batches(0, rank):
        items = [dataset[p] for p in micro.positions or range(1)]
        yield to_device(default_collate(items), device), micro.weight
