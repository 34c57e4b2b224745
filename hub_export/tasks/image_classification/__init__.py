"""Image classification: a vision model and its classifier head."""
