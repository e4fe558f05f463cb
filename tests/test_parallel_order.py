"""The order tests/parallel.py gives the collection in an xdist worker: the tests marked
`long(seconds)` at the front of the shares `--dist worksteal` first hands the workers, their
seconds spread evenly; nothing lost or repeated, the other tests in their own order."""
from types import SimpleNamespace

import pytest

from tests import parallel


class Item:
    def __init__(self, name, seconds=None):
        self.name, self.seconds = name, seconds

    def get_closest_marker(self, name):
        return pytest.mark.long(self.seconds).mark if name == "long" and self.seconds is not None else None


def ordered(items, workers):
    items = list(items)
    parallel.pytest_collection_modifyitems(SimpleNamespace(workerinput={"workercount": workers}), items)
    return items


def first_shares(items, workers):
    """The shares xdist's work-stealing scheduler first sends: each worker in turn gets what is
    left divided by the workers left (xdist/scheduler/worksteal.py, check_schedule)."""
    shares, left = [], list(items)
    for index in range(workers):
        size = len(left) // (workers - index)
        shares.append(left[:size])
        left = left[size:]
    return shares


SHORT = [Item(f"t{i}") for i in range(40)]
LONG = [Item("schemathesis-pg-1", 65), Item("schemathesis-pg-2", 65), Item("schemathesis-sqlite-1", 50),
        Item("schemathesis-sqlite-2", 50), Item("links", 30), Item("kills", 38), Item("xrootd", 33)]


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_each_workers_first_share_starts_with_long_tests_of_about_equal_seconds(workers):
    # Long tests together at the end of the collection, as a module of them is.
    result = ordered(SHORT + LONG, workers)
    assert sorted(i.name for i in result) == sorted(i.name for i in SHORT + LONG)
    assert [i for i in result if i.seconds is None] == SHORT
    loads = []
    for share in first_shares(result, workers):
        longs = [i for i in share if i.seconds is not None]
        assert longs and share[:len(longs)] == longs
        loads.append(sum(i.seconds for i in longs))
    # Longest first to the least loaded: no share more than the longest test above another.
    assert max(loads) - min(loads) <= max(i.seconds for i in LONG)


def test_the_order_is_left_alone_in_one_process_or_without_long_tests():
    items = SHORT + LONG
    same = list(items)
    parallel.pytest_collection_modifyitems(SimpleNamespace(), same)  # no xdist worker
    assert same == items
    assert ordered(SHORT, 3) == SHORT
