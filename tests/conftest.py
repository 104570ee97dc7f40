"""Shared fixtures: the real control plane comes from torchkube's own pytest plugin."""

pytest_plugins = ["torchkube.testing.pytest_plugin"]
