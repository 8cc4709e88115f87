"""The edge-encoder service (edge): frame stacks, the CNN encoder in split modes, and the WAN uplink."""
