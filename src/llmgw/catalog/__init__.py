"""The model catalog: the models clients name, and what may be done with them.

- :mod:`llmgw.catalog.rules`: what a valid catalog is (``check_models``, asked by the
  configuration loader, the admin API and the live registry alike) and how a name
  resolves in one (``Catalog``: aliases, the fallback order).
- :mod:`llmgw.catalog.live`: the live catalog (``ModelRegistry``), the configuration's
  models plus those added at runtime and kept in the store.

The values themselves (``ModelConfig``, ``DeploymentProfile``, ``AutoscaleConfig``) stay
in :mod:`llmgw.domain.catalog`: the configuration, the store and the agent protocol carry
them, and the rules sit below the configuration while the live registry sits above it
and the store, so only the domain layer is below all of their users.

This module imports nothing: the configuration imports the rules and the live registry
imports the configuration, so re-exporting both here would make an import cycle.
"""
