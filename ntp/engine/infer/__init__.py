"""Applying a saved model at the same scale: loading it, predictions, embeddings and pair scores, exports."""
