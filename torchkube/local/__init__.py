"""``torchkube run``: a TrainingJob on this machine, with torchrun agents standing in for pods."""
