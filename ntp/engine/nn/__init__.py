"""Models and their building blocks, single-process or tensor parallel alike: GNN layers in two architectures,
row-layout blocks, sliced embeddings and a row-wise Adam."""
