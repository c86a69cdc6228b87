"""Node classification on heterogeneous graphs with R-GCN: relations, typed weights, the memory plan."""
