"""What every Carousel client shares: the configuration, the HTTP client (backing off on 429
and on an unreachable or overloaded server), and the errors, each with the exit code that
programs report."""
import configparser
import os
import random
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from . import __version__

# Exit codes of the `carousel` program (XRootD's hooks have their own: see xrd.py).
EXIT_OK = 0
EXIT_ERROR = 1  # anything unexpected
EXIT_USAGE = 2  # bad command line (argparse's own code)
EXIT_CONFIG = 3  # no server or no token configured, or an unreadable token file
EXIT_AUTH = 4  # the server refused the token (401) or the action (403)
EXIT_NOT_FOUND = 5  # no such submission, request or path
EXIT_REFUSED = 6  # the server refused the input (400, 413, 409)
EXIT_UNAVAILABLE = 7  # the server could not be reached, or kept failing or throttling
EXIT_FAILED = 10  # wait: some files failed
EXIT_CANCELLED = 11  # wait: none failed, but some were cancelled or expired
EXIT_TIMEOUT = 12  # wait: --timeout passed first

CONFIG_FILE = Path("~/.config/carousel/client.ini")
API = "/api/v1/"


class ClientError(Exception):
    """What went wrong, what to do about it, and the exit code."""

    def __init__(self, message, *, hint="", code=EXIT_ERROR, status=None, body=None):
        super().__init__(message)
        self.message, self.hint, self.code, self.status, self.body = message, hint, code, status, body

    def as_dict(self):
        return {"error": self.message, "hint": self.hint, "exit_code": self.code, "status": self.status}


class Config:
    def __init__(self, url, token):
        self.url, self.token = url, token

    @classmethod
    def load(cls, env=None, *, use_file=True):
        """The environment first, then the file (CAROUSEL_CONFIG, or client.ini in the user's
        home), read only for what the environment leaves out. XRootD's hooks pass use_file=False:
        they run from their environment alone (XRootD may start them with a HOME not theirs)."""
        env = os.environ if env is None else env
        url = env.get("CAROUSEL_URL") or None
        token = env.get("CAROUSEL_TOKEN") or None
        token_file = None if token else (env.get("CAROUSEL_TOKEN_FILE") or None)
        source = "CAROUSEL_URL"
        if use_file and not (url and (token or token_file)):
            path, values = _read_file(env)
            if not url and values.get("url"):
                url, source = values["url"], f"url in {path}"
            if not token and not token_file:
                token, token_file = values.get("token") or None, values.get("token_file") or None
        if not url:
            raise ClientError("no Carousel server configured", code=EXIT_CONFIG,
                              hint=f"set CAROUSEL_URL (e.g. https://carousel.example.org) or url in {CONFIG_FILE}")
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError on a port that is not a number
        except ValueError as exc:
            raise ClientError(f"{source} is not a URL ({url!r}: {exc})", code=EXIT_CONFIG,
                              hint="give the server's address, e.g. https://carousel.example.org") from None
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ClientError(f"{source} is not an http or https address ({url!r})", code=EXIT_CONFIG,
                              hint="give the server's address with its scheme, e.g. https://carousel.example.org")
        api = API.rstrip("/")
        if parts.path.rstrip("/").endswith(api):
            # The client adds /api/v1/ itself: with it in the address every call is a 404.
            raise ClientError(f"{source} ends in {api} ({url}): give the server's address, "
                              f"{url.rstrip('/').removesuffix(api)}; the client adds {api}/ itself", code=EXIT_CONFIG)
        if token_file:
            try:
                token = Path(os.path.expanduser(token_file)).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ClientError(f"cannot read the token file {token_file}: {exc.strerror}", code=EXIT_CONFIG,
                                  hint="check CAROUSEL_TOKEN_FILE and that this user may read it")
            except UnicodeDecodeError:
                raise ClientError(f"cannot read the token file {token_file}: it is not text (UTF-8)",
                                  code=EXIT_CONFIG, hint="it holds the token alone, on one line") from None
        if not token:
            raise ClientError("no API token configured", code=EXIT_CONFIG,
                              hint=f"set CAROUSEL_TOKEN or CAROUSEL_TOKEN_FILE, or token in {CONFIG_FILE}; "
                                   "your token is on your Carousel page or from your operator")
        if not (token.isascii() and token.isprintable() and " " not in token):
            # It travels in a header: httpx refused it with a traceback, or the server was
            # reported unreachable ("Illegal header value").
            raise ClientError("the API token has characters no token has (spaces, line breaks or letters "
                              "outside ASCII: a bad paste?)", code=EXIT_CONFIG,
                              hint="copy it again from your Carousel page; CAROUSEL_TOKEN or CAROUSEL_TOKEN_FILE")
        return cls(url.rstrip("/"), token)


def _read_file(env):
    """(path, the [carousel] section's values) of the configuration file; no file, no values. A
    file that exists but cannot be read is an error in one line, never a traceback."""
    home = env.get("HOME")
    named = env.get("CAROUSEL_CONFIG") or (Path(home) / CONFIG_FILE.relative_to("~") if home else "")
    if not str(named):
        return None, {}
    path = Path(named)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return path, {}
    except UnicodeDecodeError:
        raise ClientError(f"cannot read {path}: it is not UTF-8 text", code=EXIT_CONFIG)
    except OSError as exc:
        raise ClientError(f"cannot read {path}: {exc.strerror}; set CAROUSEL_CONFIG, or CAROUSEL_URL and "
                          "CAROUSEL_TOKEN", code=EXIT_CONFIG)
    parser = configparser.ConfigParser()
    try:
        parser.read_string(text, source=str(path))
    except configparser.Error as exc:
        raise ClientError(f"cannot read {path}: {exc}", code=EXIT_CONFIG,
                          hint="it is an INI file with a [carousel] section (url, token or token_file)")
    return path, dict(parser["carousel"]) if parser.has_section("carousel") else {}


def refused_lines(errors, where=None):
    """A refused submission's paths, a line each (at most 20): where it was (by default the
    server's line in the list it was sent), the path, why."""
    where = where or (lambda e: f"line {e.get('line')}")
    return "".join(f"\n  {where(e)}: {e.get('path')}: {e.get('message')}" for e in errors[:20])


def authorization(token):
    # Carousel's own API tokens are opaque keys; WLCG tokens (JWTs) travel as bearer tokens.
    return f"Bearer {token}" if token.count(".") == 2 else f"Token {token}"


class Client:
    """One HTTP client for every program. Retries what may succeed later (429 with its
    Retry-After, 502-504, a refused or unreachable server) with growing, jittered waits, up to
    `patience` seconds in all (`reach_patience` for a server that cannot be reached, if given);
    never retries a refusal."""

    RETRY_STATUSES = (429, 502, 503, 504)

    def __init__(self, config, *, patience=60.0, reach_patience=None, timeout=30.0, connect_timeout=None,
                 sleep=time.sleep, transport=None):
        self.config, self.patience, self.sleep = config, patience, sleep
        self.reach_patience = patience if reach_patience is None else reach_patience
        self.http = httpx.Client(
            base_url=config.url, timeout=httpx.Timeout(timeout, connect=connect_timeout or timeout),
            transport=transport, headers={"Authorization": authorization(config.token), "Accept": "application/json",
                                          "User-Agent": f"carousel-client/{__version__}"})

    def request(self, method, path, **kwargs):
        url = path if path.startswith(("http://", "https://")) else API + path.lstrip("/")
        waited, delay = 0.0, 1.0
        while True:
            try:
                response = self.http.request(method, url, **kwargs)
            except httpx.TransportError as exc:
                response, failure = None, exc
            else:
                failure = None
                if response.status_code not in self.RETRY_STATUSES:
                    return self._answer(response)
            pause = _retry_after(response) if response is not None else None
            pause = delay * (0.5 + random.random()) if pause is None else pause
            unreachable = isinstance(failure, (httpx.ConnectError, httpx.ConnectTimeout))
            if waited + pause > (self.reach_patience if unreachable else self.patience):
                if response is None:
                    raise ClientError(f"cannot reach Carousel at {self.config.url}: {failure}", code=EXIT_UNAVAILABLE,
                                      hint="check CAROUSEL_URL and that the server is running "
                                           "(CAROUSEL_RETRY_S=SECONDS: keep trying that long)")
                return self._answer(response)
            self.sleep(pause)
            waited += pause
            delay = min(delay * 2, 30.0)

    def get(self, endpoint, **params):
        # Only what was not given is left out: an empty filter (`ls --state ""`) goes to the server,
        # which refuses it, rather than becoming no filter and listing everything.
        return self.request("GET", endpoint, params={k: v for k, v in params.items() if v is not None})

    def post(self, endpoint, body=None):
        return self.request("POST", endpoint, json=body)

    def pages(self, endpoint, **params):
        """Every item of a paginated listing, page after page."""
        page = self.get(endpoint, page_size=1000, **params)
        while True:
            yield from page["results"]
            if not page.get("next"):
                return
            page = self.request("GET", page["next"])

    def _answer(self, response):
        if response.is_success:
            return response.json() if response.content else None
        status = response.status_code
        try:
            body = response.json()
        except ValueError:
            if 400 <= status < 500:
                # Carousel's API answers every error in JSON, also for an address it has not: a
                # page (HTML) means the address leads elsewhere, e.g. CAROUSEL_URL with a page's
                # path. (A 5xx page is a proxy's while the server is away: retried below.)
                raise ClientError(f"{self.config.url} answered HTTP {status} with a page, not Carousel's API: check "
                                  "CAROUSEL_URL", code=EXIT_CONFIG, status=status,
                                  hint="give the server's address, e.g. https://carousel.example.org") from None
            body = {"detail": response.text[:300].strip() or response.reason_phrase}
        detail = body.get("detail") if isinstance(body, dict) else str(body)
        if status == 401:
            raise ClientError(f"the server refused the token: {detail}", code=EXIT_AUTH, status=status, body=body,
                              hint="check CAROUSEL_TOKEN / CAROUSEL_TOKEN_FILE; the token may be wrong or revoked")
        if status == 403:
            raise ClientError(f"not allowed: {detail}", code=EXIT_AUTH, status=status, body=body,
                              hint="ask your Carousel operator for access")
        if status == 404:
            raise ClientError(f"not found: {detail}", code=EXIT_NOT_FOUND, status=status, body=body)
        if status == 429:
            raise ClientError(f"the server kept asking to slow down: {detail}", code=EXIT_UNAVAILABLE,
                              status=status, body=body, hint="try again later")
        if 400 <= status < 500:
            errors = body.get("errors") if isinstance(body, dict) else None
            raise ClientError(f"refused: {detail}{refused_lines(errors or [])}", code=EXIT_REFUSED, status=status,
                              body=body)
        raise ClientError(f"the server failed ({status}): {detail}", code=EXIT_UNAVAILABLE, status=status, body=body,
                          hint="try again later; if it persists, tell your Carousel operator")

    # The calls the programs share ------------------------------------------------------

    def submit(self, paths, **options):
        return self.post("requests/", {"paths": list(paths), **{k: v for k, v in options.items() if v is not None}})

    def requests_for_path(self, path, **filters):
        """This user's requests for exactly `path`, newest first (the API filters by substring)."""
        return [r for r in self.pages("requests/", path=path, **filters) if r["path"] == path]

    def bulk_by_label(self, label):
        found = self.get("bulks/", label=label)["results"]
        return found[0] if found else None


def _retry_after(response):
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def report(error, *, as_json=False, stream=None):
    """Print an error the one way all programs do, and return its exit code."""
    import json

    stream = stream or sys.stderr
    if as_json:
        print(json.dumps(error.as_dict()), file=sys.stdout)
    print(f"carousel: {error.message}", file=stream)
    if error.hint:
        print(f"  {error.hint}", file=stream)
    return error.code
