"""Speech recognition: Whisper as one ``.pte`` whose methods a device calls in turn."""
