"""The `splitrl` command."""
