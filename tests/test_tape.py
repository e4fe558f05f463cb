import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from carousel.tape import (
    CTA_FIXED_S, GB, MEDIA, fit_locate, locate_from_bot_s, locate_s, longitudinal, position,
    read_s, rewind_s, tape_work_s, wrap_of,
)

LTO7 = MEDIA["LTO-7"]
WRAP = LTO7.bytes_per_wrap
TRAVERSE_S = LTO7.length_m / LTO7.locate_speed_m_s  # BOT to EOT at locate speed


def at(media, wrap, fraction):
    """The byte `fraction` of the way through `wrap`, in write order."""
    return wrap * media.bytes_per_wrap + int(fraction * media.bytes_per_wrap)


def test_the_table_covers_every_technology_with_sources():
    assert set(MEDIA) == {"9940B", "LTO-4", "LTO-5", "LTO-6", "LTO-7", "LTO-8", "LTO-9"}
    for name, media in MEDIA.items():
        assert media.name == name
        assert "CTA" in media.source
        # The wrap geometry and the capacity come from different tables; they must agree.
        assert media.wraps * media.bytes_per_wrap == pytest.approx(media.capacity_bytes, rel=0.015)
    for name in ("9940B", "LTO-4", "LTO-5", "LTO-6"):
        assert "approx." in MEDIA[name].source


def test_even_wraps_run_forward_and_odd_wraps_back():
    assert wrap_of(LTO7, 0) == 0
    assert wrap_of(LTO7, WRAP - 1) == 0
    assert wrap_of(LTO7, WRAP) == 1
    assert wrap_of(LTO7, LTO7.capacity_bytes - 1) == LTO7.wraps - 1
    assert longitudinal(LTO7, 0) == 0
    assert longitudinal(LTO7, at(LTO7, 0, 0.25)) == pytest.approx(0.25 * LTO7.length_m)
    assert longitudinal(LTO7, at(LTO7, 1, 0.25)) == pytest.approx(0.75 * LTO7.length_m)
    # A wrap turn is seamless: the end of wrap 0 and the start of wrap 1 lie at the far end.
    assert longitudinal(LTO7, WRAP - 1) == pytest.approx(LTO7.length_m)
    assert longitudinal(LTO7, WRAP) == pytest.approx(LTO7.length_m)


def test_bands_are_quarters_of_the_wraps():
    quarter = LTO7.wraps // 4
    wraps = (0, quarter - 1, quarter, LTO7.wraps - 1)
    assert [position(LTO7, at(LTO7, wrap, 0)).band for wrap in wraps] == [0, 0, 1, 3]


def test_reading_straight_on_costs_no_locate():
    assert locate_s(LTO7, 5 * GB, 5 * GB) == 0


def test_a_locate_ahead_on_the_same_wrap_is_fixed_cost_plus_travel():
    seconds = locate_s(LTO7, at(LTO7, 2, 0.1), at(LTO7, 2, 0.6))
    assert seconds == pytest.approx(LTO7.c_fixed_s + 0.5 * TRAVERSE_S, rel=1e-3)


def test_a_locate_back_on_the_same_wrap_pays_the_step_back():
    ahead = locate_s(LTO7, at(LTO7, 2, 0.1), at(LTO7, 2, 0.6))
    back = locate_s(LTO7, at(LTO7, 2, 0.6), at(LTO7, 2, 0.1))
    assert back == pytest.approx(ahead + LTO7.c_back_s)


def test_changing_wrap_band_and_direction_each_cost_their_constant():
    here = at(LTO7, 2, 0.5)
    same_direction = locate_s(LTO7, here, at(LTO7, 4, 0.5))
    other_direction = locate_s(LTO7, here, at(LTO7, 5, 0.5))
    other_band = locate_s(LTO7, here, at(LTO7, 40, 0.5))
    # Every target lies at mid-tape, like the head: no travel.
    assert same_direction == pytest.approx(LTO7.c_fixed_s + LTO7.c_wrap_s)
    assert other_direction == pytest.approx(same_direction + LTO7.c_direction_s)
    assert other_band == pytest.approx(same_direction + LTO7.c_band_s)


def test_the_head_starts_at_bot_on_wrap_zero_going_forward():
    assert locate_from_bot_s(LTO7, 0) == 0
    assert locate_from_bot_s(LTO7, at(LTO7, 0, 0.5)) == pytest.approx(
        LTO7.c_fixed_s + 0.5 * TRAVERSE_S, rel=1e-3)
    assert locate_from_bot_s(LTO7, at(LTO7, 1, 0.5)) == pytest.approx(
        locate_from_bot_s(LTO7, at(LTO7, 0, 0.5)) + LTO7.c_wrap_s + LTO7.c_direction_s, rel=1e-3)


def test_a_rewind_is_its_fixed_cost_plus_travel_to_bot():
    assert rewind_s(LTO7, 0) == LTO7.rewind_fixed_s
    assert rewind_s(LTO7, WRAP) == pytest.approx(LTO7.rewind_fixed_s + TRAVERSE_S)


@given(st.sampled_from(sorted(MEDIA)), st.floats(0, 1), st.floats(0, 1))
def test_every_cost_is_non_negative_and_a_real_locate_pays_the_fixed_cost(name, here, there):
    media = MEDIA[name]
    here, there = int(here * media.capacity_bytes), int(there * media.capacity_bytes)
    seconds = locate_s(media, here, there)
    if here == there:
        assert seconds == 0
    else:
        assert seconds >= media.c_fixed_s
    assert rewind_s(media, here) >= media.rewind_fixed_s >= 0


@pytest.mark.parametrize("name", sorted(MEDIA))
def test_the_stored_constants_are_what_the_fit_gives(name):
    media = MEDIA[name]
    fixed, speed, rewind_fixed = fit_locate(media)
    assert media.c_fixed_s == pytest.approx(fixed, abs=0.01)
    assert media.locate_speed_m_s == pytest.approx(speed, abs=0.002)
    assert media.rewind_fixed_s == pytest.approx(rewind_fixed, abs=0.01)
    assert media.c_fixed_s >= CTA_FIXED_S
    assert media.rewind_fixed_s >= 0


@pytest.mark.parametrize("name", sorted(MEDIA))
def test_average_access_and_rewind_match_the_table(name):
    media = MEDIA[name]
    rng = random.Random(name)
    offsets = [rng.randrange(media.capacity_bytes) for _ in range(20_000)]
    access = sum(locate_from_bot_s(media, offset) for offset in offsets) / len(offsets)
    rewind = sum(rewind_s(media, offset) for offset in offsets) / len(offsets)
    assert access == pytest.approx(media.avg_access_s, rel=0.02)
    assert rewind == pytest.approx(media.avg_rewind_s, rel=0.02)


def test_reading_a_file_is_its_size_over_the_rate_plus_the_overhead():
    assert read_s(LTO7, 3 * GB) == pytest.approx(10 + LTO7.file_overhead_s)
    assert read_s(LTO7, 3 * GB, read_rate_mb_s=150) == pytest.approx(20 + LTO7.file_overhead_s)


def test_a_mount_is_load_locates_reads_rewind_and_unload():
    assert tape_work_s(LTO7, []) == 0
    first, second = (0, GB), (at(LTO7, 3, 0.5), 2 * GB)
    expected = (LTO7.load_s + read_s(LTO7, GB) + locate_s(LTO7, GB, second[0])
                + read_s(LTO7, 2 * GB) + rewind_s(LTO7, second[0] + 2 * GB) + LTO7.unload_s)
    assert tape_work_s(LTO7, [first, second]) == pytest.approx(expected)


def test_contiguous_files_stream_without_locates():
    files = [(10 * GB + i * GB, GB) for i in range(5)]
    reads = 5 * read_s(LTO7, GB)
    expected = (LTO7.load_s + locate_from_bot_s(LTO7, 10 * GB) + reads + rewind_s(LTO7, 15 * GB)
                + LTO7.unload_s)
    assert tape_work_s(LTO7, files) == pytest.approx(expected)


@pytest.mark.parametrize("pattern, step, measured_mb_s", [
    ("whole tape in order", 1, (66.5, 72.6)),
    ("every other file", 2, (40.8, 40.8)),
    ("files more than 12 GB apart", 6, (29.2, 29.2)),
])
def test_it_reproduces_the_pic_step09_measurements(pattern, step, measured_mb_s):
    # One LTO-4 tape of 278 files of 2.75 GB, read at about 82 MB/s (tape-physics.md).
    size = 2_750_000_000
    files = [(i * size, size) for i in range(278)][::step]
    overall = len(files) * size / 1e6 / tape_work_s("LTO-4", files, read_rate_mb_s=82)
    low, high = measured_mb_s
    assert low * 0.9 <= overall <= high * 1.1, f"{pattern}: {overall:.1f} MB/s"
