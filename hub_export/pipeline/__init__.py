"""The pipeline: a source becomes verified ``.pte`` variants (source -> prepare -> quantize -> lower -> verify -> build), on this machine or a cluster."""
