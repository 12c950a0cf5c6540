"""One-parameter Serve app builders for the benchmarks that deploy two trees side by side
(bench_serving_compare.py, bench_tenants.py): the baseline commit's `qrag_ray.serving.application:build_app` took two
parameters, which Serve's declarative deploy refuses; both apps go through this shim so they are deployed
the same way (qrag_ray comes from the app's PYTHONPATH)."""


def build(args: dict):
    from qrag_ray.serving.application import build_app

    return build_app(args)


def build_with_options(args: dict):
    """`args` plus `deployment_options` (deployment name -> Serve options, as `qrag serve --config` gives
    them), so a fixed replica count replaces the code's autoscaling the way qrag's own builder does it."""
    from qrag_ray.serving.application import build_application

    args = dict(args)
    return build_application(args, args.pop("deployment_options", None))
