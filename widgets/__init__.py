"""ipywidgets panels and notebook displays. Each wraps toolkit calls and holds no training logic itself.

Every display also renders as static HTML (IPython ``display_id`` + ``update``), so a notebook executed
headlessly by papermill still shows what happened when it is opened later, on GitHub or in a report.
"""
