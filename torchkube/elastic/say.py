"""The launcher's own lines: on stderr, beside torch's and the workers', each starting with
``torchkube:`` so a user reading a pod's log (and ``torchkube run``, which relays them) tells
them apart."""

import sys

PREFIX = "torchkube: "


def say(message: str) -> None:
    print(f"{PREFIX}{message}", file=sys.stderr, flush=True)
