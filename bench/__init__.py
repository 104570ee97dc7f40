"""torchkube's benchmarks: how fast it starts, heals, scales and trains (see bench/README.md).

Each module is one benchmark, run as ``python -m bench.<name>`` (or ``bench/run.sh <name>``).
Benchmarks are not tests: they assert nothing about time, they measure and write down.
"""
