#!/opt/splitrl/bin/python
"""Exit 0 if a gRPC server answers SERVING to the standard health check (grpc.health.v1), else 1.

Usage: grpc-health-check [ADDRESS] [SERVICE]
ADDRESS defaults to 127.0.0.1:$SPLITRL_PORT; SERVICE defaults to "" (the whole server).
Docker and Compose have no native gRPC health check, and Kubernetes' `grpc:` probes cannot speak TLS.
The connection is secured like the container's own service: SPLITRL_TLS (default mtls) with
SPLITRL_TLS_CERT_FILE / SPLITRL_TLS_KEY_FILE / SPLITRL_TLS_CA_FILE; health checks need no bearer token.
"""

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _channel(address: str) -> grpc.Channel:
    mode = os.environ.get("SPLITRL_TLS", "mtls")
    if mode == "plaintext":
        return grpc.insecure_channel(address)

    def read(variable: str) -> bytes | None:
        path = os.environ.get(variable)
        with open(path, "rb") if path else open(os.devnull, "rb") as file:
            return file.read() or None

    own = (read("SPLITRL_TLS_KEY_FILE"), read("SPLITRL_TLS_CERT_FILE")) if mode == "mtls" else (None, None)
    credentials = grpc.ssl_channel_credentials(read("SPLITRL_TLS_CA_FILE"), own[0], own[1])
    name = os.environ.get("SPLITRL_TLS_SERVER_NAME")
    return grpc.secure_channel(address, credentials, options=[("grpc.ssl_target_name_override", name)] if name else [])


def main(argv: list[str]) -> int:
    address = argv[1] if len(argv) > 1 else f"127.0.0.1:{os.environ.get('SPLITRL_PORT', '50051')}"
    service = argv[2] if len(argv) > 2 else ""
    try:
        with _channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=3)
    except grpc.RpcError as error:
        print(f"{address}: {error.code().name}: {error.details()}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{address} {service or '(server)'}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
