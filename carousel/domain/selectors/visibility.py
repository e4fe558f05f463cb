"""Who sees which requests and submissions: read from the one policy (carousel/domain/policy.py),
under the names the selectors have always offered."""
from carousel.domain import policy

may_view_all = policy.may_see_all
may_change_all = policy.may_change_all
acts_for_others = policy.acts_for_others
visible_requests = policy.visible_requests
visible_bulks = policy.visible_bulks


def cancellable_requests(user):
    """The requests a user (or identity) may cancel: its own; with the change permission, everyone's."""
    return policy.actionable_requests(user, policy.CANCEL)
