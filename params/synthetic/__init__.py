"""Experiments on synthetic data, small enough to train in seconds on a CPU."""
