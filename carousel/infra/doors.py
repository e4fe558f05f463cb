"""Which door a request came in by, from its path, and an error answered in that door's words,
for what is refused before any view (a NUL in a query, a chunked body a server cannot end, a
Host header not allowed): the Tape REST door and its discovery speak RFC 7807 problem
documents, the API its error body (api/errors.py), the pages and the admin plain text. One
place decides, so the three answers agree (querynul missed the discovery path)."""
import json

TAPE_REST = ("/api/tape-rest/", "/.well-known/wlcg-tape-rest-api")


def door(path):
    """'tape-rest', 'api' or 'pages'."""
    if path.startswith(TAPE_REST):
        return "tape-rest"
    return "api" if path.startswith("/api/") else "pages"


def error(path, status, *, title, code, detail, api_detail=None, fields=None):
    """(content type, body bytes) of an error for the door of `path`. `title`: the problem's
    short phrase (and the text's lead); `code`: the API's; `api_detail`: the API's own wording,
    when it differs; `fields`: the API's {field: [messages]}."""
    where = door(path)
    if where == "tape-rest":
        return "application/problem+json", json.dumps({"status": status, "title": title, "detail": detail}).encode()
    if where == "api":
        body = {"status": status, "code": code, "detail": api_detail or detail}
        if fields:
            body["fields"] = fields
        return "application/json", json.dumps(body).encode()
    return "text/plain; charset=utf-8", f"{title[:1].upper()}{title[1:]}: {detail}.\n".encode()
