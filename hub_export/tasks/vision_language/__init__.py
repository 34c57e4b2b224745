"""Vision-language models: an image and a prompt in, text out."""
