"""Real storage servers on loopback for the store and study tests (issue #35):

- `s3_server()`: moto's S3 API server (moto.server.ThreadedMotoServer, the server mode: a real
  HTTP server speaking S3's REST API) on 127.0.0.1, an ephemeral port, with one bucket made;
  clients reach it through the environment it returns (AWS_ENDPOINT_URL, which pyarrow's
  `FileSystem.from_uri` reads, and test credentials), never a mock of a client.
- `postgres_server()`: Debian's PostgreSQL (initdb + postgres) in a new folder of its own,
  listening on a unix socket in that folder only (no TCP port: nothing to race for, nothing
  reachable from elsewhere), as the `postgres` user when the tests run as root (PostgreSQL
  refuses to run as root). Its URL: postgresql://postgres@/<db>?host=<socket folder>.

Both are stopped by the context manager's exit; both wait on events (the server answering),
not on sleeps.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BUCKET = "sweeps"
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class S3:
    endpoint: str
    env: dict[str, str]  # what a client of this server needs in its environment

    def filesystem(self):  # pyarrow.fs.S3FileSystem on this server
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(endpoint_override=self.endpoint, access_key="test",
                                 secret_key="test", region="us-east-1")


@contextlib.contextmanager
def s3_server() -> Iterator[S3]:
    """moto's S3 server on 127.0.0.1 with bucket BUCKET."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test",
               "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true"}
        pafs.S3FileSystem(endpoint_override=endpoint, access_key="test", secret_key="test",
                          region="us-east-1", allow_bucket_creation=True).create_dir(BUCKET)
        yield S3(endpoint, env)
    finally:
        server.stop()


def postgres_bin(name: str) -> str | None:
    """A PostgreSQL program: on PATH, else Debian's /usr/lib/postgresql/<version>/bin."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


@dataclass(frozen=True)
class Postgres:
    socket_dir: Path
    user: str

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@/{database}?host={self.socket_dir}"


def _as_owner(owner: str | None) -> list[str]:
    """The argv prefix that runs a program as `owner` (None: as ourselves)."""
    return [] if owner is None else ["setpriv", f"--reuid={owner}", f"--regid={owner}",
                                     "--init-groups"]


@contextlib.contextmanager
def postgres_server() -> Iterator[Postgres]:
    """A PostgreSQL server with its data and socket in a new folder (mkdtemp, made 0711 so that
    the `postgres` user reaches its own 0700 data and socket folders in it; a folder of the
    test's, 0700 and root's, would stop it), removed at the end."""
    folder = Path(tempfile.mkdtemp(prefix="vst-pg-"))
    try:
        with _postgres_in(folder) as server:
            yield server
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _postgres_in(folder: Path) -> Iterator[Postgres]:
    import psycopg

    initdb, postgres = postgres_bin("initdb"), postgres_bin("postgres")
    if initdb is None or postgres is None:
        raise RuntimeError("PostgreSQL is not installed (make test installs Debian's postgresql)")
    owner = "postgres" if os.geteuid() == 0 else None
    folder.chmod(0o711)
    data, sock = folder / "data", folder / "sock"
    for path in (data, sock):
        path.mkdir(mode=0o700)
        if owner is not None:
            entry = pwd.getpwnam(owner)
            os.chown(path, entry.pw_uid, entry.pw_gid)
    user = owner or pwd.getpwuid(os.geteuid()).pw_name
    subprocess.run([*_as_owner(owner), initdb, "-D", str(data), "-U", user, "-A", "trust",
                    "--no-sync"], check=True, capture_output=True, timeout=START_TIMEOUT_S)
    log = open(folder / "postgres.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([*_as_owner(owner), postgres, "-D", str(data), "-k", str(sock),
                             "-c", "listen_addresses=", "-c", "fsync=off"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = Postgres(sock, user)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                psycopg.connect(server.url()).close()
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("PostgreSQL did not start: "
                                       + (folder / "postgres.log").read_text()[-2000:]) from None
                time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # fast shutdown: clients disconnected (setpriv execs)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        log.close()


def create_database(server: Postgres, name: str) -> str:
    """Make database `name` on `server`; its URL."""
    import psycopg

    conn = psycopg.connect(server.url())
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()
    return server.url(name)
