"""The Router's routes carry their parameter types as objects, not strings: FastAPI reads a route's
parameters from its annotations, and a string it cannot resolve in the class Serve pickled by value is
taken, by newer FastAPI releases, for a required query parameter (every route then answers 422)."""

import inspect

from fastapi import Request

from qrag_ray.serving.router import Router


def test_every_route_parameter_annotation_is_a_type_not_a_string():
    cls = getattr(Router, "func_or_class", Router)
    checked = 0
    for name, fn in inspect.getmembers(cls, inspect.isfunction):
        for p in inspect.signature(fn).parameters.values():
            assert not isinstance(p.annotation, str), f"Router.{name}({p.name}: {p.annotation!r})"
            checked += p.annotation is Request
    assert checked >= 2  # search and answer at least take the request
