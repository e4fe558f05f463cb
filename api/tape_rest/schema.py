"""The Tape REST door in /api/schema/: the shapes of the WLCG Tape REST API v1 reference document,
written out once here (under the tag "WLCG Tape REST v1") rather than derived from the views,
whose bodies are the WLCG document's and not serializers'. A postprocessing hook of
drf-spectacular adds them to the native API's schema, so /api/docs/ shows both and schemathesis
(tests/test_schemathesis.py) checks the door's answers against them. Where Carousel reads the
document one way rather than another: docs/tape-rest.md."""

TAG = "WLCG Tape REST v1"
BASE = "/api/tape-rest/v1"
PROBLEM_MEDIA = "application/problem+json"


def _ref(name):
    return {"$ref": f"#/components/schemas/{name}"}


PATH = {"type": "string", "minLength": 2, "maxLength": 4096, "pattern": "^/[^\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]*[^/]$",
        "description": "an absolute path of a file: no control characters, no '.' or '..' components; duplicate "
                       "slashes are collapsed", "example": "/atlas/data/file1"}
PATHS_BODY = {
    "type": "object", "required": ["paths"],
    "properties": {"paths": {"type": "array", "minItems": 1, "items": PATH,
                             "description": "at most as many as a stage request may hold (413 beyond)"}},
}
SECONDS = {"type": "integer", "minimum": 0, "description": "seconds since the epoch"}

SCHEMAS = {
    "TapeRestProblem": {
        "type": "object", "description": "RFC 7807 problem details: every error answer of the door.",
        "required": ["status", "title"],
        "properties": {
            "status": {"type": "integer", "description": "the HTTP status, repeated"},
            "title": {"type": "string", "description": "a short, stable summary: invalid submission, not found, "
                                                       "insufficient scope, too many files, ..."},
            "detail": {"type": "string", "description": "what was wrong and where, for a person"},
            "type": {"type": "string"},
            "errors": {"type": "array", "items": {"type": "object", "additionalProperties": True},
                       "description": "extension: every refused path of a stage request (index, path, message)"},
        },
    },
    "TapeRestStageRequest": {
        "type": "object", "required": ["files"],
        "description": "Unknown members (targetQos, ...) are accepted and ignored.",
        "properties": {"files": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["path"],
            "properties": {
                "path": PATH,
                "diskLifetime": {"type": "string", "description": "ISO 8601 duration the restored copy is kept "
                                 "(PT1S to P365D); the site's default when left out", "example": "PT1H"},
                "targetedMetadata": {"type": "object", "additionalProperties": True,
                                     "description": "{sitename: {...}}; this site's key may name on_behalf_of "
                                                    "(service accounts only); others' are ignored"},
            }}}},
    },
    "TapeRestStageCreated": {
        "type": "object", "required": ["requestId"], "properties": {"requestId": {"type": "string"}},
    },
    "TapeRestStageStatus": {
        "type": "object", "required": ["id", "createdAt", "startedAt", "files"],
        "properties": {
            "id": {"type": "string"},
            "createdAt": SECONDS,
            "startedAt": SECONDS,
            "completedAt": {**SECONDS, "description": "once every file is in a final state"},
            "files": {"type": "array", "items": {
                "type": "object", "required": ["path", "state"],
                "properties": {
                    "path": PATH,
                    "state": {"type": "string", "enum": ["SUBMITTED", "STARTED", "CANCELLED", "FAILED", "COMPLETED"]},
                    "startedAt": SECONDS,
                    "finishedAt": SECONDS,
                    "error": {"type": "string", "description": "why the file FAILED"},
                }}},
        },
    },
    "TapeRestPaths": PATHS_BODY,
    "TapeRestArchiveInfo": {
        "type": "array", "description": "one entry per path asked, in order",
        "items": {"type": "object", "required": ["path"], "properties": {
            "path": {"type": "string"},
            "locality": {"type": "string", "enum": ["DISK", "TAPE", "DISK_AND_TAPE", "LOST", "NONE", "UNAVAILABLE"]},
            "error": {"type": "string", "description": "no such file, not yours to ask about, or not known yet "
                                                       "(being located: ask again)"},
        }, "oneOf": [{"required": ["locality"], "not": {"required": ["error"]}},
                     {"required": ["error"], "not": {"required": ["locality"]}}]},
    },
    "TapeRestDiscovery": {
        "type": "object", "required": ["sitename", "endpoints"],
        "properties": {
            "sitename": {"type": "string"},
            "description": {"type": "string"},
            "endpoints": {"type": "array", "items": {
                "type": "object", "required": ["uri", "version"],
                "properties": {"uri": {"type": "string"}, "version": {"type": "string"},
                               "metadata": {"type": "object", "additionalProperties": True}}}},
        },
    },
}

WHY = {
    "400": "The body is not a JSON object of the document's shape, or a path is not valid; `detail` says where.",
    "401": "No credentials, or credentials that are not valid.",
    "403": "Not allowed: a token whose scopes do not cover the paths (WWW-Authenticate: Bearer "
           'error="insufficient_scope"), or an on_behalf_of from an account that may not act for others.',
    "404": "No such stage request visible to you.",
    "413": "More paths than one call may hold, or a body larger than the limit: split it.",
    "429": "Too many calls (Retry-After), or too many unfinished stage requests.",
}


def _problems(*codes):
    return {code: {"description": WHY[code], "content": {PROBLEM_MEDIA: {"schema": _ref("TapeRestProblem")}}}
            for code in codes}


def _json(name):
    return {"content": {"application/json": {"schema": _ref(name)}}}


REQUEST_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"},
              "description": "the requestId the stage call answered (gfal-evict's gfal2-placeholder-id: release "
                             "by path, for the caller)"}


def _operation(operation_id, summary, responses, *, body=None, parameters=None, secure=True):
    op = {"operationId": operation_id, "tags": [TAG], "summary": summary, "responses": responses}
    if body:
        op["requestBody"] = {"required": True, **_json(body)}
    if parameters:
        op["parameters"] = parameters
    # As the native API's: a WLCG JWT or an API token with Bearer (gfal2's BEARER_TOKEN), Token, a session.
    op["security"] = [{"bearerAuth": []}, {"tokenAuth": []}, {"cookieAuth": []}] if secure else []
    return op


EMPTY = {"description": "Done; no body."}
COMMON = ("401", "403", "429")

PATHS = {
    "/.well-known/wlcg-tape-rest-api": {"get": _operation(
        "tape_rest_discovery", "Discovery: the site's name and the v1 endpoint.",
        {"200": {"description": "The discovery document.", **_json("TapeRestDiscovery")}},
        secure=False)},
    f"{BASE}/stage": {"post": _operation(
        "tape_rest_stage", "Stage files: one stage request, every path SUBMITTED from the answer on.",
        {"201": {"description": "Created; Location names the request.", **_json("TapeRestStageCreated"),
                 "headers": {"Location": {"schema": {"type": "string"}, "description": "{base}/stage/{id}"}},
                 # What a client does next with the id (schemathesis follows these).
                 "links": {name: {"operationId": op, "parameters": {"id": "$response.body#/requestId"}}
                           for name, op in (("Poll", "tape_rest_stage_status"), ("Cancel", "tape_rest_stage_cancel"),
                                            ("Release", "tape_rest_release"), ("Delete", "tape_rest_stage_delete"))}},
         **_problems("400", "413", *COMMON)}, body="TapeRestStageRequest")},
    f"{BASE}/stage/{{id}}": {
        "get": _operation("tape_rest_stage_status", "A stage request and the state of each of its files.",
                          {"200": {"description": "The request.", **_json("TapeRestStageStatus")},
                           **_problems("404", *COMMON)}, parameters=[REQUEST_ID]),
        "delete": _operation("tape_rest_stage_delete", "Cancel a stage request's unfinished files and forget it.",
                             {"200": EMPTY, **_problems("404", *COMMON)}, parameters=[REQUEST_ID]),
    },
    f"{BASE}/stage/{{id}}/cancel": {"post": _operation(
        "tape_rest_stage_cancel", "Cancel some files of a stage request; a path not in it changes nothing (400).",
        {"200": EMPTY, **_problems("400", "404", "413", *COMMON)}, body="TapeRestPaths", parameters=[REQUEST_ID])},
    f"{BASE}/release/{{id}}": {"post": _operation(
        "tape_rest_release", "End the pins of some files of a stage request.",
        {"200": EMPTY, **_problems("400", "404", "413", *COMMON)}, body="TapeRestPaths", parameters=[REQUEST_ID])},
    f"{BASE}/archiveinfo": {"post": _operation(
        "tape_rest_archiveinfo", "Where files are, path by path: a locality, or an error of their own.",
        {"200": {"description": "One entry per path, each with a locality or an error.",
                 **_json("TapeRestArchiveInfo")},
         **_problems("400", "413", *COMMON)}, body="TapeRestPaths")},
}


def add_tape_rest_door(result, generator, request, public):
    """drf-spectacular postprocessing hook: the door's operations, beside the native API's."""
    result.setdefault("paths", {}).update(PATHS)
    result.setdefault("components", {}).setdefault("schemas", {}).update(SCHEMAS)
    tags = result.setdefault("tags", [])
    if not any(t.get("name") == TAG for t in tags):
        tags.append({"name": TAG, "description": "The grid's door, as gfal2, FTS and Rucio speak it: the WLCG Tape "
                                                 "REST API v1. Errors are RFC 7807 problem documents. See "
                                                 "docs/tape-rest.md."})
    return result
