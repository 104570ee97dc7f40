"""Live recovery's cross-group average: one message a step from each replica group, which
counts the groups that contributed to it.

Each process sends, for its local rank, one flat tensor: its local gradient of every
trainable parameter (zeros where it has none), one presence flag per parameter, its step
loss and a count of 1. torchft's Manager *sums* the messages over the quorum's groups. A sum,
not torchft's average over the quorum, because a group may contribute nothing to a step: one
that joined the quorum finishing a step a lost group broke holds no gradients of that step
(its peers computed theirs before the loss), so it sends zeros and is not counted — and the
step still commits without waiting for it to compute one. Every group then takes the same
update: the sum over the contributors ÷ their count (a group without a parameter's gradient
adds zero to it, as its data did), a gradient only for the parameters some contributor had
one for, and the contributors' mean loss for the log.
"""

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

_TAIL = 2
"""The message's last two elements: the step loss, then the contributor count."""


def outgoing(
    shapes: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor | None],
    loss: torch.Tensor,
    contributes: bool,
) -> torch.Tensor:
    """This process's message: ``grads`` (its local gradient per parameter, None where it has
    none; ``shapes``: the parameters' local tensors, for the sizes of the missing ones) and its
    step ``loss``, or zeros throughout when it does not contribute."""
    dtype = message_dtype(shapes)
    device = shapes[0].device if shapes else loss.device
    parts = [
        g.detach().reshape(-1).to(dtype)
        if g is not None and contributes
        else torch.zeros(p.numel(), dtype=dtype, device=device)
        for p, g in zip(shapes, grads, strict=True)
    ]
    flags = [1.0 if g is not None and contributes else 0.0 for g in grads]
    parts.append(torch.tensor(flags, dtype=dtype, device=device))
    count = torch.ones((), dtype=dtype, device=device)
    tail = torch.stack([loss.detach().to(device=device, dtype=dtype), count])
    parts.append(tail if contributes else torch.zeros_like(tail))
    return torch.cat(parts)


def message_dtype(shapes: Sequence[torch.Tensor]) -> torch.dtype:
    """The message's element type: the parameters' (promoted), the same in every group
    whatever gradients a group holds — messages of two element types would not sum."""
    return functools.reduce(torch.promote_types, (p.dtype for p in shapes), torch.bfloat16)


def contributors(summed: torch.Tensor) -> int:
    """How many groups' messages ``summed`` adds up (0: none computed the step)."""
    return round(float(summed[-1]))


@dataclass(frozen=True)
class Average:
    """What the summed messages say, the same in every group."""

    grads: list[torch.Tensor | None]
    """Per parameter, the contributors' mean gradient (flat views of the summed message);
    None where none had one."""
    loss: torch.Tensor
    """The contributors' mean step loss."""


def average(summed: torch.Tensor, shapes: Sequence[torch.Tensor]) -> Average:
    """The update in ``summed`` (the quorum's sum of :func:`outgoing` messages of parameters
    shaped as ``shapes``, from at least one contributor), divided in place: no copy of the
    gradients outlives the step."""
    summed[:-1].div_(max(contributors(summed), 1))  # the flags too: only their sign is read
    grads: list[torch.Tensor | None] = []
    offset = sum(p.numel() for p in shapes)
    flags = summed[offset : offset + len(shapes)].tolist()
    offset = 0
    for p, flag in zip(shapes, flags, strict=True):
        grads.append(summed[offset : offset + p.numel()] if flag > 0 else None)
        offset += p.numel()
    return Average(grads, summed[-_TAIL].clone())
