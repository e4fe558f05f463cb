"""Formatting for the pages: durations, estimate ranges, shares, paths."""
from django import template
from django.utils.html import escape
from django.utils.safestring import mark_safe

from carousel.domain.selectors.submissions import restored_where as where_of, where_text

register = template.Library()

_UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


@register.filter
def duration(seconds):
    """A span of seconds in its two largest units: "2 h 5 min", "40 s"."""
    if seconds is None:
        return ""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    parts = []
    for unit, size in _UNITS:
        n, seconds = divmod(seconds, size)
        if n or parts:
            parts.append(f"{n} {unit}")
        if len(parts) == 2:
            break
    return " ".join(p for p in parts if not p.startswith("0 ")) or "0 s"


@register.filter
def eta(span):
    """An estimate (low, high) in seconds: "5 min – 1 h 2 min", "more than 5 min"; "" for None."""
    if not span:
        return ""
    low, high = span
    if high is None:
        return f"more than {duration(low)}" if low >= 1 else "unknown"
    if high < 60:
        return "within a minute"
    if low < 1:
        return f"within {duration(high)}"
    return f"{duration(low)} – {duration(high)}"


@register.filter
def size(n):
    """Bytes in decimal units, as `carousel` prints them ("1.5 GB" for 1,500,000,000): Django's
    filesizeformat counts in 1,024s under the same names, so one file read 1.4 GB on the pages
    and 1.5 GB in the command (tape capacities are decimal too)."""
    if n is None or n == "":
        return ""
    n = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


@register.filter
def percent(fraction):
    if fraction is None:
        return ""
    return f"{fraction:.0%}" if fraction >= 0.01 or fraction == 0 else "<1%"


@register.filter
def per_hour(rate):
    """A rate per second as a whole number an hour."""
    return f"{rate * 3600:,.0f}"


@register.filter
def path_breaks(path):
    """A path that wraps after its slashes, never inside a name: a line-break opportunity
    (<wbr>) after each "/" (the CSS breaks a single name longer than the line only as a fallback)."""
    return mark_safe(escape(path).replace("/", "/<wbr>"))


@register.filter
def restored_where(request):
    """Where a restored request's file is: "on disk at ...", "delivered to ...", "used in place at ..."."""
    return where_text(*where_of(path=request.path, staged_path=request.staged_path, destination=request.destination,
                                destination_layout=request.destination_layout, delivery_fs=request.delivery_fs))
