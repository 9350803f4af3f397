"""Figures as a person reads them in the Dagster UI: sizes in a fixed unit named in the key, floats
rounded, and pictures small enough to show in place (no Dagster here; the assets pass these on, Dagster
stores the floats as ``FloatMetadataValue``).

Dagster 1.13 has no unit or format on numeric metadata: ``IntMetadataValue`` and ``FloatMetadataValue``
hold a bare ``value``, the UI prints it as it is (``2147483648`` bytes, ``0.30000000000000004`` s),
and the Plots tab graphs every numeric entry by its key, partition by partition. A text value such as
"1.2 GB" reads but cannot be graphed, and a unit that changes with the size would make the graph
jump. So a size is a float in one unit, the unit in its key (``mcap_GB``: ``12.35``), and every
float keeps four significant digits. Units are decimal (1 GB = 10**9 bytes), as ``dyna`` and the
progress lines print MB. (Dagster's one formatted size, ``dagster/size_bytes`` on the asset overview, is
an int the UI drops past 2**31 bytes: a partition of a few TB would show none.)

Pictures: Dagster 1.13 has no image metadata type; a markdown entry's picture (a ``data:`` URL passes
the UI's sanitizer) shows in the asset's metadata table itself only while the markdown is under 1,000
characters (``MetadataEntry.tsx``: ``expandSmallValues && mdStr.length < 1000``), else behind "[Show
Markdown]". A plot as a PNG is tens of kB, so the assets add a line drawing of a few hundred bytes of
SVG beside it (:func:`inline_svg`) that the table shows in place.
"""

from __future__ import annotations

from urllib.parse import quote

SIGNIFICANT_DIGITS = 4
INLINE_MARKDOWN_CHARS = 1000  # Dagster shows markdown shorter than this in place, longer behind a link


def rounded(x: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    """``x`` to ``digits`` significant digits, always a float (an int would be stored as another type):
    ``1234.5678`` -> ``1235.0``, ``0.000123456`` -> ``0.0001235``."""
    return float(f"{x:.{digits}g}")


def gigabytes(n_bytes: int | float) -> float:
    """A size for an asset or a partition (its MCAPs, a cache set, a checkpoint): key it ``<what>_GB``."""
    return rounded(n_bytes / 1e9)


def megabytes(n_bytes: int | float) -> float:
    """A size of one file or episode, and the figure of a rate: key it ``<what>_MB`` or ``<what>_MBps``."""
    return rounded(n_bytes / 1e6)


def inline_svg(alt: str, svg: str) -> str | None:
    """Markdown showing ``svg`` (a whole ``<svg xmlns=...>`` element) as a picture, or ``None`` when the
    markdown would be too long for Dagster to show it in place."""
    url = "data:image/svg+xml," + quote(svg, safe="=',:/.-")  # no space, bracket or parenthesis left
    md = f"![{alt}]({url})"
    return md if len(md) < INLINE_MARKDOWN_CHARS else None


__all__ = ["INLINE_MARKDOWN_CHARS", "SIGNIFICANT_DIGITS", "gigabytes", "inline_svg", "megabytes", "rounded"]
