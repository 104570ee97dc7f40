"""Tests against the real control plane (a package so that its fixtures end with it)."""
