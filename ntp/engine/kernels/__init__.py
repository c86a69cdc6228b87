"""Compute kernels with no knowledge of graphs or ranks: dense products (oneDNN on CPU), counter-based dropout
masks and their C and Triton kernels."""
