"""``python -m torchkube.cli``: the ``torchkube`` command."""

from torchkube.cli.main import main

main()
