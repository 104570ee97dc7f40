"""What makes torchrun survivable in pods: a rendezvous store outside the workers, and a
launcher that reports why workers stopped."""

TRAINING_FINISHED = "torchkube: training finished"
"""What the trainer writes to its container's termination message when every step is done.

The operator takes a worker that exited 0 as the end of training only with this line (for the
built-in trainer): torchrun agents can also end with 0 when their rendezvous closes early.
"""

RENDEZVOUS_EXIT_CODE = 75
"""The launcher's exit code when the rendezvous failed for a reason outside the training code:
the store stayed unreachable for a whole join timeout, or too few agents came (EX_TEMPFAIL)."""
