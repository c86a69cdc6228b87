"""The training engine: everything that runs inside one rank. It imports no MLflow, Prefect, subprocess or argparse
(tests/test_architecture.py); ``collectives`` is its only module that communicates."""
