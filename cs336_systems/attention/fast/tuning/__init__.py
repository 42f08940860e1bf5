"""Choosing launch plans by measurement (`tune`, registered as `just bench flash-tune`, over the
search space in `tune_candidates`), and the kernels' resources compiled without a GPU
(`compile_report`)."""
