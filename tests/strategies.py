"""The one shared module of hypothesis strategies. Append new strategies; keep each documented."""

from __future__ import annotations

from hypothesis import strategies as st

# -- attention / online softmax ---------------------------------------------------------------

# -- distributed / bucketing ------------------------------------------------------------------
