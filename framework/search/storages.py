"""Where an Optuna study lives, by the kind of location (a registry, as Optuna's own storages):
a path is a journal file (JournalFileBackend, with its open-lock: several processes of one
machine may share it); a database URL (config.search_spec DATABASES) is Optuna's RDBStorage
(SQLAlchemy; `postgresql://` needs psycopg2, installed with the project). Both keep what the
tuner stores (trials, their user attributes, RUNNING trials of a killed driver) alike, which the
contract tests in tests/unit/search/test_storages.py check on each.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from optuna.storages import BaseStorage
from optuna.storages import JournalStorage
from optuna.storages import RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal import JournalFileOpenLock

from framework.base.errors import StoreError


def journal(path: Path) -> BaseStorage:
    """A journal file at `path` (its folder made if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path), lock_obj=JournalFileOpenLock(str(path))))


def database(url: str) -> BaseStorage:
    """Optuna's RDBStorage at `url`; StoreError (one line, the URL and why) when the database
    cannot be reached or its schema made."""
    try:
        return RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy's and the driver's errors alike
        why = " ".join(str(exc).split())[:300]
        raise StoreError(f"search.storage {url}: {why}") from None


# by what the location starts with; a path (no scheme) is a journal file
DATABASE_KINDS: dict[str, Callable[[str], BaseStorage]] = {
    "postgresql": database, "mysql": database, "sqlite": database}


def open_storage(where: Path | str) -> BaseStorage:
    """The study storage at `where`: a journal file path, or a database URL."""
    if isinstance(where, Path):
        return journal(where)
    dialect = where.split("://", 1)[0].split("+", 1)[0]
    if dialect not in DATABASE_KINDS:
        raise StoreError(f"search.storage {where}: not one of {', '.join(DATABASE_KINDS)}")
    return DATABASE_KINDS[dialect](where)


def exists(where: Path | str) -> bool:
    """Whether a study may be stored at `where` (a journal file that exists; a database is
    asked when opened)."""
    return not isinstance(where, Path) or where.is_file()
