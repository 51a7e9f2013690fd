"""Hyperparameter sweeps (docs/sweeps.md): so far the search space (space.py); the driver is to come."""
