"""Running ``.pte`` files: ExecuTorch's Python runtime and C++ runners, in this process or a probe process."""
