"""A plan written so that a failure part-way leaves the environment as it was.

The order keeps even a run that is killed (nothing can roll that back) revertible: the originals are backed up
first, then a record naming every file about to change, then the files, then the final record; backups no
record names are removed last. An exception before the end (a full disk, a failed check, ^C) puts back every
file written, the record and the backups as they were, and is raised again.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rig.core import RigError, progress
from rig.core.documents import dump_json
from rig.core.fs import atomic_write, read_bytes
from rig.patches.env import Env
from rig.patches.plan import Change, Plan


def commit(env: Env, plan: Plan, written: Callable[[], None] = lambda: None) -> None:
    """Write PLAN; WRITTEN runs once the files are (a check of them: what it raises undoes the whole)."""
    if plan.idle:
        return
    undo = _Undo(env, plan.backups)
    try:
        for digest, data in plan.keep.items():
            undo.back_up(digest, data)
        _write_record(env, plan.interim)
        for change in plan.changes:
            undo.write(change)
        written()
        _write_record(env, plan.state)
    except BaseException as exc:
        undo.roll_back(exc)
        raise
    _remove_unnamed(plan)


def _write_record(env: Env, state: dict) -> None:
    if state["files"]:
        atomic_write(env.state_path, dump_json(state, str(env.state_path), indent=2, sort_keys=True) + "\n")
    else:
        env.state_path.unlink(missing_ok=True)


class _Undo:
    """What a commit wrote so far, to put back."""

    def __init__(self, env: Env, backups: Path | None):
        self.env, self.backups = env, backups
        self.record = read_bytes(env.state_path, "patch record") if env.state_path.exists() else None
        self.files: list[Change] = []
        self.new_backups: list[Path] = []
        self.made_backups = False

    def back_up(self, digest: str, data: bytes) -> None:
        assert self.backups is not None, "a plan that keeps originals names where"
        if not self.backups.is_dir():
            if self.backups.exists():
                raise RigError(f"the patch backups {self.backups} are not a directory; remove it")
            self.backups.mkdir()
            self.made_backups = True
        path = self.backups / digest
        if not path.exists():
            self.new_backups.append(path)
        atomic_write(path, data)

    def write(self, change: Change) -> None:
        self.files.append(change)  # first: a write cut short is put back too (to the same bytes, at worst)
        atomic_write(change.path, change.after)

    def roll_back(self, exc: BaseException) -> None:
        """Every file back as it was, then the record and the backups; where a file cannot be put back, the record
        and the backups stay, so that `rig patch revert --force` can restore the originals."""
        failed = []
        for change in reversed(self.files):
            try:
                if change.before is None:
                    change.path.unlink(missing_ok=True)
                else:
                    atomic_write(change.path, change.before)
            except OSError as err:
                failed.append(f"{change.path} ({err.strerror or err})")
        if failed:
            raise RigError(f"{exc}; then putting back failed for {', '.join(failed)}: the record {self.env.state_path} "
                           "and the backups are kept; run `rig patch revert --force` once the cause is fixed") from exc
        try:
            if self.record is None:
                self.env.state_path.unlink(missing_ok=True)
            else:
                atomic_write(self.env.state_path, self.record)
            for path in self.new_backups:
                path.unlink(missing_ok=True)
            if self.made_backups and self.backups is not None:
                self.backups.rmdir()
        except OSError as err:
            raise RigError(f"{exc}; every file is put back, but not the record or the backups "
                           f"({err.strerror or err}): remove {self.env.state_path} and {self.backups} by hand, or "
                           "run `rig patch revert`") from exc


def _remove_unnamed(plan: Plan) -> None:
    """The backups no record names any longer, and their directory once empty. The change is done: a backup
    left behind is only said."""
    if plan.backups is None:
        return
    try:
        for digest in plan.drop:
            (plan.backups / digest).unlink(missing_ok=True)
        if plan.backups.is_dir() and not any(plan.backups.iterdir()):
            plan.backups.rmdir()
    except OSError as err:
        progress(f"could not remove an unused patch backup in {plan.backups} ({err.strerror or err}); "
                 "it is no longer needed")
