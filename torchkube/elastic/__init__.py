"""What makes torchrun survivable in pods: a rendezvous store outside the workers, and a
launcher that reports why workers stopped (its exit codes and messages are the pod contract's,
torchkube/api/contract.py)."""
