"""A policy network's acting pass run by ONNX Runtime: the same layers and weights as torch's, as an ONNX graph.

Inference acts on a few rows at a time (4 per CarRacing env group of the bench). At that size torch's eager CPU
kernels cost about twice ONNX Runtime's, which packs each weight into its kernels' layout once per session.
Training stays in torch.

`ForwardGraph` writes the network's forward pass, up to the action distribution's parameters and the value, as
an ONNX graph once; `ForwardGraph.session(state_dict)` makes an ONNX Runtime session holding one version of the
weights (~10-70 ms of CPU for CarRacing's 8.7 MB: the weights thread does it, between two batches of acting).
The outputs equal torch's within float32 rounding: the same operations in the same order, computed by other
kernels (`tests/unit/test_onnx_forward.py` compares them).

Only the layers splitrl's networks are built from (core.models: Conv2d, ReLU, Flatten, Linear, LayerNorm without
affine parameters) are written; any other raises UnsupportedLayer, naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from splitrl.core.models import UNIT_SCALE, ActorCritic, ActorCriticHead

#: ONNX operator set the graph is written in (LayerNormalization needs 17).
OPSET = 17
INPUT = "observations"
OUTPUTS = ("logits_or_mean", "value")


class UnsupportedLayer(TypeError):
    """The network holds a layer ForwardGraph cannot write."""


@dataclass(frozen=True)
class ForwardOutputs:
    """One acting pass over B rows: the action distribution's parameters [B, A] (logits, or the Gaussian's mean)
    and the value [B], float32."""

    logits_or_mean: torch.Tensor
    value: torch.Tensor


class ForwardGraph:
    """`network`'s acting pass as an ONNX graph: uint8 frame stacks [B, C, S, S] (ActorCritic) or float32
    activations [B, width] (ActorCriticHead) in, ForwardOutputs out. Weights come with each session."""

    def __init__(self, network: nn.Module, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        writer = _GraphWriter(network)
        self.parameter_names = tuple(writer.initializer_names)  # the network's state_dict keys the graph reads
        self._graph = writer.graph()
        self.input_dtype = torch.uint8 if isinstance(network, ActorCritic) else torch.float32

    def session(self, state_dict: dict[str, torch.Tensor]) -> Session:
        """An ONNX Runtime session acting with `state_dict`'s weights (the network's own keys; others ignored)."""
        missing = [name for name in self.parameter_names if name not in state_dict]
        if missing:
            raise KeyError(f"state_dict lacks {missing}")
        graph = onnx.GraphProto()
        graph.CopyFrom(self._graph)
        graph.initializer.extend(
            numpy_helper.from_array(state_dict[name].detach().float().contiguous().numpy(), name)
            for name in self.parameter_names
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3  # errors only
        # Threads beyond the caller's sleep between calls instead of spinning on cores the other services need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        ort_session = onnxruntime.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        return Session(ort_session, self.input_dtype)


class Session:
    """One version of the weights, ready to act: `run` is safe to call from one thread at a time."""

    def __init__(self, ort_session: onnxruntime.InferenceSession, input_dtype: torch.dtype) -> None:
        self._session = ort_session
        self._input_dtype = input_dtype

    def run(self, observations: torch.Tensor) -> ForwardOutputs:
        """observations: uint8 stacks [B, C, S, S] or activations [B, width] of any float dtype (as float32)."""
        rows = observations.to(self._input_dtype).contiguous().numpy()
        logits_or_mean, value = self._session.run(list(OUTPUTS), {INPUT: rows})
        return ForwardOutputs(torch.from_numpy(logits_or_mean), torch.from_numpy(value).squeeze(-1))


class _GraphWriter:
    """Writes nodes layer by layer; each layer's parameters keep their state_dict names as initializer names."""

    def __init__(self, network: nn.Module) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializer_names: list[str] = []
        self._constants: list[onnx.TensorProto] = []
        self._module_names = {module: name for name, module in network.named_modules()}
        if isinstance(network, ActorCritic):
            stack_shape: list[str | int] = ["rows", *network.encoder.input_shape]
            self._input = helper.make_tensor_value_info(INPUT, TensorProto.UINT8, stack_shape)
            cast = self._node("Cast", [INPUT], to=TensorProto.FLOAT)
            # core.models.unit_range: times float32(1 / 255), as torch does, not a division.
            scaled = self._node("Mul", [cast, self._constant("unit_scale", np.float32(UNIT_SCALE))])
            hidden = self._layers(network.encoder.net, scaled)
            head = network.head
        elif isinstance(network, ActorCriticHead):
            self._input = helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["rows", network.width])
            hidden, head = INPUT, network
        else:
            raise UnsupportedLayer(f"ForwardGraph writes ActorCritic or ActorCriticHead, not {type(network).__name__}")
        hidden = self._layers(head.trunk, hidden)
        self._output(self._layers(head.actor, hidden), OUTPUTS[0])
        self._output(self._layers(head.critic, hidden), OUTPUTS[1])

    def graph(self) -> onnx.GraphProto:
        outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in OUTPUTS]
        return helper.make_graph(self.nodes, "policy", [self._input], outputs, initializer=self._constants)

    def _layers(self, module: nn.Module, value: str) -> str:
        if isinstance(module, nn.Sequential):
            for layer in module:
                value = self._layers(layer, value)
            return value
        if isinstance(module, nn.ReLU):
            return self._node("Relu", [value])
        if isinstance(module, nn.Flatten) and module.start_dim == 1 and module.end_dim == -1:
            return self._node("Flatten", [value], axis=1)
        if isinstance(module, nn.Linear):
            return self._node("Gemm", [value, *self._parameters(module)], transB=1)
        if isinstance(module, nn.Conv2d) and module.padding_mode == "zeros" and isinstance(module.padding, tuple):
            pads = [*module.padding, *module.padding]
            return self._node(
                "Conv",
                [value, *self._parameters(module)],
                kernel_shape=list(module.kernel_size),
                strides=list(module.stride),
                pads=pads,
                dilations=list(module.dilation),
                group=module.groups,
            )
        if isinstance(module, nn.LayerNorm) and not module.elementwise_affine and len(module.normalized_shape) == 1:
            width = module.normalized_shape[0]
            name = self._module_names[module]
            scale = self._constant(f"{name}.scale", np.ones(width, np.float32))
            bias = self._constant(f"{name}.bias", np.zeros(width, np.float32))
            return self._node("LayerNormalization", [value, scale, bias], axis=-1, epsilon=module.eps)
        raise UnsupportedLayer(f"ForwardGraph cannot write {self._module_names.get(module, '?')}: {module!r}")

    def _parameters(self, layer: nn.Module) -> list[str]:
        prefix = self._module_names[layer]
        names = [f"{prefix}.{name}" for name, _ in layer.named_parameters(recurse=False)]
        self.initializer_names.extend(names)
        return names

    def _constant(self, name: str, value: np.ndarray | np.generic) -> str:
        self._constants.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def _node(self, op: str, inputs: list[str], **attributes: Any) -> str:
        output = f"{op.lower()}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [output], **attributes))
        return output

    def _output(self, value: str, name: str) -> None:
        self.nodes.append(helper.make_node("Identity", [value], [name]))
