"""What every model.onnx this toolkit writes goes through after ``torch.onnx.export``: the exporting machine's file
paths taken out, and the opset it targets read back.

torch's exporter stores, on every node, the Python stack that produced it (``pkg.torch.onnx.stack_trace``): absolute
paths of the exporter's checkout and site-packages. A shipped graph should not carry them (they name the user's
folders), and with them the same weights exported from another checkout are other bytes, so the model registry,
which names a version by its files' hashes, would make a new version of the same model. The other node metadata
(module names, the FX node) say where a node came from without naming a machine, and stay.
"""

from __future__ import annotations

from pathlib import Path

STACK_TRACE = "pkg.torch.onnx.stack_trace"


def _graphs(graph):
    """The graph and every subgraph its nodes hold (If/Loop/Scan bodies)."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.g.node:
                yield from _graphs(attribute.g)
            for sub in attribute.graphs:
                yield from _graphs(sub)


def finish(path: Path) -> int:
    """Rewrite ``path`` without the stack traces; return the default-domain opset it was exported at."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    nodes = [node for graph in _graphs(model.graph) for node in graph.node]
    nodes += [node for function in model.functions for node in function.node]
    changed = False
    for node in nodes:
        kept = [prop for prop in node.metadata_props if prop.key != STACK_TRACE]
        if len(kept) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(kept)
            changed = True
    if changed:
        onnx.save(model, str(path))
    return max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
