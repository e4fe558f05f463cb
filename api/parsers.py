"""The API's JSON parser: DRF's, with the limits a public endpoint needs. A body past the
size limit is a 413 before it is read whole; JSON nested deeper than any of our bodies, or
holding a lone surrogate (valid JSON, but not text PostgreSQL or a UTF-8 page can carry), is a
400 that says where."""
import json

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError
from rest_framework.utils.json import strict_constant

from .errors import PayloadTooLarge, body_limit_message

# Our bodies are an object holding lists of strings; anything deeper is not ours.
MAX_DEPTH = 32


def _content_length(parser_context):
    request = (parser_context or {}).get("request")
    meta = getattr(request, "META", {}) if request is not None else {}
    try:
        return int(meta.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


def _not_text(data):
    """Where (e.g. 'paths[3]') the first string that is not text is, or None. Iterative, so the
    depth of the document cannot exhaust Python's stack."""
    stack = [(data, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            return where or "body", f"JSON nested more than {MAX_DEPTH} levels deep"
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    return where or "body", "contains a lone surrogate (\\ud800-\\udfff), which is not text"
        elif isinstance(value, dict):
            for key, item in value.items():
                stack.append((key, f"{where}key {key[:50]!r}", depth + 1))
                stack.append((item, f"{where}.{key}" if where else key, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))
    return None


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if _content_length(parser_context) > limit:
            raise PayloadTooLarge(body_limit_message(limit))
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise PayloadTooLarge(body_limit_message(limit))
        encoding = parsers.get_encoding(parser_context or {})
        try:
            data = json.loads(raw.decode(encoding), parse_constant=strict_constant if self.strict else None)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested too deeply (more than {MAX_DEPTH} levels)") from None
        except ValueError as exc:  # UnicodeDecodeError is one
            raise ParseError(f"JSON parse error - {exc}") from None
        bad = _not_text(data)
        if bad:
            where, what = bad
            raise ParseError(f"JSON parse error - {where}: {what}")
        return data
