"""``--kvspec-example-db``: the Hypothesis example database a campaign shares.

A ``thorough`` campaign split over several machines (one implementation or
mutant per machine, or the same one with different seeds) should reuse every
failure any of them found: Hypothesis replays the examples saved in its
database before it generates new ones, so a machine that starts later tries
the shrunk failures of the others first. Two kinds of shared database:

- a directory (``--kvspec-example-db /shared/kvspec-db``): Hypothesis's
  ``DirectoryBasedExampleDatabase``, one file per example, safe for several
  processes and machines writing at once (a network file system will do);
- Redis (``--kvspec-example-db redis://host:6379/0``): Hypothesis's own
  ``hypothesis.extra.redis.RedisExampleDatabase`` (needs the ``redis``
  package: ``pip install 'kvspec[redis]'``), under the key prefix
  ``kvspec-example:``.

Without the option a random effort uses the working dir's
``hypothesis/examples`` (``workdir.py``), local to the machine.

Only the random efforts use a database. ``default`` and ``ci`` are
derandomised and keep none by design (issue 17: their verdict must be the
same on every machine and every run, and a stored example would make it
depend on history), so naming a database with them is a usage error rather
than something silently ignored. ``smoke`` keeps none unless one is named.
With ``--hypothesis-seed`` Hypothesis neither reads nor writes any example
database (its ``run_engine`` drops the database key of a test run under a
forced seed), so a seeded run is reproducible from the seed alone and a named
database is not used; the header says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from kvspec.conformance.run.settings import is_deterministic, keeps_database
from kvspec.conformance.run.workdir import example_db_dir

#: the Redis key prefix of kvspec's examples (other projects may share the server)
REDIS_PREFIX = b"kvspec-example:"
#: seconds to wait for a Redis server at start-up before giving up with a message
REDIS_TIMEOUT_S = 5.0

_DB_KEY = pytest.StashKey[ExampleDatabase | None]()


def add_options(group: pytest.OptionGroup) -> None:
    group.addoption(
        "--kvspec-example-db",
        action="store",
        default=None,
        metavar="DIR|redis://HOST:PORT/DB",
        help="Hypothesis example database shared by a campaign (a directory, or Redis); "
        "random efforts (thorough, smoke) only: default and ci are derandomised and keep none",
    )


def open_database(spec: str) -> ExampleDatabase:
    """The database ``spec`` names; a ``pytest.UsageError`` says what is wrong
    (Redis not installed, server not answering) within ``REDIS_TIMEOUT_S``."""
    if spec.startswith(("redis://", "rediss://", "unix://")):
        return _open_redis(spec)
    if "://" in spec:
        raise pytest.UsageError(
            f"--kvspec-example-db={spec}: not a directory or a redis:// URL (the two kinds of shared database)"
        )
    path = Path(spec).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise pytest.UsageError(f"--kvspec-example-db={spec}: cannot create the directory: {e}") from None
    return DirectoryBasedExampleDatabase(str(path.resolve()))


def _open_redis(url: str) -> ExampleDatabase:
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:
        raise pytest.UsageError(
            f"--kvspec-example-db={url}: the redis package is not installed; pip install 'kvspec[redis]'"
        ) from None
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S)
        client.ping()
    except (redis.RedisError, ValueError, OSError) as e:
        raise pytest.UsageError(f"--kvspec-example-db={url}: Redis does not answer: {e}") from None
    return RedisExampleDatabase(client, key_prefix=REDIS_PREFIX)


def check_option(config: pytest.Config, effort: str) -> None:
    """At configure time: a named database with a derandomised effort is a
    usage error; a named database must open (fail the run now, not in every test)."""
    spec = config.getoption("--kvspec-example-db", None)
    if not spec:
        return
    if is_deterministic(effort):  # derandomised whatever the seed
        raise pytest.UsageError(
            f"--kvspec-example-db: the {effort} effort is derandomised and keeps no example database "
            "(its verdict must not depend on stored examples); use it with --hypothesis-profile=thorough"
        )
    config.stash[_DB_KEY] = open_database(str(spec))


def database_for(config: pytest.Config, effort: str, *, seeded: bool) -> ExampleDatabase | None:
    """The example database of this session's effort: the named one, else the
    working dir's for a random unseeded effort, else none."""
    if is_deterministic(effort):
        return None
    if config.getoption("--kvspec-example-db", None):
        db = config.stash.get(_DB_KEY, None)
        if db is None:
            db = open_database(str(config.getoption("--kvspec-example-db")))
            config.stash[_DB_KEY] = db
        return db
    if keeps_database(effort, seeded=seeded):
        return DirectoryBasedExampleDatabase(str(example_db_dir(config)))
    return None


def describe(config: pytest.Config, effort: str, *, seeded: bool) -> str | None:
    """One header line naming the database in use (None: no database)."""
    if is_deterministic(effort):
        return None
    spec = config.getoption("--kvspec-example-db", None)
    if spec and seeded:
        return f"kvspec example database: {spec} NOT USED: Hypothesis keeps no database under --hypothesis-seed"
    if spec:
        return f"kvspec example database: {spec} (shared; its examples replay first)"
    if keeps_database(effort, seeded=seeded):
        return f"kvspec example database: {example_db_dir(config)}"
    return None
