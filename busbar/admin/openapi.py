"""The admin API as an OpenAPI 3.1 document, generated from the admin site's route table (so a
route added there is documented without a second list). Each operation carries the scope it needs
as `x-busbar-required-scope` (SPEC §6)."""
from __future__ import annotations

from busbar import __version__
from busbar.admin.site import PUBLIC, required_scope

_ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["code", "message"],
        "properties": {
            "code": {"type": "string", "enum": ["unauthorized", "forbidden", "not_found",
                                                "method_not_allowed", "invalid_request",
                                                "conflict", "internal"]},
            "message": {"type": "string"},
            "problems": {"type": "array", "items": {
                "type": "object", "properties": {"path": {"type": "string"},
                                                 "message": {"type": "string"}}}},
        }}},
}
_BODY = {"/config/validate", "/config/apply", "/config/rollback"}


def document(routes) -> dict:
    paths: dict = {}
    for r in routes.table:
        path = "/" + "/".join(r.parts)
        params = [p[1:-1] for p in r.parts if p.startswith("{")]
        scope = r.scope or required_scope(r.method, path)
        op = {
            "operationId": (r.method.lower() + "_" + "_".join(
                p.strip("{}").replace(".", "_").replace("-", "_") for p in r.parts)) or "root",
            "summary": r.summary or path,
            "x-busbar-required-scope": scope,
            "responses": {
                "200": {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}},
                "default": {"description": "an error",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
            },
        }
        if scope == PUBLIC:
            op["security"] = []
        if params:
            op["parameters"] = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                                for p in params]
        if any(path.endswith(b) for b in _BODY):
            op["requestBody"] = {"required": True, "content": {
                "application/yaml": {"schema": {"type": "string"}},
                "application/json": {"schema": {"type": "object"}}}}
        paths.setdefault(path, {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "busbar admin API", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": {"Error": _ERROR},
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "adminToken": {"type": "apiKey", "in": "header", "name": "x-admin-token"},
            },
        },
        "security": [{"bearer": []}, {"adminToken": []}],
    }
