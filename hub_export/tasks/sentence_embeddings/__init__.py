"""Sentence embeddings: an encoder and its pooling as one method."""
