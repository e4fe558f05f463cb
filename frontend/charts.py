"""Bar charts drawn by the server as inline SVG: the geometry here, the markup in
templates/frontend/_chart.html. No script and nothing fetched by the browser."""
from dataclasses import dataclass

WIDTH, HEIGHT, TOP = 320, 130, 18  # TOP: room above the bars for the scale


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    title: str  # the hour and its value, read out by screen readers and shown on hover


@dataclass(frozen=True)
class Chart:
    title: str
    summary: str  # the whole chart in words, for its aria-label
    bars: list
    top: str  # the scale: the largest value
    first: str  # the first hour's label
    middle: str
    last: str
    width: int = WIDTH
    height: int = HEIGHT
    baseline: int = HEIGHT - 20

    @property
    def centre(self):
        return self.width / 2


def bar_chart(title, labels, values, fmt=str):
    """A chart of one bar per value (an hour each), scaled to the largest value."""
    baseline = HEIGHT - 20
    largest = max(values, default=0)
    slot = WIDTH / max(1, len(values))
    bars = []
    for i, (label, value) in enumerate(zip(labels, values)):
        h = (baseline - TOP) * value / largest if largest else 0
        bars.append(Bar(x=round(i * slot + slot * 0.1, 1), y=round(baseline - h, 1), width=round(slot * 0.8, 1),
                        height=round(h, 1), title=f"{label}: {fmt(value)}"))
    total = sum(values)
    summary = (f"{title}: {fmt(total)} in all over {len(values)} hours, at most {fmt(largest)} in one hour"
               if values else f"{title}: no data")
    return Chart(title=title, summary=summary, bars=bars, top=fmt(largest), first=labels[0] if labels else "",
                 middle=labels[len(labels) // 2] if labels else "", last=labels[-1] if labels else "")
