"""The report layer: committed results -> tables, figures, facts and claims for the site.

Outside the package on purpose: `cs336_systems` measures and stores, this layer reads `results/` and
renders, and `docs/` holds the writing. Nothing in `cs336_systems` imports from here. Pages name the
items a chapter's module registers (report/registry.py); docs/hooks/markers.py fills them at build time.
"""
