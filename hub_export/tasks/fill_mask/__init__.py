"""Fill-mask: masked language models."""
