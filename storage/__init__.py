"""Graph store: Zarr v3 CSR topology, node features, labels and splits, plus the builders."""

from storage.paths import default_data_dir
from storage.prepare import prepare
from storage.reader import CSRBlock, GraphStore, open_store
from storage.schema import SCHEMA_VERSION, StoreError, StoreMeta

__all__ = [
    "CSRBlock",
    "GraphStore",
    "SCHEMA_VERSION",
    "StoreError",
    "StoreMeta",
    "default_data_dir",
    "open_store",
    "prepare",
]
