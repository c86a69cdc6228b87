"""The driver: the ``ntp`` command line, the torchrun launcher and the program each rank runs (``worker``), MLflow
tracking and ``ntp compare``. It builds on ntp.engine and storage, never the reverse."""
