"""Fuzz tests (hypothesis): what the daemon reads from outside, generated and mutated."""
