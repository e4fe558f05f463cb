"""The tape physics model: serpentine geometry, locate and rewind times, and the time one mount
takes. Pure functions over plain data, shared by the scheduler, the simulated library and the
lower bound. The figures and their sources are those of tape-physics.md.

Calibration. The locate model keeps the shape CERN CTA fitted on LTO-7 M media (fixed, wrap,
band, direction and step-back costs). Per technology, `fit_locate` sets the locate speed and
fixed cost so that the mean locate from BOT to a uniformly random byte equals the table's
average access: the speed is 1.7x the read speed along the tape (this reproduces CTA's ~104 s
LTO-7 traverse), unless the fixed cost would then fall below CTA's 4.29 s; then the fixed cost
stays at 4.29 s and the speed is fitted instead. A rewind has its own fixed cost, fitted to the
table's average rewind: the mean distance to BOT equals the mean distance from it, so a rewind
sharing the locate's fixed cost would always be shorter than the average access by the switch
costs, while the table's rewinds are as long or longer.
"""
from dataclasses import dataclass

GB = 10**9
TB = 10**12
MB = 10**6

# CTA taped/rao CTACostHeuristic, fitted on LTO-7 M media (168 wraps); its negative
# landing-zone term is left out so that no cost can approach zero.
CTA_FIXED_S = 4.29
CTA_SWITCH_COSTS = dict(c_wrap_s=6.69, c_band_s=3.2, c_direction_s=5.22, c_back_s=11.32)
CTA_SOURCE = "locate shape: CTA taped/rao fit on LTO-7 M; speed, fixed and rewind costs: fit_locate"
# High-speed locate relative to the read speed along the tape (tape-physics.md).
LOCATE_OVER_READ_SPEED = 1.7
BANDS = 4


@dataclass(frozen=True, slots=True)
class Media:
    name: str
    capacity_bytes: int  # native
    read_rate_mb_s: float  # native, MB = 10**6 bytes
    wraps: int
    bytes_per_wrap: int
    length_m: float
    load_s: float
    unload_s: float
    avg_access_s: float  # from BOT to a uniformly random position
    avg_rewind_s: float  # from a uniformly random position
    # Locate model; the first three are fitted by fit_locate, the rest are CTA's.
    c_fixed_s: float
    locate_speed_m_s: float
    rewind_fixed_s: float
    c_wrap_s: float
    c_band_s: float
    c_direction_s: float
    c_back_s: float
    file_overhead_s: float  # file marks, the mover opening and closing the file
    source: str


# The per-file overhead is the mover's, not the drive's: one value fitted to PIC's whole-tape
# row (72.6 / 66.5 MB/s overall at ~82 MB/s on LTO-4) serves every technology.
FILE_OVERHEAD_S = 5.0

# Positional columns as in tape-physics.md: native capacity, native read rate MB/s, wraps,
# bytes per wrap, tape length m, load s, unload s, avg access from BOT s, avg rewind s.
MEDIA = {
    "9940B": Media(
        "9940B", 200 * GB, 30, 18, 11 * GB, 650, 18, 18, 41, 45,
        c_fixed_s=4.29, locate_speed_m_s=12.651, rewind_fixed_s=19.57,
        **CTA_SWITCH_COSTS, file_overhead_s=FILE_OVERHEAD_S,
        source="StorageTek 9940B; approx. (no primary source confirmed): wraps, bytes per wrap, "
        f"tape length, load, unload, avg access, avg rewind; {CTA_SOURCE}",
    ),
    "LTO-4": Media(
        "LTO-4", 800 * GB, 120, 56, 14_300_000_000, 820, 15, 22, 60, 60,
        c_fixed_s=13.34, locate_speed_m_s=11.698, rewind_fixed_s=24.92,
        **CTA_SWITCH_COSTS, file_overhead_s=FILE_OVERHEAD_S,
        source="LTO format tables; PIC Flix 2009 (avg access); "
        f"approx.: load, unload, avg rewind; {CTA_SOURCE}",
    ),
    "LTO-5": Media(
        "LTO-5", 1500 * GB, 140, 80, 18_800_000_000, 846, 12, 17, 60, 60,
        c_fixed_s=8.81, locate_speed_m_s=10.710, rewind_fixed_s=20.42,
        **CTA_SWITCH_COSTS, file_overhead_s=FILE_OVERHEAD_S,
        source="LTO format tables; IBM LTO drive documentation (TS2290, TS4500); "
        f"approx.: avg rewind; {CTA_SOURCE}",
    ),
    "LTO-6": Media(
        "LTO-6", 2500 * GB, 160, 136, 18_400_000_000, 846, 12, 17, 62, 60,
        c_fixed_s=16.50, locate_speed_m_s=12.506, rewind_fixed_s=26.15,
        **CTA_SWITCH_COSTS, file_overhead_s=FILE_OVERHEAD_S,
        source="LTO format tables; IBM LTO drive documentation (TS2290, TS4500); "
        f"approx.: avg rewind; {CTA_SOURCE}",
    ),
    "LTO-7": Media(
        "LTO-7", 6 * TB, 300, 112, 53_600_000_000, 960, 15, 20, 56, 60,
        c_fixed_s=4.29, locate_speed_m_s=11.985, rewind_fixed_s=19.93,
        **CTA_SWITCH_COSTS, file_overhead_s=FILE_OVERHEAD_S,
        source="LTO format tables; IBM LTO drive documentation (TS2290, TS4500); "
        f"BNL Yu & Lauret 2017; {CTA_SOURCE}",
    ),
    "LTO-8": Media(
        "LTO-8", 12 * TB, 360, 208, 57_700_000_000, 960, 15, 24, 59, 59,
        c_fixed_s=4.29, locate_speed_m_s=11.153, rewind_fixed_s=15.96,
        **CTA_SWITCH_COSTS, file_overhead_s=FILE_OVERHEAD_S,
        source="LTO format tables; IBM LTO drive documentation (TS2290, TS4500); "
        f"{CTA_SOURCE}",
    ),
    "LTO-9": Media(
        "LTO-9", 18 * TB, 400, 280, 64_300_000_000, 1035, 17, 30, 45, 55,
        c_fixed_s=4.29, locate_speed_m_s=17.828, rewind_fixed_s=25.97,
        **CTA_SWITCH_COSTS, file_overhead_s=FILE_OVERHEAD_S,
        source="LTO format tables; IBM LTO drive documentation (TS2290, TS4500); "
        f"{CTA_SOURCE}",
    ),
}


@dataclass(frozen=True, slots=True)  # slots: the read-order search reads these a lot
class Position:
    offset: int
    wrap: int
    band: int
    metres: float  # from BOT along the tape


# A position past the end of every technology's tape says only "after the position before it":
# for an order known without byte offsets (HPSS's order keys, a tape map's lines without
# positions). The model then sees the files one after another at the tape's end, each reached by
# a forward locate of the same cost, so the order stays the given one and a mount's estimate
# counts its loads, a locate per file, its reads and its rewind, without head travel.
BEYOND_TAPE_END = 1 << 45
assert all(max(m.capacity_bytes, m.wraps * m.bytes_per_wrap) < BEYOND_TAPE_END for m in MEDIA.values())


def as_media(media):
    """Accept a Media or a technology name."""
    return MEDIA[media] if isinstance(media, str) else media


def wrap_of(media, offset):
    return places(media, (offset,))[0][0]


def band_of(media, wrap):
    return wrap * BANDS // as_media(media).wraps


def position(media, offset):
    """Where a byte lies: even wraps run forward from BOT, odd wraps back towards it."""
    return Position(offset, *places(media, (offset,))[0])


def places(media, offsets):
    """(wrap, band, metres from BOT) of each offset: position() for many offsets at once, as
    plain tuples (the read-order search places thousands of files a cycle, in several models)."""
    media = as_media(media)
    per_wrap, wraps, length = media.bytes_per_wrap, media.wraps, media.length_m
    found = []
    for offset in offsets:
        wrap = max(0, min(offset // per_wrap, wraps - 1))
        # Clamped: 9940B's nominal capacity slightly exceeds wraps x bytes per wrap.
        fraction = min(max((offset - wrap * per_wrap) / per_wrap, 0.0), 1.0)
        found.append((wrap, band_of(media, wrap), length * (fraction if wrap % 2 == 0 else 1.0 - fraction)))
    return found


def longitudinal(media, offset):
    """Metres from BOT along the tape."""
    return position(media, offset).metres


def switch_costs_s(media, here, there):
    """The locate costs that depend on which wraps the two positions lie on."""
    cost = 0.0
    if here.wrap != there.wrap:
        cost += media.c_wrap_s
        if here.band != there.band:
            cost += media.c_band_s
        if here.wrap % 2 != there.wrap % 2:
            cost += media.c_direction_s
    elif there.offset < here.offset:
        cost += media.c_back_s
    return cost


def locate_between_s(media, here, there):
    """Locate time between two Positions; `here` is where the head is (the byte after the last
    one read), so equal offsets mean reading straight on."""
    if here.offset == there.offset:
        return 0.0
    return (media.c_fixed_s + switch_costs_s(media, here, there)
            + abs(there.metres - here.metres) / media.locate_speed_m_s)


def locate_s(media, from_offset, to_offset):
    """Locate time from the head at `from_offset` (the end offset of the previous file, i.e.
    the byte after it) to `to_offset`; 0 when streaming on."""
    media = as_media(media)
    return locate_between_s(media, position(media, from_offset), position(media, to_offset))


def locate_from_bot_s(media, offset):
    """After a load the head is at BOT: wrap 0, moving forward."""
    return locate_s(media, 0, offset)


def rewind_s(media, offset):
    return rewind_from_s(media, longitudinal(media, offset))


def rewind_from_s(media, metres):
    """The rewind from `metres` along the tape."""
    media = as_media(media)
    return media.rewind_fixed_s + metres / media.locate_speed_m_s


def read_s(media, size_bytes, read_rate_mb_s=None):
    media = as_media(media)
    rate = read_rate_mb_s or media.read_rate_mb_s
    return size_bytes / (rate * MB) + media.file_overhead_s


def tape_work_s(media, files_in_order, read_rate_mb_s=None):
    """Drive time of one mount reading (offset, size) files in this order: load, locates,
    reads, rewind, unload. The robot's exchanges are not included."""
    return mount_profile(media, files_in_order, read_rate_mb_s=read_rate_mb_s)[0][-1]


def mean_from_bot(media, samples=50_000):
    """(mean switch costs, mean distance in metres) of a locate from BOT to a uniformly random
    byte of the native capacity, by the midpoint rule."""
    media = as_media(media)
    bot = position(media, 0)
    switches = distance = 0.0
    for i in range(samples):
        there = position(media, int((i + 0.5) * media.capacity_bytes / samples))
        switches += switch_costs_s(media, bot, there)
        distance += there.metres
    return switches / samples, distance / samples


def fit_locate(media):
    """The (c_fixed_s, locate_speed_m_s, rewind_fixed_s) that make the model's average access
    and rewind equal the table's; see the module docstring. MEDIA stores the results."""
    media = as_media(media)
    switches, distance = mean_from_bot(media)
    read_speed_m_s = media.length_m * media.read_rate_mb_s * MB / media.bytes_per_wrap
    speed = LOCATE_OVER_READ_SPEED * read_speed_m_s
    fixed = media.avg_access_s - switches - distance / speed
    if fixed < CTA_FIXED_S:
        fixed = CTA_FIXED_S
        speed = distance / (media.avg_access_s - fixed - switches)
    # The mean distance to BOT from a random byte is the mean distance from BOT to it.
    return fixed, speed, media.avg_rewind_s - distance / speed


def mount_profile(media, files_in_order, *, read_rate_mb_s=None, exchange_s=0.0):
    """Drive time of the mounts that read a prefix or a suffix of these (offset, size) files,
    in this order, robot exchanges (fetch and put-back) included: (pre, suf) with pre[k] for a
    mount reading files[:k] and suf[k] for one reading files[k:]; pre[0] and suf[n] are 0.
    The mount planner (carousel/loop/plan.py) cuts a tape's work where these say."""
    media = as_media(media)
    n = len(files_in_order)
    fixed = 2 * exchange_s + media.load_s + media.unload_s
    steps = []  # locate from the previous file's end and read, in this order
    head = 0
    for offset, size in files_in_order:
        steps.append(locate_s(media, head, offset) + read_s(media, size, read_rate_mb_s))
        head = offset + size
    pre = [0.0] * (n + 1)
    run = 0.0
    for k in range(1, n + 1):
        run += steps[k - 1]
        offset, size = files_in_order[k - 1]
        pre[k] = fixed + run + rewind_s(media, offset + size)
    suf = [0.0] * (n + 1)
    if n:
        last_offset, last_size = files_in_order[-1]
        tail = rewind_s(media, last_offset + last_size)
        run = 0.0
        for k in range(n - 1, -1, -1):
            # The suffix's first file is located from BOT after the load, not from files[k-1].
            offset, size = files_in_order[k]
            suf[k] = fixed + run + locate_s(media, 0, offset) + read_s(media, size, read_rate_mb_s) + tail
            run += steps[k]
    return pre, suf


def mount_lead_tail_s(media, *, exchange_s=0.0):
    """(before the first file is read, after the last one): the robot's fetch, the load and an
    average first locate; the average rewind, the unload and the robot's put-back."""
    media = as_media(media)
    return exchange_s + media.load_s + media.avg_access_s, media.avg_rewind_s + media.unload_s + exchange_s
