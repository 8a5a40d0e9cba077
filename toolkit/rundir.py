"""The run directory: the contract between the trainer, the CLI, notebooks, Azure ML jobs and tests.

runs/<name>/
  config.yaml    the fully resolved config, written before the first step
  status.json    state, pid, last step, restarts (replaced atomically, never half-written)
  events.jsonl   one JSON object a line, appended and flushed by rank 0 (schema: toolkit/events.py)
  lineage.json   data name and hash, git commit, package versions, host
  deepspeed_config.json   DeepSpeed runs: what deepspeed.initialize was handed
  tb/            TensorBoard scalars
  profile/       torch.profiler traces + summary.txt + top_operators.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import yaml

from toolkit import config as config_mod
from toolkit.errors import PathTaken, RefusedValue, not_allowed, refused
from toolkit.fsio import atomic_write_text, read_regular_file
from toolkit.plain_data import RESOLVED_CONFIG_MAX_BYTES, PlainDataError, loads_json
from toolkit import events as events_mod
from toolkit import status as run_status
from toolkit.status import STATES

# named here, the module that imports no torch, for the profiler that writes them and the reports that read them
PROFILE_DIR = "profile"
OPERATORS_FILE = "top_operators.json"  # the rows of the profiler's summary.txt, for tables a notebook renders
# status.json and lineage.json are a few KB (a classifier's label names make a lineage longest); a copied run's file
# grown to gigabytes is refused, not read into memory
RUN_JSON_MAX_BYTES = 4 << 20


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    config_path = property(lambda self: self.path / "config.yaml")
    status_path = property(lambda self: self.path / "status.json")
    events_path = property(lambda self: self.path / events_mod.EVENTS_FILE)
    lineage_path = property(lambda self: self.path / "lineage.json")
    # what deepspeed.initialize was handed (a user's file merged with the run's config), for reading, never re-read
    deepspeed_config_path = property(lambda self: self.path / "deepspeed_config.json")
    tb_dir = property(lambda self: self.path / "tb")
    profile_dir = property(lambda self: self.path / PROFILE_DIR)
    # A stop asked for (by the supervisor, on SIGTERM): every rank sees it at its next check and the run saves a
    # checkpoint, then ends. A file, not a signal to the training processes: a signal would also reach their
    # DataLoader workers (torch kills those on a SIGTERM) and a torchrun agent (which then SIGKILLs the ranks).
    stop_request_path = property(lambda self: self.path / "stop.request")

    def request_stop(self) -> None:
        atomic_write_text(self.stop_request_path, f"{time.time()}\n")

    def stop_requested(self) -> bool:
        return self.stop_request_path.exists()

    def clear_stop_request(self) -> None:
        self.stop_request_path.unlink(missing_ok=True)

    @classmethod
    def create(cls, path: str | Path, cfg: config_mod.Config) -> RunDir:
        run = cls(path)
        if run.config_path.exists():
            raise PathTaken(refused("--run-dir", f"{run.path} already holds a run", "a new or empty folder"))
        run.path.mkdir(parents=True, exist_ok=True)
        run.write_config(cfg)
        run_status.transition(run, "create")
        return run

    def write_config(self, cfg: config_mod.Config) -> None:
        """Write config.yaml, the user's config (a new run, or a job's resubmission), and sign its fields that act
        beyond the run (code, addresses, ports) as this user's: toolkit.trust."""
        from toolkit.key_files import KeyFileError
        from toolkit import trust

        atomic_write_text(self.config_path, cfg.to_yaml())
        try:
            trust.sign(self.path, cfg)
        except KeyFileError as exc:  # no key to sign with: the run trains; its resume will ask for --trust-run
            print(f"note: {exc}; {self.path} is not signed as yours, so resume asks for {trust.FLAG}", file=sys.stderr)

    def untrusted_fields(self, verb: str | None = None) -> dict:
        """The fields of this run's config that run code, reach the network or open a port, and that this user has
        not vouched for ({} for the user's own run): what `resume` and `export` refuse without --trust-run."""
        from toolkit import trust

        return trust.untrusted(self.path, self.read_config(), verb)

    def read_config(self) -> config_mod.Config:
        """The run's config, validated. A run directory may be a copy from elsewhere: config.yaml must be the
        run's own regular file, never a link that reads a config from anywhere."""
        text = read_regular_file(
            self.config_path, field="config.yaml", error=config_mod.ConfigError, limit=RESOLVED_CONFIG_MAX_BYTES
        )  # a copied run's file of gigabytes is not read
        return config_mod.from_dict(yaml.safe_load(text))

    def read_status(self) -> dict:
        return self._read_json(self.status_path, "status.json")

    def read_lineage(self) -> dict:
        return self._read_json(self.lineage_path, "lineage.json")

    @staticmethod
    def _read_json(path: Path, field: str) -> dict:
        """A JSON object of the run's own (a link is refused, not followed; a file over RUN_JSON_MAX_BYTES is not
        read); {} when the file is not there yet."""
        try:
            text = read_regular_file(path, field=field, error=RefusedValue, limit=RUN_JSON_MAX_BYTES)
        except FileNotFoundError:
            return {}
        try:
            data = loads_json(text)
        except (json.JSONDecodeError, UnicodeDecodeError, PlainDataError) as exc:
            where = f"line {exc.lineno} column {exc.colno}: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else exc
            raise RefusedValue(not_allowed(field, path, "a JSON object", problem=f"is not JSON ({where})")) from None
        if not isinstance(data, dict):
            raise RefusedValue(not_allowed(field, path, "a JSON object", problem=f"holds a JSON {type(data).__name__}"))
        return data

    def write_status(self, **fields) -> dict:
        """Merge ``fields`` into status.json, replacing the file atomically: the file primitive. The run's own
        writers go through toolkit.status, which checks each change of state and serialises the writers;
        calling this directly sets a state unchecked (what a test does to fake a run that died)."""
        if "state" in fields and fields["state"] not in STATES:
            raise RefusedValue(not_allowed("status.state", fields["state"], ", ".join(STATES)))
        status = {**self.read_status(), **fields, "updated": time.time()}
        atomic_write_text(self.status_path, json.dumps(status, indent=1))
        return status

    def read_events(self, offset: int = 0) -> tuple[list[dict], int]:
        """The raw JSON objects appended since byte ``offset``, and the offset to continue from (for tests and
        notebooks that read the file's keys; code reads typed events through toolkit.events)."""
        return events_mod.read_records(self.events_path, offset)

    def append_event(self, event: events_mod.Event) -> events_mod.Event:
        """One event from a process other than rank 0 (see events.append_event)."""
        return events_mod.append_event(self.events_path, event)

    def events(self, kind: str | None = None) -> list[dict]:
        """The raw JSON objects of every event, only ``kind``'s when given (see read_events)."""
        records, _ = self.read_events()
        return [r for r in records if kind is None or r.get("event") == kind]
