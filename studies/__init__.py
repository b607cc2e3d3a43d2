"""The results pages, the README headline and the regime page, from the study CSVs (`make docs`).

pages: render_all, render_headline, with_headline; studies: the `study:` blocks of the overlays;
tables: a run's key table and provenance; regime_page: the regime map's combined sections.
"""

from studies.overlays import FIGURES, Study, load_studies
from studies.pages import (
    GENERATOR,
    HEADLINE,
    HEADLINE_MARKERS,
    render_all,
    render_headline,
    render_page,
    with_headline,
)

__all__ = [
    "FIGURES",
    "GENERATOR",
    "HEADLINE",
    "HEADLINE_MARKERS",
    "Study",
    "load_studies",
    "render_all",
    "render_headline",
    "render_page",
    "with_headline",
]
