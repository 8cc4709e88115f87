"""splitrl: reinforcement learning split between an edge and a cloud, over gRPC.

Layout: `splitrl.core` is the shared layer every service imports (wire format,
gRPC helpers, metrics, models, environments); `splitrl.<service>` holds one
service each; `splitrl.v1` is generated from protos/splitrl/v1; `splitrl.cli`
is the `splitrl` command.
"""

__version__ = "0.1.0"
