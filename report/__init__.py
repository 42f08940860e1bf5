"""The report layer: committed results -> tables, figures and named facts for the site.

Outside the package on purpose: `cs336_systems` measures and stores, this layer reads `results/` and
renders, and `docs/` holds the writing. Nothing in `cs336_systems` imports from here. Executed blocks
in the chapters call these functions in a line or two; every sentence stays in the Markdown.
"""
