"""What a rank's hardware offers and how it is measured: numeric precision, pinned host memory, host<->device
copies on side streams, peak memory and the C heap."""
