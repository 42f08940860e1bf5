"""The attention benchmarks (`just bench list`): plain PyTorch attention at scale (`pytorch_sweep`),
the flash_benchmarking grid (`flash_sweep`), the leaderboard case (`leaderboard`) and the host's
time per call (`host_overhead`). They time the fast Function (`fast/`) where they time ours."""
