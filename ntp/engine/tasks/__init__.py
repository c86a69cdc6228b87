"""What is learned: node classification, link prediction and heterogeneous (R-GCN) node classification, each a
package of its own; no task package imports another."""
