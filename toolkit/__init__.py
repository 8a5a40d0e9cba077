"""Trainbook's library: config, training launch, run directories, TensorBoard, profiling.

Kept import-light: heavy modules (torch, deepspeed, tensorboard, azure.ai.ml) load inside the functions
that need them, so ``import toolkit`` stays fast in a notebook kernel.
"""

__version__ = "0.1.0"

import os as _os
import sys as _sys

# DeepSpeed JIT-compiles its ops into TORCH_EXTENSIONS_DIR, by default ~/.cache/torch_extensions, shared by every
# Python environment of the user: two checkouts (or CI's clone) then invalidate each other's build and each
# recompiles (~35 s). One cache per environment; `make setup` fills it.
_os.environ.setdefault("TORCH_EXTENSIONS_DIR", _os.path.join(_sys.prefix, "torch_extensions"))
