"""The Router's routes carry their parameter types as objects, not strings: FastAPI reads a route's
parameters from its annotations, and a string it cannot resolve in the class Serve pickled by value is
taken, by newer FastAPI releases, for a required query parameter (every route then answers 422)."""

import inspect

from fastapi import Request

from qrag_ray.serving.router import Router


def test_every_route_parameter_annotation_is_a_type_not_a_string():
    router_class = getattr(Router, "func_or_class", Router)
    checked = 0
    for name, method in inspect.getmembers(router_class, inspect.isfunction):
        for parameter in inspect.signature(method).parameters.values():
            where = f"Router.{name}({parameter.name}: {parameter.annotation!r})"
            assert not isinstance(parameter.annotation, str), where
            checked += parameter.annotation is Request
    assert checked >= 2  # search and answer at least take the request
