"""Shared fixtures: the real control plane comes from torchkube's own pytest plugin."""

pytest_plugins = ["testbed.pytest_plugin"]
