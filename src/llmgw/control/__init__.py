"""The control plane: inventory, placement, reconciler, controller, fleet metrics."""
