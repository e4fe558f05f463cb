"""Reads of the request domain, split by concern; none of them writes. Counting and sorting
happen in the database. What the pages estimate from these (positions, shares, the live page)
is in carousel/outlook/."""
from carousel.domain.selectors.drives import drive_allocation, drives_in_use, last_unmounts  # noqa: F401
from carousel.domain.selectors.lists import (  # noqa: F401
    COUNT_CAP, bulk_paths, bulk_requests, bulk_state_counts, capped_count, filter_requests, in_bulk, request_list, request_page,
)
from carousel.domain.selectors.summary import (  # noqa: F401
    active_count, jobs_limit, oldest_active, queue_summary, stager_health, state_counts,
)
from carousel.domain.selectors.visibility import (  # noqa: F401
    acts_for_others, cancellable_requests, may_change_all, may_view_all, visible_bulks, visible_requests,
)
