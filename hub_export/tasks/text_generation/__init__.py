"""Text generation: decoder-only language models with a KV cache."""
