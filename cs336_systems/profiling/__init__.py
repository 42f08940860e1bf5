"""Part 1 instruments: the end-to-end benchmark, NVTX and torch.profiler annotation, memory snapshots,
mixed-precision experiments, and the resumable sweeps that feed the profiling, mixed-precision and
memory chapters."""
