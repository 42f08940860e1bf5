"""The site's one figure mechanism: a matplotlib figure becomes an inline SVG at build time.

A chapter's module registers a function returning a `plt.Figure` (`register(..., figures={...})`),
and a page places it with `{{ figure: chapter.name }}` on a line of its own. Text stays text and ids
are deterministic (a fixed hash salt), so the built page is the same on every build, and no image
file is committed: the figure is always drawn from the results in this checkout. Only this module
turns figures into markup.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def svg(fig: plt.Figure) -> str:
    """The figure as an inline <svg> element (no XML prologue); the figure is closed."""
    buf = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "cs336"}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def new_figure(width: float = 7.0, height: float = 3.6) -> tuple[plt.Figure, plt.Axes]:
    """A figure and axes at the site's default size."""
    return plt.subplots(figsize=(width, height))
