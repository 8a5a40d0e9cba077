"""toolkit.deploy.onnx_file: the exporter's stack traces (the exporting machine's paths) leave every graph, nested
ones included; the rest of a node's metadata stays; a graph without them is not rewritten."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from toolkit.deploy.onnx_file import STACK_TRACE, finish


def _node(op: str, inputs, outputs, **attrs):
    node = helper.make_node(op, inputs, outputs, **attrs)
    for key, value in ((STACK_TRACE, 'File "/home/alice/project/model.py", line 3'), ("namespace", "m/linear")):
        node.metadata_props.add(key=key, value=value)
    return node


def _branch(name: str):
    return helper.make_graph([_node("Identity", ["x"], [f"{name}_y"])], name, [],
                             [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [1])])


def _model():
    top = [_node("Identity", ["x"], ["y"]),
           _node("If", ["cond"], ["z"], then_branch=_branch("then"), else_branch=_branch("else"))]
    graph = helper.make_graph(top, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
                                         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.x", 1)])


def test_stack_traces_leave_every_graph_and_the_rest_stays(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(_model(), str(path))
    assert b"/home/alice" in path.read_bytes()
    assert finish(path) == 20
    assert b"/home/alice" not in path.read_bytes() and STACK_TRACE.encode() not in path.read_bytes()
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    branches = [attr.g for attr in model.graph.node[1].attribute]
    for node in [*model.graph.node, *(n for g in branches for n in g.node)]:
        assert [(p.key, p.value) for p in node.metadata_props] == [("namespace", "m/linear")]


def test_a_graph_without_stack_traces_is_left_as_it_is(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(_model(), str(path))
    finish(path)
    before = path.stat().st_mtime_ns, path.read_bytes()
    assert finish(path) == 20
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before
