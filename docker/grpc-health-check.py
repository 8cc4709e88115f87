#!/opt/splitrl/bin/python
"""Exit 0 if a gRPC server answers SERVING to the standard health check (grpc.health.v1), else 1.

Usage: grpc-health-check [ADDRESS] [SERVICE]
ADDRESS defaults to 127.0.0.1:$SPLITRL_PORT; SERVICE defaults to "" (the whole server).
Docker and Compose have no native gRPC health check; Kubernetes does (probes `grpc:`).
"""

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main(argv: list[str]) -> int:
    address = argv[1] if len(argv) > 1 else f"127.0.0.1:{os.environ.get('SPLITRL_PORT', '50051')}"
    service = argv[2] if len(argv) > 2 else ""
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=3)
    except grpc.RpcError as error:
        print(f"{address}: {error.code().name}: {error.details()}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{address} {service or '(server)'}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
