"""Trainbook's library: config, training launch, run directories, TensorBoard, profiling.

Kept import-light: heavy modules (torch, deepspeed, tensorboard, azure.ai.ml) load inside the functions
that need them, so ``import toolkit`` stays fast in a notebook kernel.
"""

__version__ = "0.1.0"
