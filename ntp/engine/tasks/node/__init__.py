"""Node classification on a homogeneous graph: labels and splits of vertices, the engine's GNNs, class losses."""
