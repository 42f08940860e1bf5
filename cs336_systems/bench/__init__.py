"""Measurement harness: timers, provenance, the results store and the sweep runner."""
