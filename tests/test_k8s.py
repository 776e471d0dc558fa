"""deploy/k8s proven offline: every resource validates against the Kubernetes schemas
(kubernetes-validate --strict, schemas bundled), and the pieces agree with each other and with
the node: labels and selectors, ports, serviceName and pod DNS names in --peers, volumes behind
--data-dir and --secret-file, probes on routes the node serves, and the container's args parse
with the node's own CLI for every pod of the StatefulSet."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from cluster.cli import config_from_args
from cluster.core.config import NodeConfig
from cluster.core.metrics import NodeMetrics
from cluster.edge import http_api

yaml = pytest.importorskip("yaml", reason="pyyaml parses the manifests")

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
VALIDATOR = Path(sys.executable).with_name("kubernetes-validate")
# the oldest Kubernetes the manifests claim to work with (docs/containers.md), and the newest
# the validator bundles
KUBE_VERSIONS = ("1.29.0", None)


def kustomization() -> dict[str, Any]:
    return cast(dict[str, Any], yaml.safe_load((K8S / "kustomization.yaml").read_text()))


def resources() -> dict[str, dict[str, Any]]:
    """``Kind/name`` -> resource, for every file the kustomization lists."""
    out = {}
    for name in kustomization()["resources"]:
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [r for r in resources().values() if r["kind"] == kind]


def statefulset() -> dict[str, Any]:
    (sts,) = by_kind("StatefulSet")
    return sts


def container(sts: dict[str, Any]) -> dict[str, Any]:
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    return cast(dict[str, Any], c)


def generated_secret() -> dict[str, Any]:
    """The Secret that kustomize's secretGenerator makes (a dummy value in place of the file)."""
    (gen,) = kustomization()["secretGenerator"]
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": gen["name"]},
            "type": "Opaque", "data": {Path(f).name: "ZHVtbXktc2VjcmV0LWZvci10aGUtdGVzdA=="
                                       for f in gen["files"]}}


def pod_argv(sts: dict[str, Any], ordinal: int) -> list[str]:
    """The container's command + args as the kubelet runs them in pod ``ordinal``: $(VAR) taken
    from the container's env (only the pod's own name may be used, from the downward API)."""
    c = container(sts)
    env = {}
    for e in c.get("env", []):
        assert e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", e
        env[e["name"]] = f"{sts['metadata']['name']}-{ordinal}"

    def expand(arg: str) -> str:
        return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)

    return [expand(a) for a in [*c["command"], *c.get("args", [])]]


def test_every_manifest_is_listed_and_validates_strictly(tmp_path: Path) -> None:
    listed = set(kustomization()["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk, "every manifest in the kustomization, and nothing else"
    secret = tmp_path / "secret.yaml"
    secret.write_text(yaml.safe_dump(generated_secret()))
    files = [str(K8S / name) for name in sorted(listed)] + [str(secret)]
    assert VALIDATOR.exists(), "kubernetes-validate (the test extras) is not installed"
    for version in KUBE_VERSIONS:
        flags = ["--strict"] + (["-k", version] if version else [])
        r = subprocess.run([str(VALIDATOR), *flags, *files], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        passed = [ln for ln in r.stdout.splitlines() if ln.startswith("INFO") and " passed " in ln]
        assert len(passed) == len(files), f"every file checked against a schema:\n{r.stdout}"
    # the validator is strict: an unknown field fails
    bad = tmp_path / "bad.yaml"
    sts = statefulset()
    sts["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    bad.write_text(yaml.safe_dump(sts))
    r = subprocess.run([str(VALIDATOR), "--strict", str(bad)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "readinesProbe" in r.stdout + r.stderr


def test_labels_selectors_and_services_agree() -> None:
    sts = statefulset()
    match = sts["spec"]["selector"]["matchLabels"]
    assert match and match.items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    services = {s["metadata"]["name"]: s for s in by_kind("Service")}
    assert len(services) == 2
    headless = services[sts["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True, (
        "peers must resolve before a pod is ready: a node settles with them first")
    (client,) = [s for n, s in services.items() if n != sts["spec"]["serviceName"]]
    assert client["spec"].get("clusterIP") != "None"
    assert not client["spec"].get("publishNotReadyAddresses"), "clients only to ready pods"
    for svc in services.values():
        assert svc["spec"]["selector"] == match, svc["metadata"]["name"]
    (pdb,) = by_kind("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == match
    assert pdb["spec"]["maxUnavailable"] == 1
    anti = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    terms = [t.get("podAffinityTerm", t) for key in anti for t in anti[key]]
    assert terms and all(t["labelSelector"]["matchLabels"] == match for t in terms)
    assert all(t["topologyKey"] == "kubernetes.io/hostname" for t in terms)
    assert sts["spec"]["podManagementPolicy"] == "Parallel"


def test_ports_probes_and_drain() -> None:
    sts = statefulset()
    c = container(sts)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert list(ports) == ["api"]
    for svc in by_kind("Service"):
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports or p["targetPort"] in ports.values(), svc
            assert p["port"] == ports["api"], svc
    probes = {k: c[k]["httpGet"] for k in ("readinessProbe", "livenessProbe", "startupProbe")}
    assert probes["readinessProbe"]["path"] == "/v1/ready", "ready = settled and serving"
    assert probes["livenessProbe"]["path"] == "/v1/health", "alive while recovering too"
    for probe in probes.values():
        assert probe["port"] in ports
    served = _routes()
    assert {("GET", p["path"]) for p in probes.values()} <= served
    assert c["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > int(c["lifecycle"]["preStop"]["exec"]["command"][1]) + 5, "drain fits"


def test_container_args_parse_with_the_node_cli_in_every_pod() -> None:
    sts = statefulset()
    name, replicas = sts["metadata"]["name"], sts["spec"]["replicas"]
    c = container(sts)
    port = c["ports"][0]["containerPort"]
    spec = sts["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    claims = {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
    secrets = {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}
    (gen,) = kustomization()["secretGenerator"]
    pod_names = [f"{name}-{i}" for i in range(replicas)]
    for ordinal, pod in enumerate(pod_names):
        argv = pod_argv(sts, ordinal)
        assert argv[:3] == ["python", "-m", "cluster.node"], argv
        config, _ = config_from_args(argv[3:])  # the node's own parser and validation
        assert config.node_id == pod, "the node id is the pod's name"
        assert config.listen == ("0.0.0.0", port)
        assert [p[0] for p in config.peers] == pod_names, "--peers lists exactly the pods"
        for pid, host, pport in config.peers:
            assert (host, pport) == (f"{pid}.{sts['spec']['serviceName']}", port), (
                "a peer is its pod's DNS name under the headless Service")
        assert config.rf == 3 <= replicas
        assert mounts[config.data_dir] in claims, "--data-dir on the pod's volume claim"
        assert config.secret_file is not None
        secret_dir, secret_key = config.secret_file.rsplit("/", 1)
        volume = secrets[mounts[secret_dir]]
        assert volume["secretName"] == gen["name"], "the Secret kustomize generates"
        assert secret_key in {Path(f).name for f in gen["files"]}


def test_pod_runs_as_the_images_user_on_a_read_only_root() -> None:
    spec = statefulset()["spec"]["template"]["spec"]
    sc = spec["securityContext"]
    user = re.findall(r"(?m)^USER\s+(\S+)", (ROOT / "compose" / "Dockerfile").read_text())[-1]
    assert f"{sc['runAsUser']}:{sc['runAsGroup']}" == user
    assert sc["runAsNonRoot"] is True and sc["fsGroup"] == sc["runAsGroup"]
    c = container(statefulset())
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
    assert {"/data", "/tmp"} <= writable


def test_the_secret_file_is_never_committed() -> None:
    (gen,) = kustomization()["secretGenerator"]
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    for f in gen["files"]:
        rel = (K8S / f).relative_to(ROOT).as_posix()
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", rel], cwd=ROOT,
                                 capture_output=True, timeout=30)
        if ignored.returncode == 128:
            pytest.skip("not a git checkout")
        assert ignored.returncode == 0, f"{rel} must be in .gitignore"
    assert kustomization()["generatorOptions"]["disableNameSuffixHash"] is True, (
        "a hashed name would roll a new secret out pod by pod: old and new refuse each other")


def _routes() -> set[tuple[str, str]]:
    config = NodeConfig(node_id="n1", listen=("127.0.0.1", 0), peers=(("n1", "127.0.0.1", 0),),
                        data_dir="unused")
    app = http_api.make_app(cast(Any, SimpleNamespace(config=config)))
    return {(r.method, r.resource.canonical) for r in app.router.routes()
            if r.resource is not None}


@pytest.mark.timeout(30)
async def test_ready_route_is_503_until_the_node_is_ready_then_200() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    config = NodeConfig(node_id="n1", listen=("127.0.0.1", 0), peers=(("n1", "127.0.0.1", 0),),
                        data_dir="unused")
    node = SimpleNamespace(id="n1", config=config, ready=False, metrics=NodeMetrics())
    edge = http_api.Edge(None, None, frozenset({"t0ken-" + "a" * 26}))  # tokens on: still open
    async with TestClient(TestServer(http_api.make_app(cast(Any, node), edge))) as client:
        resp = await client.get("/v1/ready")
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "not_ready"
        node.ready = True
        resp = await client.get("/v1/ready")
        assert resp.status == 200 and await resp.json() == {"node": "n1", "ready": True}


def test_a_new_image_reaches_no_pod_until_the_partition_is_lowered() -> None:
    """Rolling upgrades are staged by hand (docs/operations.md): the partition starts at the
    replica count, so a changed image waits until the operator lowers it pod by pod."""
    sts = statefulset()
    strategy = sts["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["partition"] == sts["spec"]["replicas"]
