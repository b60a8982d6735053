"""One router per resource: landing/conformance, processes, jobs, arrays, health."""

from schemas.service import Exception_

JSON_PROBLEM = "application/json"


def problems(*codes: int) -> dict:
    """OpenAPI ``responses`` entries for OGC exception bodies with these status codes."""
    text = {400: "Bad parameters", 401: "Missing or wrong token", 404: "Not found", 409: "Conflict",
            413: "Too large", 415: "Unsupported media type", 416: "Range not satisfiable",
            503: "Dask cluster unreachable"}
    return {code: {"model": Exception_, "description": text.get(code, "Error")} for code in codes}
