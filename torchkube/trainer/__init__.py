"""torchkube's trainer: elastic DDP / ZeRO-1 / FSDP2 / HSDP training that resumes exactly.

Run the built-in GPT with ``python -m torchkube.trainer`` (under torchrun for several
processes), or train your own model, dataset and loss::

    from torchkube.trainer import Workload, exit_with, main

    workload = Workload(build_model=..., train_dataset=..., loss_fn=...)
    if __name__ == "__main__":
        exit_with(main(workload=workload))

Names are imported lazily, so ``import torchkube.trainer.cli`` does not import torch.
"""

import importlib
from typing import Any

_EXPORTS = {
    "main": "torchkube.trainer.entrypoint",
    "exit_with": "torchkube.trainer.entrypoint",
    "load_config": "torchkube.trainer.loader",
    "RunEnv": "torchkube.trainer.loader",
    "ConfigError": "torchkube.trainer.loader",
    "Workload": "torchkube.trainer.workload",
    "gpt_workload": "torchkube.trainer.workload",
    "train": "torchkube.trainer.train",
    "run": "torchkube.trainer.train",
    "TokenDataset": "torchkube.trainer.data",
    "GPT": "torchkube.trainer.model",
    "GPTConfig": "torchkube.trainer.model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'torchkube.trainer' has no attribute {name!r}")
