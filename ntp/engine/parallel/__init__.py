"""Tensor and data parallelism behind one GraphContext: the row/graph layout switches, inter-chunk
pipelining, and the NN stage streamed in row blocks."""
