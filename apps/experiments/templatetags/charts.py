"""``{% plotly_src %}``: the URL of the plotly.js bundle (apps/experiments/staticfiles.py)."""

from __future__ import annotations

from django import template
from django.templatetags.static import static

from apps.experiments.staticfiles import plotly_static_name

register = template.Library()


@register.simple_tag
def plotly_src() -> str:
    return static(plotly_static_name())
