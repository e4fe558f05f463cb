"""Pictures of a replay (carousel/sim/replay.py): what each drive did over time, the bytes restored
over time, and how long each user waited. PNG or SVG, by the file's extension."""
from collections import defaultdict

PHASE_COLOURS = {
    "fetch": "#b0b0b0", "load": "#7f7f7f", "locate": "#ff7f0e", "read": "#2ca02c",
    "rewind": "#d62728", "unload": "#8c564b", "put-back": "#c7c7c7", "robot-wait": "#f2e6ff",
}
FORMATS = (".png", ".svg")


def plot(workload, outcome, report, path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch

    path = str(path)
    if not path.lower().endswith(FORMATS):
        raise ValueError(f"{path}: the plot's name must end with {' or '.join(FORMATS)}")
    library, start = outcome.library, outcome.start
    hours = 3600.0
    users = sorted({r[0] for r in outcome.requests})
    fig, (timeline, restored, waits) = plt.subplots(
        3, 1, figsize=(12, 4 + 0.25 * len(library.drives) + 0.2 * len(users)),
        gridspec_kw={"height_ratios": [max(2, len(library.drives) / 4), 1.5, max(1.5, len(users) / 8)]})
    who = outcome.baseline and f"baseline {outcome.baseline}" or (
        f"broker {outcome.policy['sort']}/{outcome.policy['share']}")
    fig.suptitle(f"{workload.name}, {who}: makespan {report['makespan_s'] / hours:.2f} h, "
                 f"{report['ratio_to_bound']:.2f}x the lower bound, {report['mounts']} mounts")

    bars = defaultdict(list)
    for s in library.segments:
        bars[(s.drive, s.phase)].append(((s.start - start) / hours, (s.end - s.start) / hours))
    for (drive, phase), spans in bars.items():
        timeline.broken_barh(spans, (drive - 0.4, 0.8), facecolors=PHASE_COLOURS.get(phase, "#000000"),
                             linewidth=0)
    timeline.set_yticks(range(len(library.drives)), [d.name for d in library.drives])
    timeline.invert_yaxis()
    timeline.set_xlabel("hours")
    timeline.set_title("drives")
    timeline.legend(handles=[Patch(color=c, label=p) for p, c in PHASE_COLOURS.items()], ncol=8,
                    loc="upper center", bbox_to_anchor=(0.5, -0.25), fontsize="small", frameon=False)

    total, xs, ys = 0, [0.0], [0.0]
    for t, _, _, size in sorted(library.reads):
        total += size
        xs.append((t - start) / hours)
        ys.append(total / 1e12)
    restored.step(xs, ys, where="post")
    restored.set_xlabel("hours")
    restored.set_ylabel("TB read")
    restored.set_title("bytes restored")
    restored.set_xlim(timeline.get_xlim())

    for row, user in enumerate(users):
        values = [(r[2] - r[1]) / hours for r in outcome.requests if r[0] == user and r[2] is not None]
        waits.plot(values, [row] * len(values), "|", markersize=8, alpha=0.5)
    waits.set_yticks(range(len(users)), users, fontsize="small" if len(users) < 40 else "xx-small")
    waits.invert_yaxis()
    waits.set_xlabel("hours from arrival to restored")
    waits.set_title("waiting time per request")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
