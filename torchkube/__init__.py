"""torchkube: elastic, fault-tolerant PyTorch training on Kubernetes."""
