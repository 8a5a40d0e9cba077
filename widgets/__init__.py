"""ipywidgets panels and notebook displays. Each wraps toolkit calls and holds no training logic itself.

Every display also renders as static HTML (IPython ``display_id`` + ``update``), so a notebook executed
headlessly by papermill still shows what happened when it is opened later, on GitHub or in a report.
"""

import importlib

try:  # every panel needs ipywidgets; a core-only install (pip install .) should say which extra brings it
    importlib.import_module("ipywidgets")
except ModuleNotFoundError as exc:
    from toolkit.extras import missing_extra_message

    raise ModuleNotFoundError(missing_extra_message(exc, "import widgets") or str(exc), name=exc.name) from None
