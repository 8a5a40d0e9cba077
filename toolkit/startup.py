"""A process's start-up without the cyclic garbage collector walking what the start-up builds.

Importing torch (and torch._dynamo, which torch.optim imports when the first optimizer is made) creates hundreds of
thousands of objects that live as long as the process and leave almost no garbage. CPython 3.11's collector walks
them again and again while they are created (each burst of allocations triggers a pass), and walks them all again
in the collections of interpreter shutdown: for a short run that is a large part of a rank's life, and it is paid
again at every restart. ``long_lived()`` holds the collector off while a process imports and builds, then freezes
what was built (``gc.freeze``: moved to a generation no collection visits), so collections during training and at
exit only see what came after. bench/bench_startup.py measures it.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def long_lived() -> Iterator[None]:
    """Build the process's long-lived state (imports, model, engine) in the body. The few reference cycles the body
    drops are kept with it, not collected: the price of never walking the rest."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def short_lived() -> None:
    """For a process that does one thing and ends (a command of the CLI): the collections of interpreter shutdown
    skip everything, as the operating system frees it anyway. Registered first, so it runs after every other exit
    handler; files and servers are closed by the code that opened them, not by the collector."""
    atexit.register(gc.freeze)
