"""Run under torchrun by test_tensor_parallel.py: a small Llama-family model, unsharded on every
rank as the reference, then parallelised each way the trainer can — built on the device, or
built on meta and filled from the seed or from a safetensors folder — with its logits and
gradients compared.

Usage: ``torchrun --nproc-per-node=4 tensor_parallel_worker.py WEIGHTS_DIR``. Rank 0 prints
one JSON line per case: the largest absolute difference of the logits and of the gradients,
the share of a q_proj weight rank 0 holds, and the share of the weights' bytes it read.
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from torchkube.api.trainer import TrainerSpec
from torchkube.trainer import distributed
from torchkube.trainer.llama import PRESETS, Llama, tensor_parallel_plan
from torchkube.trainer.model import cross_entropy_loss
from torchkube.trainer.parallel import parallelize
from torchkube.trainer.weights import init_sharded, load_pretrained, save_pretrained

# Mistral's shape with a tied head and a window shorter than the sequence: every feature of
# the family at once.
CONFIG = replace(PRESETS["mistral-tiny"], vocab_size=128, tie_embeddings=True, sliding_window=8)
CASES = [
    {"strategy": "fsdp", "activationCheckpointing": "selective"},
    {"strategy": "hsdp", "activationCheckpointing": "full"},
    {"strategy": "ddp", "activationCheckpointing": "none"},
]


def logits_and_grads(model: nn.Module, idx: torch.Tensor) -> tuple[torch.Tensor, dict]:
    logits = model(idx[:, :-1])
    cross_entropy_loss(logits, idx[:, 1:]).backward()
    grads = {
        name.replace("_checkpoint_wrapped_module.", ""): (
            p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        )
        for name, p in model.named_parameters()
    }
    return logits.detach(), grads


def largest_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def main(folder: Path) -> None:
    spec = TrainerSpec(model="mistral-tiny", device="cpu", parallelism={"tensor": 2})  # type: ignore[arg-type]
    info = distributed.setup(spec)
    torch.manual_seed(0)
    reference = Llama(CONFIG)
    if info.is_main:
        save_pretrained(reference, folder, max_file_bytes=64 * 1024)  # several files
    dist.barrier()
    # The same batch on every rank, so FSDP's mean over data ranks is the batch's gradient.
    idx = torch.randint(0, 128, (2, 33), generator=torch.Generator().manual_seed(1))
    expected_logits, expected_grads = logits_and_grads(reference, idx)

    def plan(model: nn.Module, tensor: int) -> dict:
        assert isinstance(model, Llama)
        return tensor_parallel_plan(model.config, tensor)

    for case in CASES:
        for source in ("built", "seed", "safetensors"):
            spec = TrainerSpec.model_validate(
                {"model": "mistral-tiny", "device": "cpu", "parallelism": {"tensor": 2}, **case}
            )
            torch.manual_seed(0)
            with torch.device("cpu" if source == "built" else "meta"):
                model = Llama(CONFIG)
            model = parallelize(model, spec, info, list(model.layers), plan)
            if source != "built":
                model.to_empty(device="cpu")
            read = 0
            if source == "seed":
                init_sharded(model, model.initial_value, seed=0)
            if source == "safetensors":
                read = load_pretrained(model, folder, info.checkpoint_group)
            logits, grads = logits_and_grads(model, idx)
            weight = next(p for n, p in model.named_parameters() if n.endswith("q_proj.weight"))
            record = {
                **case,
                "source": source,
                "tied": model.lm_head.weight is model.embed_tokens.weight,
                "local_fraction": weight.to_local().numel() / weight.numel(),
                "read_fraction": read / sum(t.numel() * 4 for t in reference.parameters()),
                "logits": float((logits - expected_logits).abs().max()),
                "grads": largest_difference(grads, expected_grads),
            }
            if info.is_main:
                print(json.dumps(record), flush=True)
    distributed.teardown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
