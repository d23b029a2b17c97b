"""The node side of the control plane: discovery, engine adapters, supervision."""
