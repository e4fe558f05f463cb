"""WLCG JWT bearer tokens (common JWT profile v1.3) from issuers the operator trusts.

Checked offline with PyJWT: signature (RS256 or ES256, never HMAC), expiry, issuer, audience,
`wlcg.ver`, and the storage scopes, which are relative to the issuer's base path on this
service so that one VO's `storage.stage:/` never covers another's files.

Keys come from the issuer's JWKS and are kept in the shared Django cache (every process sees
the same set). PyJWT's own PyJWKClient is not enough: its cache lasts minutes, a failed fetch
empties it, and every unknown `kid` refetches. Here the set is refreshed every
CAROUSEL_WLCG_KEYS_REFRESH_S (by the beat task below and, failing that, on use), the last good
set is kept CAROUSEL_WLCG_KEYS_KEEP_S through an issuer outage, and fetches (on an unknown
`kid` or after a failure) happen at most once per CAROUSEL_WLCG_FETCH_GAP_S per issuer."""
import hashlib
import logging
import re
import time
from dataclasses import dataclass, field

import jwt
from celery import shared_task
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.db.models import Q

from carousel.domain import policy
from carousel.domain.paths import check_place
from carousel.models import Account, WlcgGroupMap, WlcgIdentity

log = logging.getLogger("carousel.wlcg")
ALGORITHMS = ("RS256", "ES256")
ANY_AUDIENCE = "https://wlcg.cern.ch/jwt/v1/any"
STORAGE_SCOPES = ("storage.read", "storage.create", "storage.modify", "storage.stage", "storage.poll")
CAPABILITY_PREFIXES = ("storage.", "compute.")
_SLASHES = re.compile(r"/{2,}")


class InvalidToken(Exception):
    """The bearer is not let in; the message says why (sent in the 401)."""


def looks_like_jwt(value):
    return value.count(".") == 2 and value.startswith("eyJ")


def trusted_issuer(iss):
    for conf in settings.CAROUSEL_WLCG_ISSUERS:
        if conf["issuer"] == iss:
            return conf
    return None


# --- keys -------------------------------------------------------------------------------------

def _cache_key(issuer):
    return "wlcg:jwks:" + hashlib.sha256(issuer.encode()).hexdigest()[:32]


def _fetch_jwks(issuer):
    import httpx  # see refresh_keys

    with httpx.Client(timeout=settings.CAROUSEL_WLCG_FETCH_TIMEOUT_S) as client:
        conf = client.get(issuer.rstrip("/") + "/.well-known/openid-configuration")
        conf.raise_for_status()
        jwks = client.get(conf.json()["jwks_uri"])
        jwks.raise_for_status()
        keys = jwks.json()["keys"]
    if not isinstance(keys, list):
        raise ValueError("the JWKS has no list of keys")
    return keys


def refresh_keys(issuer, *, force=False):
    """Fetch the issuer's keys unless another process did within the fetch gap (force: the
    scheduled refresh). A failure keeps the last good set. Returns the cached entry or None."""
    # Imported here, not with the module, which every start of Django imports (the API schema
    # names the token scheme): httpx imports its command line's rich and click when they are
    # installed (schemathesis brings them), 119 ms of every Celery worker's and server's start.
    import httpx

    key = _cache_key(issuer)
    gap = settings.CAROUSEL_WLCG_FETCH_GAP_S
    if not cache.add(key + ":fetching", 1, timeout=gap) and not force:
        return cache.get(key)
    try:
        keys = _fetch_jwks(issuer)
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        log.warning("keys of %s not refreshed, keeping the last good set: %s", issuer, exc)
        return cache.get(key)
    entry = {"keys": keys, "fetched_at": time.time()}
    cache.set(key, entry, timeout=settings.CAROUSEL_WLCG_KEYS_KEEP_S)
    return entry


def issuer_key(issuer, kid):
    """The JWK `kid` of `issuer`, or None."""
    entry = cache.get(_cache_key(issuer))
    if entry is None or time.time() - entry["fetched_at"] > settings.CAROUSEL_WLCG_KEYS_REFRESH_S \
            or not _find(entry, kid):
        entry = refresh_keys(issuer) or entry
    return _find(entry, kid) if entry else None


def _find(entry, kid):
    return next((k for k in entry["keys"] if isinstance(k, dict) and k.get("kid") == kid), None)


@shared_task(name="carousel.wlcg.refresh_all_keys", ignore_result=True)
def refresh_all_keys():
    """Beat's schedule: keys older than the refresh period are fetched again."""
    for conf in settings.CAROUSEL_WLCG_ISSUERS:
        entry = cache.get(_cache_key(conf["issuer"]))
        if entry is None or time.time() - entry["fetched_at"] > settings.CAROUSEL_WLCG_KEYS_REFRESH_S:
            refresh_keys(conf["issuer"], force=True)


# --- tokens -----------------------------------------------------------------------------------

def _join(base, path):
    return _SLASHES.sub("/", "/" + base.strip("/") + "/" + path.lstrip("/")).rstrip("/") or "/"


@dataclass
class Grant:
    """What a valid token lets its bearer do; DRF's request.auth."""

    issuer: str
    subject: str
    base_path: str
    stage: tuple = ()  # absolute prefixes (base path joined)
    poll: tuple = ()
    capabilities: bool = False  # any capability scope (storage.*, compute.*)
    groups: list = field(default_factory=list)  # wlcg.groups, in the token's order
    # The Django groups its wlcg.groups are mapped to (WlcgGroupMap): for this request, the
    # path authorisation reads their prefixes (carousel/domain/authz.py), on top of the scopes.
    mapped_groups: tuple = ()
    group: object = None  # the Django group its work is accounted to (None: the account's)
    user: object = None

    def allows(self, action, path):
        """action "stage" (stage, cancel, release) or "poll" (poll, archiveinfo): the one rule,
        carousel.domain.policy. A token without a storage.stage or storage.poll scope allows nothing."""
        path = _SLASHES.sub("/", path) if isinstance(path, str) else ""
        return policy.scope_allows(policy.Identity(user=self.user, grant=self),
                                   policy.SUBMIT if action == "stage" else policy.READ, path)


def decode(token):
    """Check a token and return its Grant (without the user). Raises InvalidToken."""
    try:
        header = jwt.get_unverified_header(token)
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise InvalidToken(f"not a readable JWT: {exc}") from exc
    conf = trusted_issuer(unverified.get("iss"))
    if conf is None:
        raise InvalidToken(f"issuer {unverified.get('iss')!r} is not trusted here")
    alg = header.get("alg")
    if alg not in ALGORITHMS:
        raise InvalidToken(f"algorithm {alg!r} is not accepted (RS256, ES256)")
    kid = header.get("kid")
    if not kid:
        raise InvalidToken("the token names no key (kid)")
    jwk = issuer_key(conf["issuer"], kid)
    if jwk is None:
        raise InvalidToken(f"issuer {conf['issuer']} has no key {kid!r}")
    try:
        key = jwt.PyJWK(jwk, algorithm=alg).key
        claims = jwt.decode(token, key, algorithms=[alg], issuer=conf["issuer"],
                            audience=[*conf.get("audiences", []), ANY_AUDIENCE], leeway=30,
                            options={"require": ["exp", "iss", "aud", "sub"]})
    except jwt.PyJWTError as exc:
        raise InvalidToken(f"token refused: {exc}") from exc
    version = str(claims.get("wlcg.ver", ""))
    if version.split(".")[0] != "1":
        raise InvalidToken(f"wlcg.ver {version!r}: only version 1 tokens are accepted")
    subject = str(claims["sub"])
    problem = _text_problem(subject)
    if problem or len(subject) > WlcgIdentity._meta.get_field("subject").max_length:
        raise InvalidToken(f"the subject (sub) {problem or 'is longer than 255 characters'}: the token is invalid")
    base = _join(conf.get("base_path", "/"), "")
    stage, poll, capabilities = [], [], False
    for scope in str(claims.get("scope", "")).split():
        name, _, path = scope.partition(":")
        if scope.startswith(CAPABILITY_PREFIXES):
            capabilities = True
        if name in STORAGE_SCOPES:
            if not path.startswith("/"):
                raise InvalidToken(f"scope {scope!r} has no path: the token is invalid")
            # A scope's path is a place as a submitted path is: the same rules refuse it (a
            # NUL or a '..' would otherwise reach the database or widen the prefix).
            problem = _text_problem(path) or check_place(path, max_bytes=settings.CAROUSEL_MAX_PATH_BYTES)[1]
            if problem:
                raise InvalidToken(f"scope {scope[:200]!r}: the path {problem}: the token is invalid")
            if name == "storage.stage":
                stage.append(_join(base, path))
            elif name == "storage.poll":
                poll.append(_join(base, path))
    groups = claims.get("wlcg.groups") or []
    if not isinstance(groups, list):
        raise InvalidToken("wlcg.groups must be a list")
    return Grant(issuer=conf["issuer"], subject=subject, base_path=base, stage=tuple(stage),
                 poll=tuple(poll), capabilities=capabilities, groups=[g for g in groups if isinstance(g, str)])


def _text_problem(text):
    """What makes a claim's text unfit to store or look up (PostgreSQL takes no NUL, and UTF-8
    has no lone surrogate), or None."""
    if "\x00" in text:
        return "contains a NUL byte"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate)"
    return None


def _username(conf, subject):
    name = conf.get("name") or conf["issuer"].split("//")[-1].split("/")[0]
    username = f"{name}:{subject}"
    if len(username) > 150:
        username = f"{name}:{hashlib.sha256(subject.encode()).hexdigest()[:40]}"
    return username[:150]


def user_for(grant):
    """The Carousel user a token's subject is at its issuer, created on first use."""
    identity = WlcgIdentity.objects.filter(issuer=grant.issuer, subject=grant.subject).select_related("user").first()
    if identity:
        return identity.user
    User = get_user_model()
    base = _username(trusted_issuer(grant.issuer), grant.subject)
    for attempt in range(5):
        username = base if attempt == 0 else f"{base[:140]}~{attempt}"
        try:
            with transaction.atomic():
                user = User.objects.create_user(username)
                WlcgIdentity.objects.create(issuer=grant.issuer, subject=grant.subject, user=user)
                return user
        except IntegrityError:
            # Another process made this identity meanwhile, or the name is taken by someone else.
            identity = WlcgIdentity.objects.filter(issuer=grant.issuer, subject=grant.subject).first()
            if identity:
                return identity.user
    raise InvalidToken("no user name could be made for this subject")


def authenticate(token):
    """(user, grant) for a WLCG token; raises InvalidToken."""
    grant = decode(token)
    user = user_for(grant)
    if not user.is_active:
        raise InvalidToken("this identity's account is disabled")
    mapping = WlcgGroupMap.objects.filter(Q(issuer="") | Q(issuer=grant.issuer)).select_related("group")
    mapped = {}
    for m in mapping:
        mapped.setdefault(m.wlcg_group, m.group)
    named = list({mapped[g].pk: mapped[g] for g in grant.groups if g in mapped}.values())
    # Recorded once (added where missing, never taken away on each request): two tokens of one
    # subject with different wlcg.groups do not flip the membership; each request is judged by
    # its own token's groups (mapped_groups, read by the path authorisation).
    if named:
        have = set(user.groups.filter(pk__in=[g.pk for g in named]).values_list("pk", flat=True))
        if len(have) < len(named):
            user.groups.add(*[g for g in named if g.pk not in have])
    operator_named = Account.objects.filter(user=user, group__isnull=False).exists()
    grant.group = None if operator_named or not named else named[0]
    grant.mapped_groups = tuple(g.pk for g in named)
    user.carousel_token_groups = grant.mapped_groups
    grant.user = user
    return user, grant
