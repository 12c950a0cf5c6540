"""The one place qrag reaches past Ray Serve's public API: a replica withdrawing one multiplexed model id.
Serve's model multiplexing (`@serve.multiplexed`) evicts by model count only (least recently used, over
`max_num_models_per_replica`) and has no public call to unload a given model. A ShardSearcher's byte budget
decides what it holds (tenants' shards differ in size by orders of magnitude), so when the budget evicts a
tenant's shard group the replica must stop advertising that group, or Serve keeps routing the tenant here
(a cold load each time) and counts it against this replica when it looks for the one holding the fewest.
Ray is pinned (pyproject.toml); if Serve gains a public unload, this module is what changes."""

from __future__ import annotations

_WRAPPER = "__serve_multiplex_wrapper"  # where `@serve.multiplexed` keeps its state on the deployment instance


def withdraw(replica: object, model_id: str) -> bool:
    """Stop advertising `model_id` from this replica (pushed to Serve's controller with the replica's next
    routing report); False when it was not held."""
    wrapper = getattr(replica, _WRAPPER, None)
    if wrapper is None or wrapper.models.pop(model_id, None) is None:
        return False
    wrapper._push_multiplexed_replica_info = True
    return True
