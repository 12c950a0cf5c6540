"""One-parameter Serve app builder for bench_serving_compare.py: the baseline commit's
`qrag_ray.serving.app:build_app` took two parameters, which Serve's declarative deploy refuses; both
apps go through this shim so they are deployed the same way (qrag_ray comes from the app's PYTHONPATH)."""


def build(args: dict):
    from qrag_ray.serving.app import build_app

    return build_app(args)
