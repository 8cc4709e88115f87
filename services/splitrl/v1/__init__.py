"""Generated from protos/splitrl/v1 by scripts/gen_protos.py. Do not edit."""
