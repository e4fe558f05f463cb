"""`Authorization: Bearer <value>`: a WLCG JWT from a trusted issuer (carousel.grid.tokens), or else
one of Carousel's own API tokens, since gfal2 sends BEARER_TOKEN with that keyword. No
ready-made DRF class checks an external issuer's tokens offline (see interfaces.md)."""
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.exceptions import AuthenticationFailed, PermissionDenied

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
    """A WLCG token's scopes (or mapped groups) must cover every path, on every door: 403 before
    anything changes. action: "stage" (stage, cancel, release) or "poll" (poll, archiveinfo).
    Other credentials are not scoped: nothing to check here."""
    allows = getattr(request.auth, "allows", None)
    if allows is None:
        return
    refused = [p for p in paths if isinstance(p, str) and not allows(action, p)]
    if refused:
        raise PermissionDenied(f"the token's scopes do not allow {action} of {len(refused)} path(s), e.g. {refused[0]}")


class BearerScheme(OpenApiAuthenticationExtension):
    """How the schema shows BearerAuthentication (beside DRF's `Token` scheme)."""

    target_class = "api.auth.BearerAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "A WLCG JWT from a trusted issuer, or a Carousel API token"}
