"""A query parameter that a route does not take is a 400 naming it, as an unknown field of a JSON
body is (api/errors.py): a misspelled or made-up filter (`?suffix=`, `?sort=val_loss`) would
otherwise answer as though no filter had been asked for.

What a route takes is what it and its dependencies declare (FastAPI's own list of them), plus the
bracketed form of a declared name (`metadata[k]=v` where `metadata` is declared). A method the
request's path does not take is a 405 first (api/errors.api_methods: the most specific path).
"""

from __future__ import annotations

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.errors import APIError, api_methods


def _declared(dependant: Dependant) -> set[str]:
    """The query parameters a route (its dependant) and its dependencies declare."""
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _declared(sub)
    return names


async def reject_unknown_query(request: Request) -> None:
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    if request.method not in api_methods(request):
        # a `{model_id:path}` route took a path whose own route has other methods (DELETE
        # /v1/models/x/content is no model "x/content"): a wrong method, answered as one
        raise StarletteHTTPException(405, "Method Not Allowed")
    accepted = _declared(route.dependant)  # a few nodes a request (a cache keyed by id() outlived its route)
    for name in request.query_params:
        if name not in accepted and name.split("[", 1)[0] not in accepted:
            takes = ", ".join(sorted(accepted)) or "none"
            raise APIError(
                400,
                f"Unrecognized query parameter: {name[:64]} (this endpoint takes: {takes})",
                param=name[:64],
                code="unknown_parameter",
            )
