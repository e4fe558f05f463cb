"""`Authorization: Bearer <value>`: a WLCG JWT from a trusted issuer (carousel.grid.tokens), or else
one of Carousel's own API tokens, since gfal2 sends BEARER_TOKEN with that keyword. No
ready-made DRF class checks an external issuer's tokens offline (see interfaces.md)."""
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission

from carousel.domain import policy
from carousel.grid import tokens as wlcg

from .authentication import CachedTokenAuthentication


class BearerAuthentication(CachedTokenAuthentication):
    keyword = "Bearer"

    def authenticate_credentials(self, key):
        if wlcg.looks_like_jwt(key):
            try:
                return wlcg.authenticate(key)
            except wlcg.InvalidToken as exc:
                raise AuthenticationFailed(str(exc)) from exc
        return super().authenticate_credentials(key)


def require_token_allows(request, action, paths):
    """A WLCG token's scopes must allow `action` on every path (carousel.domain.policy): 403
    with `WWW-Authenticate: Bearer error="insufficient_scope"` before anything changes.
    action: "stage" (stage, cancel, release) or "poll" (poll, archiveinfo). Other credentials
    are not scoped: nothing to check here."""
    wanted = policy.SUBMIT if action == "stage" else policy.READ
    policy.require_scope_covers(policy.identity(request), wanted, [p for p in paths if isinstance(p, str)])


class HasStorageScope(BasePermission):
    """Every call of both APIs: a WLCG token without storage.stage or storage.poll may do nothing
    (403 insufficient_scope, carousel.domain.policy); other credentials pass."""

    def has_permission(self, request, view):
        if request.user and request.user.is_authenticated:
            policy.require_scope(policy.identity(request), policy.READ)
        return True


class BearerScheme(OpenApiAuthenticationExtension):
    """How the schema shows BearerAuthentication (beside DRF's `Token` scheme)."""

    target_class = "api.auth.BearerAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "A WLCG JWT from a trusted issuer, or a Carousel API token"}
