"""Ranks and what passes between them: process-group lifecycle, partitions of rows and columns, every
collective (the only communicating module) and its traffic counters, and the communication cost model."""
