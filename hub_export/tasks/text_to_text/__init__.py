"""Text-to-text: T5-class encoder-decoders."""
