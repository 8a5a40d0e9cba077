"""Serving an exported model: runtimes (ONNX Runtime, eager torch), a batcher, the request protocol, the Azure ML
scoring script (score.py) and a local online endpoint that runs it in Azure ML's own inference server."""
