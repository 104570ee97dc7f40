"""``python -m torchkube.trainer``: one trainer process, usually started by torchrun."""

from torchkube.trainer.entrypoint import exit_with, main

if __name__ == "__main__":
    exit_with(main())
