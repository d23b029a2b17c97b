"""What every part of llmgw speaks of, below all of them: values and the rules that
belong to them, importing nothing of llmgw but :mod:`llmgw.units`.

* :mod:`.catalog`: models, deployment profiles, autoscale bounds (the configuration's
  shape) and their GPU arithmetic.
* :mod:`.engines`: the engine registry, one entry per engine llmgw can run.
* :mod:`.engine_metrics`: an engine's ``/metrics`` page read in its dialect.
* :mod:`.fleet`: nodes, GPUs, placements, replica and shard states.
* :mod:`.endpoints`: the replicas the router sends requests to, and where they come from.
* :mod:`.usage`: what a request used, who sent it, and where the records go.
* :mod:`.keys`: API keys as stored.
* :mod:`.wakes`: where the planes meet for a cold start: the models requests wait for.

The router, the control plane, the transport, the agent and the store import these
downward; nothing here imports them (tests/test_import_graph.py).
"""
