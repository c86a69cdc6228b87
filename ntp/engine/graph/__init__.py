"""The graph as every rank holds it: the compact topology, propagation operators, the sparse products over them
(chunked, streamed from host memory), and the door to the store."""
