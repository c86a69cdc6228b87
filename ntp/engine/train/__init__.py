"""One rank's job, built and run: setup from a config, the training loop, checkpoints and record sinks."""
