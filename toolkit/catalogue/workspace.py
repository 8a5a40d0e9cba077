"""The local workspace: a folder with a SQLite catalogue and a datastore (Azure ML's Workspace, offline).

    .trainbook/
      catalogue.sqlite     data assets, runs and models, schema versioned by PRAGMA user_version
      datastore/           immutable, content-addressed snapshots of registered data (blobs/, listings/,
                           snapshots/: the layout is toolkit.catalogue.data_store's to define,
                           toolkit.catalogue.data_verify's to check)

Every write is one ``BEGIN IMMEDIATE`` transaction, so several processes registering at once serialise on
the database lock: nothing is lost and no version number is handed out twice.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from toolkit.errors import not_allowed, refused

DEFAULT_DIR = ".trainbook"
BUSY_TIMEOUT_S = 60.0

# Migration N brings the schema from version N to N + 1. Append, never edit: old workspaces replay them.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE data_assets (
        name        TEXT    NOT NULL,
        version     INTEGER NOT NULL,
        type        TEXT    NOT NULL,
        sha256      TEXT    NOT NULL,
        size_bytes  INTEGER NOT NULL,
        file_count  INTEGER NOT NULL,
        created     REAL    NOT NULL,
        source      TEXT    NOT NULL,
        description TEXT    NOT NULL DEFAULT '',
        tags        TEXT    NOT NULL DEFAULT '{}',
        snapshot    TEXT    NOT NULL,
        archived    INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (name, version)
    );
    CREATE INDEX data_assets_by_hash ON data_assets (name, sha256);
    """,
    """
    CREATE TABLE runs (
        run_dir       TEXT PRIMARY KEY,
        name          TEXT NOT NULL,
        created       REAL NOT NULL,
        config_sha256 TEXT NOT NULL,
        data          TEXT NOT NULL,
        engine        TEXT NOT NULL,
        nproc         INTEGER NOT NULL
    );
    CREATE INDEX runs_by_data ON runs (data);
    """,
    """
    CREATE TABLE models (
        name        TEXT    NOT NULL,
        version     INTEGER NOT NULL,
        sha256      TEXT    NOT NULL,
        size_bytes  INTEGER NOT NULL,
        created     REAL    NOT NULL,
        snapshot    TEXT    NOT NULL,
        run_dir     TEXT    NOT NULL,
        checkpoint  TEXT    NOT NULL,
        data        TEXT    NOT NULL,
        data_sha256 TEXT    NOT NULL,
        description TEXT    NOT NULL DEFAULT '',
        PRIMARY KEY (name, version)
    );
    CREATE INDEX models_by_hash ON models (name, sha256);
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


CATALOGUE_NAME = "catalogue.sqlite"  # a folder is a workspace once it holds this


class WorkspaceError(RuntimeError):
    pass


def default_path() -> Path:
    """$TRAINBOOK_WORKSPACE, else ./.trainbook in the current folder."""
    return Path(os.environ.get("TRAINBOOK_WORKSPACE", DEFAULT_DIR))


class Workspace:
    def __init__(self, root: Path):
        self.root = root
        self.db_path = root / CATALOGUE_NAME
        self.datastore = root / "datastore"

    @classmethod
    def open(cls, path: str | Path | None = None) -> "Workspace":
        """Open the workspace at ``path`` (default: :func:`default_path`), creating it on first use."""
        root = Path(path) if path is not None else default_path()
        if root.exists() and not root.is_dir():
            raise WorkspaceError(not_allowed("workspace", root, "a folder (created if missing)", problem="is a file"))
        root.mkdir(parents=True, exist_ok=True)
        ws = cls(root.resolve())
        ws.datastore.mkdir(exist_ok=True)
        ws.migrate()
        return ws

    @classmethod
    def existing(cls, path: str | Path | None = None) -> "Workspace | None":
        """The workspace at ``path`` (default: :func:`default_path`) if one was made there, else None: what a
        read-only verb (a listing) opens, so that looking never creates a workspace."""
        root = Path(path) if path is not None else default_path()
        if not (root / CATALOGUE_NAME).is_file():
            return None
        return cls.open(root)

    def connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.db_path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")  # readers never wait for a writer
        conn.execute("PRAGMA synchronous=FULL")  # a committed registration survives a power cut
        return conn

    @contextlib.contextmanager
    def transaction(self):
        """One write transaction: taken with BEGIN IMMEDIATE (the write lock at once, no upgrade deadlocks)."""
        conn = self.connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    def schema_version(self) -> int:
        conn = self.connect()
        try:
            return conn.execute("PRAGMA user_version").fetchone()[0]
        finally:
            conn.close()

    def migrate(self) -> int:
        """Apply the migrations this workspace has not seen yet; refuse a workspace newer than this code."""
        with self.transaction() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise WorkspaceError(refused(
                    "workspace", f"{self.root} has schema version {version}, this Trainbook knows up to "
                                 f"{SCHEMA_VERSION}", "a workspace made by this or an older version"))
            for script in MIGRATIONS[version:]:
                for statement in filter(str.strip, script.split(";")):
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return SCHEMA_VERSION
