"""The local workspace: a folder with a SQLite catalogue and a datastore (Azure ML's Workspace, offline).

    .trainbook/
      catalogue.sqlite     data assets, runs and models, schema versioned by PRAGMA user_version
      datastore/           immutable, content-addressed snapshots of registered data (blobs/, listings/,
                           snapshots/: the layout is toolkit.catalogue.data_store's to define,
                           toolkit.catalogue.data_verify's to check)

Every write is one ``BEGIN IMMEDIATE`` transaction, so several processes registering at once serialise on
the database lock: nothing is lost and no version number is handed out twice. A workspace this user cannot write
opens read-only (looking works, a write is refused before anything is stored), and a damaged catalogue is refused
at open in one line naming the file and what to do; it is never rewritten.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sqlite3
from pathlib import Path

from toolkit.errors import UserError, not_allowed, refused
from toolkit.paths import CATALOGUE_NAME

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


DAMAGED = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}  # SQLite's names for a file that is not (or no longer) a database


class WorkspaceError(UserError, RuntimeError):
    pass


def default_path() -> Path:
    """$TRAINBOOK_WORKSPACE, else ./.trainbook in the current folder."""
    return Path(os.environ.get("TRAINBOOK_WORKSPACE", DEFAULT_DIR))


def _writable(root: Path) -> bool:
    """Whether this user can write the workspace: its folder (where SQLite keeps its journal) and its catalogue.
    access() answers for root too where root cannot write (an immutable folder, a read-only mount)."""
    catalogue = root / CATALOGUE_NAME
    return os.access(root, os.W_OK) and (not catalogue.exists() or os.access(catalogue, os.W_OK))


def _make_folder(root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except PermissionError as exc:
        raise WorkspaceError(
            not_allowed(
                "workspace",
                root,
                "an existing workspace, or a folder this user can create",
                problem=f"cannot be created ({exc.strerror})",
            )
        ) from None


class Workspace:
    def __init__(self, root: Path, read_only: bool = False):
        self.root = root
        self.db_path = root / CATALOGUE_NAME
        self.datastore = root / "datastore"
        self.read_only = read_only  # this user cannot write it: looking works, every write is refused

    @classmethod
    def open(cls, path: str | Path | None = None) -> Workspace:
        """Open the workspace at ``path`` (default: :func:`default_path`), creating it on first use. A workspace this
        user cannot write opens read-only: its catalogue is read, never written (:meth:`require_writable`)."""
        root = Path(path) if path is not None else default_path()
        if root.exists() and not root.is_dir():
            raise WorkspaceError(not_allowed("workspace", root, "a folder (created if missing)", problem="is a file"))
        _make_folder(root)
        ws = cls(root.resolve(), read_only=not _writable(root))
        if ws.read_only and not ws.db_path.is_file():
            ws.require_writable()  # no catalogue to read, and none can be made
        if not ws.read_only:
            ws.datastore.mkdir(exist_ok=True)
        ws.check_intact()  # before a migration writes to it
        ws.migrate()
        return ws

    @classmethod
    def existing(cls, path: str | Path | None = None) -> Workspace | None:
        """The workspace at ``path`` (default: :func:`default_path`) if one was made there, else None: what a
        read-only verb (a listing) opens, so that looking never creates a workspace."""
        root = Path(path) if path is not None else default_path()
        if not (root / CATALOGUE_NAME).is_file():
            return None
        return cls.open(root)

    def require_writable(self) -> None:
        """Refuse a write to a read-only workspace, before anything is stored."""
        if self.read_only:
            raise WorkspaceError(
                not_allowed(
                    "workspace",
                    self.root,
                    "a workspace this user can write, for a verb that writes (data register, "
                    "archive, verify --repair, train, export --register); data list/show, data verify, runs and models "
                    "also work on a read-only one",
                    problem="is read-only (this user cannot write it); nothing was changed",
                )
            )

    def _damaged(self, what: str) -> str:
        aside = self.db_path.with_name(f"{CATALOGUE_NAME}.damaged")
        return refused(
            "workspace",
            f"the catalogue {str(self.db_path)!r} is damaged ({what}); it was left as it is",
            f"a catalogue SQLite can read: restore it from a backup, or move it aside (mv "
            f"{shlex.quote(str(self.db_path))} {shlex.quote(str(aside))}) and the next command starts an "
            "empty catalogue there (the datastore keeps its files: register your data again)",
        )

    @contextlib.contextmanager
    def _sqlite_errors(self):
        """SQLite's refusals of the catalogue file itself, as one WorkspaceError naming it and what to do."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorname", None) in DAMAGED:
                raise WorkspaceError(self._damaged(str(exc))) from None
            if self.read_only and isinstance(exc, sqlite3.OperationalError):  # e.g. a journal it may not read
                raise WorkspaceError(
                    not_allowed(
                        "workspace",
                        self.root,
                        "a read-only workspace whose catalogue SQLite can open read-only (open it "
                        "once where it is writable, to settle its journal)",
                        problem=f"is read-only and its catalogue cannot be opened read-only ({exc})",
                    )
                ) from None
            raise

    def _read_only_uri(self) -> str:
        """mode=ro; also immutable (no lock or -shm file, which an unwritable folder cannot hold) unless a writer left
        a write-ahead log there, whose commits only a reader that maps its -shm file sees."""
        settled = not os.access(self.root, os.W_OK) and not Path(f"{self.db_path}-wal").exists()
        return self.db_path.as_uri() + ("?mode=ro&immutable=1" if settled else "?mode=ro")

    def connect(self) -> sqlite3.Connection:
        with self._sqlite_errors():
            if self.read_only:
                conn = sqlite3.connect(self._read_only_uri(), uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            else:
                conn = sqlite3.connect(self.db_path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
                try:
                    conn.execute("PRAGMA journal_mode=WAL")  # readers never wait for a writer
                    conn.execute("PRAGMA synchronous=FULL")  # a committed registration survives a power cut
                except sqlite3.Error:
                    conn.close()
                    raise
        conn.row_factory = sqlite3.Row
        return conn

    @contextlib.contextmanager
    def transaction(self):
        """One write transaction: taken with BEGIN IMMEDIATE (the write lock at once, no upgrade deadlocks)."""
        self.require_writable()
        conn = self.connect()
        try:
            with self._sqlite_errors():
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
            with self._sqlite_errors():
                return conn.execute("PRAGMA user_version").fetchone()[0]
        finally:
            conn.close()

    def check_intact(self) -> None:
        """Refuse a damaged catalogue (a bad header, a file cut short) at open, in one line that says what to do,
        rather than as SQLite's error from whichever query first reads a missing page. The catalogue is small:
        checking every page of it takes milliseconds."""
        conn = self.connect()
        try:
            with self._sqlite_errors():
                verdict = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
        finally:
            conn.close()
        if verdict != "ok":
            raise WorkspaceError(self._damaged(verdict))

    def _check_schema(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise WorkspaceError(
                refused(
                    "workspace",
                    f"{self.root} has schema version {version}, this Trainbook knows up to {SCHEMA_VERSION}",
                    "a workspace made by this or an older version",
                )
            )
        if version < SCHEMA_VERSION and self.read_only:
            raise WorkspaceError(
                refused(
                    "workspace",
                    f"{self.root} has schema version {version} and needs upgrading to {SCHEMA_VERSION}, but "
                    "it is read-only",
                    "a workspace upgraded once where it is writable (any command does it)",
                )
            )

    def migrate(self) -> int:
        """Apply the migrations this workspace has not seen yet; refuse a workspace newer than this code. A read-only
        workspace is only checked: it must be at this version already."""
        if self.read_only:
            self._check_schema(self.schema_version())
            return SCHEMA_VERSION
        with self.transaction() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            self._check_schema(version)
            for script in MIGRATIONS[version:]:
                for statement in filter(str.strip, script.split(";")):
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return SCHEMA_VERSION
