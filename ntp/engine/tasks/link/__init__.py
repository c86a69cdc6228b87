"""Link prediction: edge splits, an encoder and a decoder over node pairs, ranking metrics and the memory plan."""
