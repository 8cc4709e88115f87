"""An edge written from protos/splitrl/v1 alone: it must not import splitrl (it asserts it cannot).

Run by tests/integration/test_proto_conformance.py in a fresh interpreter (`python -I`) with Python stubs and a
descriptor set (with source info: the comments) generated from the .proto files by the test. Every Tensor it
receives is checked against the `dtype [dims]` forms its field's comment documents, and decoded as the comments
say (the Tensor's dtype, row-major little-endian bytes, zstd where announced). It plays an environment on the
edge-encoder's Rollout stream, then an edge-encoder on inference's Act stream (cloud `frame` codec), provokes
refusals, samples what inference wrote to replay, and prints a JSON summary. A broken contract raises.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

#: The element types a comment may name, as the DType enum spells them (DTYPE_<upper>), and how numpy reads them.
NUMPY_OF = {
    "uint8": "<u1",
    "int8": "<i1",
    "int64": "<i8",
    "float32": "<f4",
    "float16": "<f2",
    "bool": "<u1",
    "bfloat16": "<u2",
}
TENSOR_FORM = re.compile(r"\b(" + "|".join(sorted(NUMPY_OF, key=len, reverse=True)) + r")\s+\[([^\]]*)\]")
FRAME = 96  # H = W: the frame size the services run with (the comments' default)
DEPTH = 4  # D: the frame stack


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("stubs")
    parser.add_argument("descriptors")
    parser.add_argument("--edge", required=True)
    parser.add_argument("--inference", required=True)
    parser.add_argument("--replay", required=True)
    parser.add_argument("--actions", required=True, help="discrete:<n> or continuous:<dims>")
    parser.add_argument("--codec", choices=["frame", "activation"], required=True, help="what inference serves")
    parser.add_argument("--width", type=int, required=True, help="activation width (the split modes)")
    parser.add_argument("--rollout-steps", type=int, default=300)
    parser.add_argument("--act-steps", type=int, default=150)
    args = parser.parse_args()

    # Out of reach: any sys.path entry holding splitrl's sources (an editable install adds one).
    sys.path[:] = [entry for entry in sys.path if not (Path(entry) / "splitrl").exists()]
    sys.meta_path[:] = [finder for finder in sys.meta_path if "editable" not in type(finder).__module__]
    assert importlib.util.find_spec("splitrl") is None, "splitrl is importable: this client must not see it"
    sys.path.insert(0, args.stubs)
    import splitrl  # the fresh stubs' package: splitrl.v1 and nothing else

    assert [str(Path(p).parent) for p in splitrl.__path__] == [str(Path(args.stubs))], splitrl.__path__
    assert importlib.util.find_spec("splitrl.core") is None

    kind, size = args.actions.split(":")
    contract = Contract(Path(args.descriptors), kind, int(size))
    client = Edge(contract, args)
    summary = {
        "rollout": client.rollout(args.rollout_steps),
        "act": client.act(args.act_steps),
        "refusals": client.refusals(),
    }
    summary["replay"] = client.sampled()
    summary["checked"] = contract.checked
    print(json.dumps(summary))


class Contract:
    """What the .proto comments document for each Tensor field, and the checks of a received Tensor against it."""

    def __init__(self, descriptors: Path, kind: str, size: int) -> None:
        from google.protobuf import descriptor_pb2

        from splitrl.v1 import tensor_pb2

        self.tensor_pb2, self.kind, self.size = tensor_pb2, kind, size
        files = descriptor_pb2.FileDescriptorSet.FromString(descriptors.read_bytes())
        self.comments: dict[str, str] = {}
        for file in files.file:
            for location in file.source_code_info.location:
                path = list(location.path)
                if len(path) == 4 and path[0] == 4 and path[2] == 2:  # message_type[i].field[j]
                    message = file.message_type[path[1]]
                    comment = " ".join(location.leading_comments.split())  # one line: a phrase may wrap
                    self.comments[f"{message.name}.{message.field[path[3]].name}"] = comment
        self.checked: dict[str, int] = {}

    def forms(self, field: str) -> list[tuple[str, list[str]]]:
        """The `dtype [dims]` forms `field`'s comment documents."""
        found = [
            (dtype, [d.strip() for d in dims.split(",") if d.strip()])
            for dtype, dims in TENSOR_FORM.findall(self.comments[field])
        ]
        assert found, f"{field}'s comment documents no `dtype [dims]`: {self.comments[field]!r}"
        return found

    def read(self, field: str, tensor: Any, known: dict[str, int]) -> Any:
        """`tensor` as a numpy array, checked to be one of `field`'s documented forms; binds free dims in `known`."""
        import numpy as np

        dtype = self.tensor_pb2.DType.Name(tensor.dtype).removeprefix("DTYPE_").lower()
        shape = list(tensor.shape)
        forms = self.forms(field)
        for documented, dims in forms:
            bound = dict(known)
            if documented == dtype and _fits(dims, shape, bound):
                known.update(bound)
                break
        else:
            raise AssertionError(f"{field}: received {dtype} {shape}; the proto documents {forms} (with {known})")
        data = tensor.data
        if tensor.compression == self.tensor_pb2.COMPRESSION_ZSTD:
            import zstandard

            data = zstandard.ZstdDecompressor().decompress(data)
        else:
            assert tensor.compression == self.tensor_pb2.COMPRESSION_NONE, f"{field}: compression {tensor.compression}"
        itemsize = np.dtype(NUMPY_OF[dtype]).itemsize
        assert len(data) == math.prod(shape) * itemsize, f"{field}: {len(data)} bytes for {dtype} {shape}"
        array = np.frombuffer(data, NUMPY_OF[dtype]).reshape(shape)
        if dtype == "bfloat16":
            array = (array.astype("<u4") << 16).view("<f4")
        if dtype == "bool":
            assert set(np.unique(array).tolist()) <= {0, 1}, f"{field}: bool bytes other than 0 and 1"
        self.checked[field] = self.checked.get(field, 0) + 1
        return array

    def actions(self, field: str, tensor: Any, n: int) -> Any:
        """Actions of `n` envs: documented form, and inside the action space as the comment says."""
        known = {"N": n} | ({"A": self.size} if self.kind == "continuous" else {})
        actions = self.read(field, tensor, known)
        if self.kind == "discrete":  # of the two discrete forms, the one the comment names for this many actions
            assert "uint8 [N] for a discrete action space of at most 256 actions" in self.comments[field], field
            wanted = self.tensor_pb2.DTYPE_UINT8 if self.size <= 256 else self.tensor_pb2.DTYPE_INT64
            assert tensor.dtype == wanted, f"{field}: {self.size} actions as {self.tensor_pb2.DType.Name(tensor.dtype)}"
            assert actions.shape == (n,) and ((actions >= 0) & (actions < self.size)).all(), actions
        else:
            assert actions.dtype.kind == "f" and actions.shape == (n, self.size), actions
        return actions


def _fits(dims: list[str], shape: list[int], bound: dict[str, int]) -> bool:
    """Whether `shape` is `dims` (integers, names, or name+integer) under `bound`; binds names seen first."""
    if len(dims) != len(shape):
        return False
    for dim, actual in zip(dims, shape, strict=True):
        name, _, plus = dim.replace(" ", "").partition("+")
        offset = int(plus) if plus else 0
        if name.isdigit():
            if int(name) + offset != actual:
                return False
            continue
        if name not in bound:
            bound[name] = actual - offset
        if bound[name] + offset != actual:
            return False
    return True


class Edge:
    """An environment (Rollout) and an edge-encoder (Act) of N envs with made-up frames and rewards."""

    N = 2

    def __init__(self, contract: Contract, args: argparse.Namespace) -> None:
        import grpc
        import numpy as np

        from splitrl.v1 import replay_pb2_grpc, rollout_pb2, rollout_pb2_grpc, tensor_pb2

        self.grpc, self.np, self.contract, self.pb, self.tensor_pb2 = grpc, np, contract, rollout_pb2, tensor_pb2
        self.edge = rollout_pb2_grpc.EdgeEncoderStub(grpc.insecure_channel(args.edge))
        self.inference = rollout_pb2_grpc.InferenceStub(grpc.insecure_channel(args.inference))
        # Sampled chunks of noise frames add up past gRPC's default 4 MiB receive limit.
        big = [("grpc.max_receive_message_length", 256 * 1024 * 1024)]
        self.replay = replay_pb2_grpc.ReplayStub(grpc.insecure_channel(args.replay, options=big))
        self.random = np.random.default_rng(0)
        self.codec, self.width = args.codec, args.width
        self.first_step_id = 1_000_000  # this client's step ids: first_step_id + N * message + env
        self.sent_rewards: list[list[float]] = []  # per Act message, as sent

    def frames(self, size: int = FRAME, compress: bool = False) -> Any:
        """uint8 [N, H, W] of noise: raw little-endian bytes, zstd when `compress`."""
        tensor = self.tensor_pb2.Tensor(
            dtype=self.tensor_pb2.DTYPE_UINT8,
            shape=[self.N, size, size],
            data=self.random.integers(0, 256, (self.N, size, size), dtype="u1").tobytes(),
        )
        if compress:
            import zstandard

            tensor.data = zstandard.ZstdCompressor().compress(tensor.data)
            tensor.compression = self.tensor_pb2.COMPRESSION_ZSTD
        return tensor

    def observations(self, compress: bool = False, wrong: bool = False) -> Any:
        """ActRequest.observations for the stream's codec: uint8 [N, H, W] frames, or bfloat16 [N, width] activations
        (float32's upper 16 bits); one column or 32 pixels a side too many when `wrong`."""
        if self.codec == "frame":
            return self.frames(FRAME + 32 * wrong, compress)
        values = self.random.uniform(-1, 1, (self.N, self.width + wrong)).astype("<f4")
        return self.tensor_pb2.Tensor(
            dtype=self.tensor_pb2.DTYPE_BFLOAT16,
            shape=list(values.shape),
            data=(values.view("<u4") >> 16).astype("<u2").tobytes(),
        )

    def rollout(self, steps: int) -> dict[str, int]:
        """EnvStep -> EnvAction in lockstep for `steps` vector steps; episodes end every 7th step."""
        messages = self._lockstep(self.edge.Rollout, self._env_steps(steps), ())
        versions = set()
        for sequence, reply in enumerate(messages):
            assert reply.sequence == sequence, (reply.sequence, sequence)
            self.contract.actions("EnvAction.actions", reply.actions, self.N)
            versions.add(reply.policy_version)
        assert len(messages) == steps
        return {"steps": len(messages), "policy_versions": len(versions)}

    def _env_steps(self, steps: int) -> Any:
        for sequence in range(steps):
            ended = sequence % 7 == 0 and sequence > 0
            yield self.pb.EnvStep(
                sequence=sequence,
                frames=self.frames(),
                rewards=[float(self.random.choice([-0.1, 0.0, 1.0])) for _ in range(self.N)] if sequence else [0.0] * 2,
                terminated=[True, False] if ended else [],
            )

    def act(self, steps: int) -> dict[str, int]:
        """ActRequest -> ActResponse as an edge-encoder of the cloud `frame` codec: zstd on every other frame,
        rewards as plain floats or in the reward book's codes, step ids as first_step_id then advances."""
        responses = self._lockstep(self.inference.Act, self._act_requests(steps), self._metadata(self.codec))
        policy_version = 0
        for response in responses:
            self.contract.actions("ActResponse.actions", response.actions, self.N)
            if response.HasField("policy_version"):
                policy_version = response.policy_version
        assert len(responses) == steps
        return {"steps": len(responses), "policy_version": policy_version}

    def _metadata(self, codec: str) -> tuple[tuple[str, str], ...]:
        return (("splitrl-codec", codec), ("splitrl-edge-id", "conformance"), ("splitrl-run-id", codec + "-run"))

    def _act_requests(self, steps: int) -> Any:
        book: list[float | None] = [None] * 256  # book[k]: the value in slot k (1..255), as the receiver keeps it
        next_slot = 1
        for message in range(steps):
            rewards = [float(self.random.choice([-0.1, 1.0, 0.5 * message])) for _ in range(self.N)]
            if message == 0:
                rewards = [0.0] * self.N
            self.sent_rewards.append(rewards)
            request = self.pb.ActRequest(observations=self.observations(compress=message % 2 == 1))
            if message % 3 == 0:
                request.rewards.extend(rewards)
            else:
                codes = bytearray()
                for reward in rewards:
                    if reward in book[1:]:
                        codes.append(book.index(reward, 1))
                    else:
                        codes.append(0)
                        request.new_rewards.append(reward)
                        book[next_slot] = reward
                        next_slot = next_slot % 255 + 1
                request.reward_codes = bytes(codes)
            if message % 5 == 4:
                request.terminated.extend([False, True])
            if message == 0:
                request.first_step_id = self.first_step_id
            else:
                request.step_id_advance = self.N
            yield request

    def _lockstep(self, rpc: Any, requests: Any, metadata: Any) -> list[Any]:
        """Write one request, read its answer, then the next (a gRPC stream keeps order both ways)."""
        import queue

        outgoing: queue.Queue[Any] = queue.Queue()

        def feed() -> Any:
            while True:
                item = outgoing.get()
                if item is None:
                    return
                yield item

        call = rpc(feed(), metadata=metadata, timeout=60)
        answers = []
        try:
            for request in requests:
                outgoing.put(request)
                answers.append(next(call))
        finally:
            outgoing.put(None)
        return answers

    def refusals(self) -> dict[str, str]:
        """Each malformed stream ends with the status the protos' rules imply; the servers keep serving."""
        grpc = self.grpc
        seen = {}
        cases = {
            "Act: observations of the wrong shape": (
                self.inference.Act,
                self._metadata(self.codec),
                self.pb.ActRequest(observations=self.observations(wrong=True), rewards=[0.0] * self.N, first_step_id=1),
                grpc.StatusCode.INVALID_ARGUMENT,
            ),
            "Act: a codec inference does not serve": (
                self.inference.Act,
                self._metadata("frame" if self.codec == "activation" else "activation"),
                self.pb.ActRequest(observations=self.observations(), rewards=[0.0] * self.N, first_step_id=1),
                grpc.StatusCode.FAILED_PRECONDITION,
            ),
            "Rollout: a frame tensor whose bytes do not match its shape": (
                self.edge.Rollout,
                (),
                self.pb.EnvStep(frames=self._truncated(), rewards=[0.0] * self.N),
                grpc.StatusCode.INVALID_ARGUMENT,
            ),
        }
        for name, (rpc, metadata, request, code) in cases.items():
            try:
                self._lockstep(rpc, [request], metadata)
            except grpc.RpcError as error:
                assert error.code() == code, (name, error.code(), error.details())
                assert error.details(), f"{name}: refused without a reason"
                seen[name] = f"{error.code().name}: {error.details()}"
            else:
                raise AssertionError(f"{name}: answered, not refused")
        self.rollout(3)  # still serving
        return seen

    def _truncated(self) -> Any:
        frames = self.frames()
        frames.data = frames.data[:-1]
        return frames

    def sampled(self) -> dict[str, int]:
        """Trajectories inference wrote to replay: every Tensor as Trajectory's comments document it, and the
        rewards of this client's Act steps (found by step id) as it sent them, plain or coded."""
        from splitrl.v1 import replay_pb2

        (table,) = self.replay.Info(replay_pb2.InfoRequest(), timeout=10).tables
        assert table.name == "rollouts" and table.size > 0, table
        response = self.replay.Sample(replay_pb2.SampleRequest(table="rollouts", num_items=table.size), timeout=10)
        assert len(response.items) == table.size, (len(response.items), table.size)
        rewards_checked = 0
        for item in response.items:
            trajectory = item.trajectory
            known = {"H": FRAME, "W": FRAME, "D": DEPTH, "width": self.width} | (
                {"A": self.contract.size} if self.contract.kind == "continuous" else {}
            )
            read = {}
            for field in replay_pb2.Trajectory.DESCRIPTOR.fields:
                if trajectory.HasField(field.name):
                    read[field.name] = self.contract.read(
                        f"Trajectory.{field.name}", getattr(trajectory, field.name), known
                    )
            if self.codec == "frame":
                assert "observation_index" in read, "stacks of D > 1 frames come as frames and an observation_index"
                assert read["observation_index"].max() < read["observations"].shape[0]
            else:
                assert read["observations"].shape == (known["T"] + 1, self.width)
            actions = read["actions"]
            if self.contract.kind == "discrete":
                assert ((actions >= 0) & (actions < self.contract.size)).all(), actions
            for t, step_id in enumerate(read["step_ids"][:-1].tolist()):
                message, env = divmod(step_id - self.first_step_id, self.N)
                if 0 <= message < len(self.sent_rewards) - 1:
                    assert read["rewards"][t] == self.np.float32(self.sent_rewards[message + 1][env]), (t, step_id)
                    rewards_checked += 1
        return {"items": len(response.items), "rewards_checked": rewards_checked}


if __name__ == "__main__":
    main()
