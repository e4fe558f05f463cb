"""The error answers, in the schema: every operation documents the statuses it can give with
the error body of api/errors.py, so a client (and schemathesis) knows what a 400 looks like."""

ERROR_SCHEMA = {
    "type": "object",
    "description": "Every error answer of the API.",
    "properties": {
        "status": {"type": "integer", "description": "the HTTP status, repeated"},
        "code": {"type": "string", "description": "a stable word for programs: invalid, invalid_submission, "
                                                  "parse_error, not_found, not_authenticated, "
                                                  "authentication_failed, permission_denied, too_large, "
                                                  "unsupported_media_type, queue_ceiling_reached, throttled, ..."},
        "detail": {"type": "string", "description": "what was wrong, and where, for a person"},
        "fields": {"type": "object", "additionalProperties": True,
                   "description": "invalid input: {field: [messages]} (code invalid)"},
        "errors": {"type": "array", "items": {"type": "object", "additionalProperties": True},
                   "description": "the refused paths of a submission: index, line, path, message "
                                  "(code invalid_submission)"},
    },
    "required": ["status", "code", "detail"],
}

WHY = {
    "400": "Malformed input: the body, a parameter or a path; `detail` says what and where.",
    "401": "No credentials, or credentials that are not valid.",
    "403": "Authenticated, but not allowed to do this.",
    "404": "No such object visible to you.",
    "413": "The request body is larger than the limit (split the submission).",
    "415": "The body is not JSON.",
    "429": "Too many requests (see Retry-After), or your queue is at its ceiling.",
}
REF = {"$ref": "#/components/schemas/Error"}


def add_error_responses(result, generator, request, public):
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            params = operation.get("parameters", [])
            codes = ["401", "403", "429"]
            if operation.get("requestBody") or any(p.get("in") == "query" for p in params):
                codes.append("400")
            if any(p.get("in") == "path" for p in params):
                codes.append("404")
            if operation.get("requestBody"):
                codes += ["413", "415"]
            for code in sorted(codes):
                operation["responses"].setdefault(code, {
                    "description": WHY[code], "content": {"application/json": {"schema": REF}}})
    return result


def native_api_only(endpoints, **kwargs):
    """The views describe the native API; the Tape REST door (/.well-known/wlcg-tape-rest-api,
    /api/tape-rest/v1/) is described as the WLCG Tape REST API v1 document shapes it, by
    api/tape_rest/schema.py (a postprocessing hook), not from its views."""
    return [e for e in endpoints if not e[0].startswith(("/.well-known/", "/api/tape-rest/"))]
