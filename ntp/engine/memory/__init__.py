"""Memory plans: chunk plans of propagation and where each stage runs (device, streamed, host) under a budget."""
