"""`Authorization: Bearer <value>`: a WLCG JWT from a trusted issuer (carousel.wlcg), or else
one of Carousel's own API tokens, since gfal2 sends BEARER_TOKEN with that keyword. No
ready-made DRF class checks an external issuer's tokens offline (see interfaces.md)."""
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from carousel import wlcg


class BearerAuthentication(TokenAuthentication):
    keyword = "Bearer"

    def authenticate_credentials(self, key):
        if wlcg.looks_like_jwt(key):
            try:
                return wlcg.authenticate(key)
            except wlcg.InvalidToken as exc:
                raise AuthenticationFailed(str(exc)) from exc
        return super().authenticate_credentials(key)
