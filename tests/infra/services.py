"""Throwaway local services for multi-node tests and benchmarks.

Starts, on 127.0.0.1 with random free ports, the parts a real deployment has:

- a PostgreSQL server (Debian's `postgresql` package) in a fresh `initdb` cluster under a temporary
  directory, with one database per client (`mlflow`, `optuna`) and password authentication over TCP;
- a two-node Ray cluster: `ray start --head` plus a second `ray start --address` process joining it,
  each with `--num-cpus` of its own and a custom resource naming the node (`ks_node_0`, `ks_node_1`),
  so a test can pin work to a node or check which node ran it;
- an `mlflow server` backed by that PostgreSQL, serving artifacts from a local directory.

Every process started here carries the environment variable `KERNELSIGHT_SERVICES_TAG=<uuid>`; the
variable is inherited by everything those processes spawn (Ray workers, uvicorn workers, postgres
backends), so `stop()` can find and end exactly this session's processes even after they were
re-parented, without `ray stop` (which ends every Ray process on the machine, other users' too).
Ray gets its own `--temp-dir`, so the `ray_current_cluster` address file of this cluster is never
picked up by someone else's `ray.init()`.

Running as root (CI), PostgreSQL refuses to start; its processes then run as the `postgres` user
that the Debian package creates.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pwd
import secrets
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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

TAG_ENV = "KERNELSIGHT_SERVICES_TAG"
REPO = Path(__file__).resolve().parents[2]
PG_BIN_CANDIDATES = ("/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin")
LOCALHOST = "127.0.0.1"
RAY_NODE_ENV: Mapping[str, str] = {"RAY_AUTH_MODE": "disabled"}
"""Ray >= 2.5x turns token auth on for `ray start` whenever ~/.ray/auth_token exists (any local
`ray.init()` writes one), and a joining node or driver that decides differently is refused; the
throwaway loopback cluster states its mode explicitly instead of depending on that file."""


class ServiceError(RuntimeError):
    """A service did not start or did not stop; the message carries the tail of its log."""


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the OS picks it)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 right now: the sockets are held until all are
    bound, so the OS cannot hand out one port twice (separate `free_port` calls can, and `ray start`
    refuses a port given to two of its components)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((LOCALHOST, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


_WORKER_PORTS = 201
"""Worker ports per Ray node (`--min-worker-port` .. `--max-worker-port`)."""


def worker_ports_base(num_nodes: int) -> int:
    """First of `num_nodes` adjacent worker-port ranges, below the OS's ephemeral range: the other
    ports (`free_port`) come from that range, and a worker range overlapping one of them makes
    `ray start` refuse ("is trying to use a port number ... used by other components")."""
    try:
        ephemeral_lo = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_lo = 32_768  # the Linux default
    lo, hi = 10_000, max(ephemeral_lo, 12_000) - num_nodes * _WORKER_PORTS
    return lo + secrets.randbelow(max(hi - lo, 1))


def port_is_open(port: int, host: str = LOCALHOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _parent_pids() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parents[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
    return parents


def descendant_pids(roots: Iterable[int], parents: Mapping[int, int] | None = None) -> set[int]:
    """`roots` and every live process below them."""
    parents = _parent_pids() if parents is None else parents
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = [r for r in roots if r in parents]
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, ()))
    return found


def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment carries `KERNELSIGHT_SERVICES_TAG=tag`, and their descendants
    (PostgreSQL overwrites its backends' environ with their process titles), this process excluded."""
    needle = f"{TAG_ENV}={tag}".encode()
    parents = _parent_pids()
    found: list[int] = []
    for pid in parents:
        if pid == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(pid)
    return sorted(descendant_pids(found, parents) - {os.getpid()})


def describe_pid(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmdline = "?"
    return f"{pid}: {cmdline[:160]}"


def find_postgres_bin() -> Path:
    """Directory holding `initdb` and `postgres`: Debian's versioned directory, else PATH."""
    for candidate in PG_BIN_CANDIDATES:
        if (Path(candidate) / "postgres").exists():
            return Path(candidate)
    initdb = shutil.which("initdb")
    if initdb and (Path(initdb).resolve().parent / "postgres").exists():
        return Path(initdb).resolve().parent
    raise ServiceError("PostgreSQL server binaries not found: install Debian's `postgresql` package")


def _log_tail(path: Path, num_chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-num_chars:]
    except OSError:
        return "(no log)"


def _log_contains(path: Path, needle: str) -> bool:
    return needle in _log_tail(path, 1 << 20)


@dataclass(frozen=True, slots=True, kw_only=True)
class PostgresServer:
    host: str
    port: int
    user: str
    password: str
    databases: tuple[str, ...]

    def url(self, database: str, *, driver: str = "postgresql+psycopg2") -> str:
        """SQLAlchemy URL, as MLflow and Optuna's RDBStorage take it.

        The driver is explicit: SQLAlchemy 2.1 maps a bare `postgresql://` to psycopg 3, not psycopg2.
        """
        return f"{driver}://{self.user}:{self.password}@{self.host}:{self.port}/{database}"


@dataclass(frozen=True, slots=True, kw_only=True)
class RayCluster:
    address: str
    """GCS address `127.0.0.1:PORT` for `ray.init(address=...)` and `--ray-address`."""

    temp_dir: Path
    node_resources: tuple[str, ...]
    """Custom resource of each node, head first: a task with `resources={name: 1}` runs on that node."""

    num_cpus_per_node: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class MlflowServer:
    tracking_uri: str
    artifacts_dir: Path
    backend_store_uri: str


@dataclass(slots=True)
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    stop_signal: int = signal.SIGTERM
    signal_group: bool = False
    """Signal the whole process group (the server and its workers at once) rather than the leader."""


@dataclass
class LocalServices:
    """Owns the services it starts; `stop()` (or leaving the `with` block) ends all of them.

    Start what a test needs: `start_postgres()`, `start_ray()`, `start_mlflow(pg)`.
    """

    root: Path | None = None
    tag: str = field(default_factory=lambda: uuid.uuid4().hex)
    pythonpath: str = str(REPO)
    """PYTHONPATH of the Ray nodes, so their workers import this checkout's `sim`/`orchestrator`."""

    _procs: list[_Proc] = field(default_factory=list)
    _own_root: bool = False
    _stopped: bool = False
    force_killed: list[str] = field(default_factory=list)
    """Processes that survived the graceful stop and had to be killed (diagnostics)."""

    def __post_init__(self) -> None:
        if self.root is None:
            # Short path: Ray's unix sockets live under its temp dir (108-byte limit).
            self.root = Path(tempfile.mkdtemp(prefix="kss-", dir="/tmp"))
            self._own_root = True
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)  # the postgres user must traverse it

    def __enter__(self) -> LocalServices:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base(self) -> Path:
        assert self.root is not None
        return self.root

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {**os.environ, TAG_ENV: self.tag, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
        for key in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI"):
            env.pop(key, None)
        env.update(extra or {})
        return env

    def _spawn(self, name: str, argv: Sequence[str], *, env: Mapping[str, str], user: str | None = None,
               stop_signal: int = signal.SIGTERM, signal_group: bool = False) -> _Proc:
        log_path = self.base / f"{name}.log"
        log: IO[bytes]
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=dict(env),
                user=user, start_new_session=True, cwd=self.base,
            )
        proc = _Proc(name, popen, log_path, stop_signal, signal_group)
        self._procs.append(proc)
        return proc

    def _wait(self, proc: _Proc, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            if proc.popen.poll() is not None:
                raise ServiceError(f"{what} exited with {proc.popen.returncode}:\n{_log_tail(proc.log_path)}")
            time.sleep(0.2)
        raise ServiceError(f"{what} not ready after {timeout_s:.0f} s:\n{_log_tail(proc.log_path)}")

    # PostgreSQL ---------------------------------------------------------------------------------------

    def start_postgres(self, databases: Sequence[str] = ("mlflow", "optuna"), *, durable: bool = False,
                       max_connections: int = 200, timeout_s: float = 60.0) -> PostgresServer:
        """initdb a fresh cluster, start `postgres` on a random port, create `databases`.

        `durable=False` turns fsync off (tests); benchmarks pass `durable=True` to measure with the
        server's default crash-safe settings.
        """
        bindir = find_postgres_bin()
        pg_dir = self.base / "pg"
        pg_dir.mkdir()
        run_as: str | None = None
        if os.geteuid() == 0:
            run_as = "postgres"
            try:
                entry = pwd.getpwnam(run_as)
            except KeyError:
                raise ServiceError("running as root needs the `postgres` user (Debian's postgresql package)") from None
            os.chown(pg_dir, entry.pw_uid, entry.pw_gid)
        user, password = "kernelsight", secrets.token_hex(12)
        pwfile = pg_dir / "pwfile"
        pwfile.write_text(password + "\n")
        if run_as is not None:
            os.chown(pwfile, pwd.getpwnam(run_as).pw_uid, -1)
        os.chmod(pwfile, 0o600)
        data_dir = pg_dir / "data"
        init = subprocess.run(
            [str(bindir / "initdb"), "-D", str(data_dir), "-U", user, f"--pwfile={pwfile}",
             "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync"],
            user=run_as, capture_output=True, text=True, env=self.env(), cwd=pg_dir, check=False,
        )
        if init.returncode != 0:
            raise ServiceError(f"initdb failed ({init.returncode}):\n{init.stdout[-2000:]}\n{init.stderr[-2000:]}")
        port = free_port()
        settings = [f"max_connections={max_connections}", "shared_buffers=128MB", "listen_addresses=127.0.0.1"]
        if not durable:
            settings += ["fsync=off", "synchronous_commit=off", "full_page_writes=off"]
        argv = [str(bindir / "postgres"), "-D", str(data_dir), "-p", str(port), "-k", str(pg_dir)]
        for setting in settings:
            argv += ["-c", setting]
        # SIGINT is PostgreSQL's "fast" shutdown: it disconnects clients instead of waiting for them.
        proc = self._spawn("postgres", argv, env=self.env(), user=run_as, stop_signal=signal.SIGINT)
        server = PostgresServer(host=LOCALHOST, port=port, user=user, password=password, databases=tuple(databases))

        def ready() -> bool:
            try:
                conn = _pg_connect(server, "postgres")
            except Exception:
                return False
            conn.close()
            return True

        self._wait(proc, ready, timeout_s, "postgres")
        conn = _pg_connect(server, "postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                for name in databases:
                    cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return server

    # Ray ----------------------------------------------------------------------------------------------

    def start_ray(self, num_cpus_per_node: Sequence[int] = (1, 1), *, object_store_bytes: int = 256 << 20,
                  include_dashboard: bool = False, timeout_s: float = 180.0) -> RayCluster:
        """A Ray head on 127.0.0.1 and `len(num_cpus_per_node) - 1` more node processes joining it.

        Every port is chosen here (none of Ray's fixed defaults such as 6379, 10001, 52365), so several
        clusters coexist on one machine. Node i carries the custom resource `ks_node_i` = 1.
        """
        temp_dir = self.base / "ray"
        temp_dir.mkdir()
        gcs_port = free_port()
        address = f"{LOCALHOST}:{gcs_port}"
        env = self.env({"PYTHONPATH": _join_path(self.pythonpath, os.environ.get("PYTHONPATH", "")), **RAY_NODE_ENV})
        resources: list[str] = []
        workers_base = worker_ports_base(len(num_cpus_per_node))
        # Every component port of every node, distinct (and distinct from the GCS port).
        ports = iter([p for p in free_ports(8 * len(num_cpus_per_node) + 1) if p != gcs_port])
        for index, num_cpus in enumerate(num_cpus_per_node):
            resource = f"ks_node_{index}"
            resources.append(resource)
            worker_lo = workers_base + index * _WORKER_PORTS
            argv = [
                _ray_cli(), "start", "--block", "--node-ip-address", LOCALHOST, "--temp-dir", str(temp_dir),
                "--num-cpus", str(num_cpus), "--num-gpus", "0", "--resources", json.dumps({resource: 1}),
                "--object-store-memory", str(object_store_bytes), "--disable-usage-stats",
                "--node-manager-port", str(next(ports)), "--object-manager-port", str(next(ports)),
                "--dashboard-agent-listen-port", str(next(ports)), "--dashboard-agent-grpc-port", str(next(ports)),
                "--runtime-env-agent-port", str(next(ports)), "--metrics-export-port", str(next(ports)),
                "--min-worker-port", str(worker_lo), "--max-worker-port", str(worker_lo + 200),
                "--log-style", "record", "--log-color", "false",
            ]
            if index == 0:
                argv += ["--head", "--port", str(gcs_port), "--ray-client-server-port", str(next(ports)),
                         "--include-dashboard", "true" if include_dashboard else "false"]
                if include_dashboard:
                    argv += ["--dashboard-host", LOCALHOST, "--dashboard-port", str(next(ports))]
            else:
                argv += ["--address", address]
            proc = self._spawn(f"ray-node-{index}", argv, env=env)
            self._wait(proc, functools.partial(_log_contains, proc.log_path, "Ray runtime started"),
                       timeout_s, f"ray node {index}")
        cluster = RayCluster(address=address, temp_dir=temp_dir, node_resources=tuple(resources),
                             num_cpus_per_node=tuple(num_cpus_per_node))
        self._wait_ray_nodes(cluster, timeout_s)
        return cluster

    def driver_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a driver subprocess (e.g. `python -m orchestrator.cli sweep --ray-address ...`):
        this checkout on PYTHONPATH, no inherited RAY_ADDRESS / MLFLOW_TRACKING_URI."""
        return self.env({"PYTHONPATH": _join_path(self.pythonpath, os.environ.get("PYTHONPATH", "")),
                         **(extra or {})})

    def actor_nodes(self, cluster: RayCluster, class_name: str) -> dict[str, int]:
        """Node id -> number of actors of `class_name` the cluster ever placed there, dead ones included
        (the GCS keeps them), so a test can check after a sweep's driver exited where its actors ran."""
        script = (
            "import json, sys, ray\n"
            "from ray._private import state\n"
            "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
            "counts = {}\n"
            "for actor in state.actors().values():\n"
            "    if actor['ActorClassName'].rsplit('.', 1)[-1] == sys.argv[2] and actor.get('Address'):\n"
            "        node = actor['Address']['NodeID']\n"
            "        if node.strip('f'):  # all-f is the nil id of an actor never placed (creation cancelled)\n"
            "            counts[node] = counts.get(node, 0) + 1\n"
            "print(json.dumps(counts))\n"
        )
        out = subprocess.run([sys.executable, "-c", script, cluster.address, class_name], capture_output=True,
                             text=True, env=self.driver_env(), timeout=120, check=False)
        if out.returncode != 0:
            raise ServiceError(f"listing actors failed: {out.stderr[-2000:]}")
        counts: dict[str, int] = json.loads(out.stdout.strip().splitlines()[-1])
        return counts

    def node_ids(self, cluster: RayCluster) -> dict[str, str]:
        """Custom resource (`ks_node_i`) -> node id of every alive node."""
        script = (
            "import json, sys, ray\n"
            "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
            "print(json.dumps({r: n['NodeID'] for n in ray.nodes() if n['Alive'] for r in n['Resources']"
            " if r.startswith('ks_node_')}))\n"
        )
        out = subprocess.run([sys.executable, "-c", script, cluster.address], capture_output=True, text=True,
                             env=self.driver_env(), timeout=120, check=False)
        if out.returncode != 0:
            raise ServiceError(f"listing nodes failed: {out.stderr[-2000:]}")
        ids: dict[str, str] = json.loads(out.stdout.strip().splitlines()[-1])
        return ids

    def _wait_ray_nodes(self, cluster: RayCluster, timeout_s: float) -> None:
        """Block until the GCS lists every node alive (asked from a child process: no driver here)."""
        script = (
            "import ray,sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
            "print(sum(1 for n in ray.nodes() if n['Alive']))"
        )
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            out = subprocess.run([sys.executable, "-c", script, cluster.address], capture_output=True, text=True,
                                 env=self.env(), timeout=timeout_s, check=False)
            last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:]
            if out.returncode == 0 and last == str(len(cluster.node_resources)):
                return
            time.sleep(0.5)
        raise ServiceError(f"ray cluster at {cluster.address}: nodes not all alive ({last})")

    # MLflow -------------------------------------------------------------------------------------------

    def start_mlflow(self, pg: PostgresServer, *, database: str = "mlflow", workers: int = 1,
                     timeout_s: float = 180.0) -> MlflowServer:
        """`mlflow server` on a random port, PostgreSQL backend store, proxied artifacts in a local dir."""
        port = free_port()
        artifacts = self.base / "mlflow-artifacts"
        artifacts.mkdir()
        backend = pg.url(database)
        argv = [
            _mlflow_cli(), "server", "--host", LOCALHOST, "--port", str(port), "--workers", str(workers),
            "--serve-artifacts", "--artifacts-destination", artifacts.as_uri(),
        ]
        # The server's own SIGTERM path waits for its uvicorn workers one after another (~8 s).
        # MLFLOW_SERVER_ENABLE_JOB_EXECUTION: MLflow 3 otherwise starts a job runner with ~7 huey consumer
        # processes (GenAI evaluation jobs) that experiment tracking never uses.
        # The backend URL carries the database password: it goes in the environment (which `mlflow server`
        # reads as MLFLOW_BACKEND_STORE_URI), never in argv, which every local user can read in `ps`.
        env = self.env({"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_BACKEND_STORE_URI": backend})
        proc = self._spawn("mlflow", argv, env=env, signal_group=True)
        uri = f"http://{LOCALHOST}:{port}"
        self._wait(proc, lambda: _http_ok(f"{uri}/health"), timeout_s, "mlflow server")
        return MlflowServer(tracking_uri=uri, artifacts_dir=artifacts, backend_store_uri=backend)

    def service_pids(self) -> dict[str, set[int]]:
        """Live processes of each started service (`postgres`, `ray-node-0`, ..., `mlflow`), descendants included."""
        parents = _parent_pids()
        return {proc.name: descendant_pids([proc.popen.pid], parents) for proc in self._procs
                if proc.popen.poll() is None}

    # Stop ---------------------------------------------------------------------------------------------

    def stop(self, timeout_s: float = 30.0) -> list[str]:
        """End every process this object started (newest first), then anything still carrying the tag.

        Returns what had to be killed by the tag sweep; afterwards no process with the tag is alive.
        """
        if self._stopped:
            return self.force_killed
        self._stopped = True
        for proc in reversed(self._procs):
            _stop_proc(proc, timeout_s)
        deadline = time.monotonic() + timeout_s
        while (left := tagged_pids(self.tag)) and time.monotonic() < deadline:
            if time.monotonic() > deadline - timeout_s / 2:  # graceful shutdowns get the first half
                for pid in left:
                    self.force_killed.append(describe_pid(pid))
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        if left := tagged_pids(self.tag):
            raise ServiceError("still running after stop: " + "; ".join(describe_pid(p) for p in left))
        if self._own_root:
            shutil.rmtree(self.base, ignore_errors=True)
        return self.force_killed


def _stop_proc(proc: _Proc, timeout_s: float) -> None:
    if proc.popen.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        if proc.signal_group:
            os.killpg(proc.popen.pid, proc.stop_signal)
        else:
            proc.popen.send_signal(proc.stop_signal)
    try:
        proc.popen.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait(timeout_s)


def _pg_connect(server: PostgresServer, database: str) -> Any:
    import psycopg2  # type: ignore[import-untyped]

    return psycopg2.connect(host=server.host, port=server.port, user=server.user, password=server.password,
                            dbname=database, connect_timeout=2)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _ray_cli() -> str:
    return str(Path(sys.executable).parent / "ray") if (Path(sys.executable).parent / "ray").exists() else "ray"


def _mlflow_cli() -> str:
    return str(Path(sys.executable).parent / "mlflow") if (Path(sys.executable).parent / "mlflow").exists() else "mlflow"


def _join_path(*parts: str) -> str:
    return os.pathsep.join(p for p in parts if p)


def current_node_id() -> str:
    """The Ray node this code runs on; call it inside a task or actor (module-level so Ray workers can
    import it by reference: functions defined in test modules are not importable on the nodes)."""
    import ray

    return str(ray.get_runtime_context().get_node_id())


class NodeProbe:
    """Wrap with `ray.remote(num_cpus=1)(NodeProbe)`: an actor that reports the node it was placed on."""

    def node_id(self) -> str:
        return current_node_id()


@dataclass(frozen=True, slots=True)
class LocalStack:
    services: LocalServices
    postgres: PostgresServer
    ray: RayCluster
    mlflow: MlflowServer


@contextlib.contextmanager
def local_stack(*, ray_cpus: Sequence[int] = (1, 1), mlflow_workers: int = 1,
                durable_postgres: bool = False) -> Iterator[LocalStack]:
    """PostgreSQL (databases `mlflow`, `optuna`), a Ray head plus joined nodes (`ray_cpus` CPUs each), an
    MLflow server on that PostgreSQL; all on 127.0.0.1 with random ports, stopped on exit (and checked)."""
    with LocalServices() as services:
        postgres = services.start_postgres(durable=durable_postgres)
        cluster = services.start_ray(ray_cpus)
        mlflow_server = services.start_mlflow(postgres, workers=mlflow_workers)
        yield LocalStack(services, postgres, cluster, mlflow_server)
