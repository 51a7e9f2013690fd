"""Hyperparameter sweeps through the service (`hvdcls sweep`, docs/sweeps.md): the space, Optuna's
searcher, the driver and the results."""
