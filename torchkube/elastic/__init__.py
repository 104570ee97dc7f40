"""What makes torchrun survivable in pods: a rendezvous store outside the workers, and a
launcher that reports why workers stopped."""

TRAINING_FINISHED = "torchkube: training finished"
"""What the trainer writes to its container's termination message when every step is done.

The operator takes a worker that exited 0 as the end of training only with this line (for the
built-in trainer): torchrun agents can also end with 0 when their rendezvous closes early.
"""
