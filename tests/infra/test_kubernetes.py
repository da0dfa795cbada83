"""infra/kubernetes/: the manifests a user applies, checked without a cluster.

Each document is validated against the Kubernetes API's schemas by ``kubernetes-validate``
(offline: the wheel ships them), pinned to ``KUBERNETES_VERSION``, in strict mode (an unknown
field is an error). Then what a schema cannot see: the names are lakefold's (settings, CLI
commands and options), every reference lands (Secret and ConfigMap keys, Services, volumes,
the image), no secret is written outside a Secret, and the captures and the driver run one pod
each. Every check is a function that lists problems; each test runs it on the real manifests
(no problem) and on a copy broken on purpose (the problem is found), so no check passes by
looking at nothing.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml
from pydantic import SecretStr
from typer.exceptions import TyperException

from lakefold.cli import command
from lakefold.settings import ENV_PREFIX, Settings, known_variables

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "infra" / "kubernetes"
#: The Kubernetes version the manifests are validated against (kubernetes-validate ships the
#: schemas of 1.25 to 1.37): the oldest minor release still maintained upstream.
KUBERNETES_VERSION = "1.34.0"
#: Variables the manifests set that are not lakefold's: the pod's address (downward API), Spark's
#: own (the address it binds, no daemon), and where the driver JVM's class archive is kept.
OTHER_VARIABLES = frozenset({"POD_IP", "SPARK_LOCAL_IP", "SPARK_NO_DAEMONIZE", "XDG_CACHE_HOME"})
#: The Spark daemons `spark-class` may start (as tests/spark/test_cluster.py does).
SPARK_CLASSES = frozenset({"org.apache.spark.deploy.master.Master",
                           "org.apache.spark.deploy.worker.Worker"})
#: A name that says its value is a secret.
SECRETISH = re.compile(r"PASSWORD|DSN|SECRET|KEY|TOKEN", re.IGNORECASE)
#: Command-line options whose value is a secret (a DSN, a token): never in a manifest.
SECRET_OPTIONS = ("--dsn", "--store-dsn", "--token")
#: The mark of a placeholder in the Secret templates.
PLACEHOLDER = "CHANGE-ME"
#: Components whose pods must run one at a time: a slot has one consumer; one driver per store.
SINGLE_POD_COMPONENTS = frozenset({"capture", "driver"})
_VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")

Document = dict[str, Any]
Check = Callable[[list[Document]], list[str]]


def _kustomization() -> Document:
    return dict(yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text()))


def load_manifests() -> list[Document]:
    """Every document of the files kustomization.yaml lists, in its order."""
    documents = []
    for name in _kustomization()["resources"]:
        documents += [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]
    return documents


def _of_kind(documents: list[Document], kind: str) -> Iterator[Document]:
    return (d for d in documents if d.get("kind") == kind)


def _name(document: Document) -> str:
    return f"{document['kind']}/{document['metadata']['name']}"


def _pods(documents: list[Document]) -> Iterator[tuple[str, Document]]:
    """(Deployment name, pod spec) of every Deployment."""
    for d in _of_kind(documents, "Deployment"):
        yield _name(d), d["spec"]["template"]["spec"]


def _containers(documents: list[Document]) -> Iterator[tuple[str, Document]]:
    for where, pod in _pods(documents):
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            yield f"{where} container {c['name']}", c


def _data_keys(document: Document) -> set[str]:
    return {*(document.get("data") or {}), *(document.get("stringData") or {})}


def _defined(documents: list[Document], kind: str) -> dict[str, set[str]]:
    return {d["metadata"]["name"]: _data_keys(d) for d in _of_kind(documents, kind)}


def _env_names(documents: list[Document], container: Document) -> list[str]:
    """The variables a container gets: its env names and the keys of what envFrom names."""
    names = [e["name"] for e in container.get("env", [])]
    sources = {"configMapRef": _defined(documents, "ConfigMap"),
               "secretRef": _defined(documents, "Secret")}
    for source in container.get("envFrom", []):
        for kind, defined in sources.items():
            if kind in source:
                names += sorted(defined.get(source[kind]["name"], set()))
    return names


def _literal_settings(documents: list[Document]) -> Iterator[tuple[str, str, str]]:
    """(where, variable, value) of every LAKEFOLD_* value written in a ConfigMap or an env."""
    for d in _of_kind(documents, "ConfigMap"):
        for key, value in (d.get("data") or {}).items():
            yield _name(d), key, str(value)
    for where, c in _containers(documents):
        for e in c.get("env", []):
            if "value" in e:
                yield where, e["name"], str(e["value"])


# ------------------------------------------------------------------ the checks

def schema_problems(documents: list[Document]) -> list[str]:
    """Documents the Kubernetes API's schema (strict: no unknown field) refuses."""
    problems = []
    for d in documents:
        try:
            kubernetes_validate.validate(d, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{_name(d)}: {e.message}")
    return problems


def variable_problems(documents: list[Document]) -> list[str]:
    """Variables that are not lakefold's settings (nor one of OTHER_VARIABLES), and $(NAME)
    references to a variable the container does not define before (Kubernetes leaves those as
    written)."""
    known = known_variables()
    problems = []
    for where, c in _containers(documents):
        defined: list[str] = []
        for name in _env_names(documents, c):
            if name.startswith(ENV_PREFIX) and name not in known:
                problems.append(f"{where}: {name} is not a lakefold setting")
            elif not name.startswith(ENV_PREFIX) and name not in OTHER_VARIABLES:
                problems.append(f"{where}: {name} is neither a lakefold setting nor one of "
                                "OTHER_VARIABLES")
        for e in c.get("env", []):
            for ref in _VARIABLE.findall(str(e.get("value", ""))):
                if ref not in defined:
                    problems.append(f"{where}: {e['name']} uses $({ref}), not defined before")
            defined.append(e["name"])
        for arg in [*c.get("command", []), *c.get("args", [])]:
            problems += [f"{where}: argument {arg!r} uses $({ref}), not defined in env"
                         for ref in _VARIABLE.findall(str(arg)) if ref not in defined]
    return problems


def setting_value_problems(documents: list[Document], monkeypatch: pytest.MonkeyPatch
                           ) -> list[str]:
    """LAKEFOLD_* values written in the manifests that lakefold's settings refuse (each read
    as the environment would give it, $(NAME) replaced by an address)."""
    problems = []
    for where, name, value in _literal_settings(documents):
        field = name.removeprefix(ENV_PREFIX).lower()
        if field not in Settings.model_fields:
            continue  # variable_problems reports it
        with monkeypatch.context() as env:
            for other in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
                env.delenv(other)
            env.setenv(name, _VARIABLE.sub("10.0.0.7", value))
            try:
                Settings()
            except ValueError as e:  # pydantic's ValidationError
                problems.append(f"{where}: {name}={value!r}: {e}")
    return problems


def reference_problems(documents: list[Document]) -> list[str]:
    """References to a Secret, ConfigMap, key or volume claim the manifests do not define."""
    secrets, maps = _defined(documents, "Secret"), _defined(documents, "ConfigMap")
    claims = {d["metadata"]["name"] for d in _of_kind(documents, "PersistentVolumeClaim")}
    problems = []
    for where, c in _containers(documents):
        for e in c.get("env", []):
            source = e.get("valueFrom", {})
            for kind, defined in (("secretKeyRef", secrets), ("configMapKeyRef", maps)):
                if kind in source:
                    ref = source[kind]
                    if ref["key"] not in defined.get(ref["name"], set()):
                        problems.append(f"{where}: {e['name']} reads key {ref['key']!r} of "
                                        f"{ref['name']!r}, which the manifests do not define")
        for source in c.get("envFrom", []):
            for kind, defined in (("secretRef", secrets), ("configMapRef", maps)):
                if kind in source and source[kind]["name"] not in defined:
                    problems.append(f"{where}: envFrom {source[kind]['name']!r} is not defined")
    for where, pod in _pods(documents):
        for volume in pod.get("volumes", []):
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim is not None and claim not in claims:
                problems.append(f"{where}: volume {volume['name']} claims {claim!r}, not defined")
        mounted = {v["name"] for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            problems += [f"{where}: mounts {m['name']!r}, not a volume of the pod"
                         for m in c.get("volumeMounts", []) if m["name"] not in mounted]
    return problems


def service_problems(documents: list[Document]) -> list[str]:
    """Deployments whose selector misses their own pods' labels; Services that select no
    Deployment's pods, or whose targetPort is no containerPort of them."""
    problems = []
    deployments = list(_of_kind(documents, "Deployment"))
    for d in deployments:
        labels = d["spec"]["template"]["metadata"].get("labels", {})
        if not d["spec"]["selector"]["matchLabels"].items() <= labels.items():
            problems.append(f"{_name(d)}: its selector does not match its pods' labels")
    for s in _of_kind(documents, "Service"):
        selector = s["spec"].get("selector", {})
        selected = [d for d in deployments if selector and selector.items()
                    <= d["spec"]["template"]["metadata"].get("labels", {}).items()]
        if not selected:
            problems.append(f"{_name(s)}: its selector {selector} matches no Deployment's pods")
            continue
        ports = {p.get(field) for d in selected for c in d["spec"]["template"]["spec"]
                 ["containers"] for p in c.get("ports", []) for field in ("name", "containerPort")}
        for port in s["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if target not in ports:
                problems.append(f"{_name(s)}: targetPort {target!r} is no containerPort of "
                                f"{', '.join(_name(d) for d in selected)}")
    return problems


def _lakefold_problem(argv: list[str]) -> str | None:
    """Why ``lakefold ARGV`` would not parse (an unknown command or option, a bad value),
    asked of lakefold's own command line in this process; None when it parses."""
    cmd: Any = command()
    ctx = typer.Context(cmd, info_name="lakefold")
    words = list(argv)
    path = ["lakefold"]
    while hasattr(cmd, "get_command") and words and not words[0].startswith("-"):
        sub = cmd.get_command(ctx, words[0])
        if sub is None:
            return f"`{' '.join(path)}` has no command {words[0]!r}"
        path.append(words.pop(0))
        cmd, ctx = sub, typer.Context(sub, info_name=path[-1], parent=ctx)
    if hasattr(cmd, "get_command"):
        return f"`{' '.join(path)}` is a group of commands, not a command"
    try:
        cmd.make_context(path[-1], words, parent=ctx.parent)
    except TyperException as e:
        return f"`{' '.join(path)}`: {e.format_message()}"
    return None


def command_problems(documents: list[Document]) -> list[str]:
    """Containers that run something other than a lakefold command that parses, or Spark's
    master or worker through the installed pyspark's `spark-class`."""
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    problems = []
    for where, c in _containers(documents):
        argv = [_VARIABLE.sub("10.0.0.7", str(a)) for a in [*c.get("command", []),
                                                            *c.get("args", [])]]
        if not argv:
            problems.append(f"{where}: no command (the image's default is not a service)")
        elif argv[0] == "lakefold":
            problem = _lakefold_problem(argv[1:])
            if problem:
                problems.append(f"{where}: {problem}")
        elif argv[0] == "spark-class":
            if not spark_class.is_file():
                problems.append(f"{where}: pyspark has no {spark_class}")
            if argv[1:2] == [] or argv[1] not in SPARK_CLASSES:
                problems.append(f"{where}: spark-class runs {argv[1:2]}, not a Spark master "
                                "or worker")
        else:
            problems.append(f"{where}: runs {argv[0]!r}, neither lakefold nor spark-class")
    return problems


def secret_literal_problems(documents: list[Document]) -> list[str]:
    """A secret written outside a Secret (a secret-ish variable's value, a ConfigMap key, a
    DSN or token option on a command line), and a Secret value that is not a marked
    placeholder (unless it is a setting whose type is not secret, e.g. the S3 region)."""
    problems = []
    for d in _of_kind(documents, "ConfigMap"):
        problems += [f"{_name(d)}: {key} is a secret; put it in a Secret"
                     for key in d.get("data") or {} if SECRETISH.search(key)]
    for where, c in _containers(documents):
        problems += [f"{where}: {e['name']} has a literal value; read it from a Secret"
                     for e in c.get("env", []) if "value" in e and SECRETISH.search(e["name"])]
        for arg in [*c.get("command", []), *c.get("args", [])]:
            if str(arg).split("=", 1)[0] in SECRET_OPTIONS:
                problems.append(f"{where}: {arg!r} puts a secret on the command line")
    not_secret = {ENV_PREFIX + name.upper() for name, field in Settings.model_fields.items()
                  if SecretStr not in getattr(field.annotation, "__args__", (field.annotation,))}
    for d in _of_kind(documents, "Secret"):
        for key, value in (d.get("stringData") or {}).items():
            if key not in not_secret and PLACEHOLDER not in str(value):
                problems.append(f"{_name(d)}: {key} is not a {PLACEHOLDER} placeholder")
        problems += [f"{_name(d)}: {key} holds data; templates use stringData placeholders"
                     for key in d.get("data") or {}]
    return problems


def single_pod_problems(documents: list[Document]) -> list[str]:
    """Capture and driver Deployments that could run two pods at once: replicas other than 1,
    or a rolling update (the new pod starts before the old one stops)."""
    problems = []
    for d in _of_kind(documents, "Deployment"):
        component = d["metadata"].get("labels", {}).get("app.kubernetes.io/component")
        if component not in SINGLE_POD_COMPONENTS:
            continue
        if d["spec"].get("replicas") != 1:
            problems.append(f"{_name(d)}: replicas {d['spec'].get('replicas')}, not 1")
        if d["spec"].get("strategy", {}).get("type") != "Recreate":
            problems.append(f"{_name(d)}: strategy is not Recreate")
    return problems


def hardening_problems(documents: list[Document]) -> list[str]:
    """Pods that may run as root, containers with a writable root file system, a way to gain
    privileges, or no requests and limits of CPU and memory."""
    problems = []
    for where, pod in _pods(documents):
        if pod.get("securityContext", {}).get("runAsNonRoot") is not True:
            problems.append(f"{where}: runAsNonRoot is not true")
    for where, c in _containers(documents):
        context = c.get("securityContext", {})
        if context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: the root file system is writable")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation is not false")
        for kind in ("requests", "limits"):
            missing = {"cpu", "memory"} - set(c.get("resources", {}).get(kind, {}))
            if missing:
                problems.append(f"{where}: no {kind} of {', '.join(sorted(missing))}")
    return problems


def image_problems(documents: list[Document]) -> list[str]:
    """Containers whose image is not the one kustomization.yaml's `images:` sets."""
    names = {i["name"] for i in _kustomization().get("images", [])}
    return [f"{where}: image {c.get('image')!r} is not set by kustomization.yaml"
            for where, c in _containers(documents) if c.get("image") not in names]


# ------------------------------------------------------------------ the tests

@pytest.fixture(scope="module")
def manifests() -> list[Document]:
    return load_manifests()


def _broken(documents: list[Document], name: str) -> tuple[list[Document], Document]:
    """A deep copy of the manifests, and in it the document ``Kind/name`` to break."""
    documents = copy.deepcopy(documents)
    return documents, next(d for d in documents if _name(d) == name)


def _container(document: Document) -> Document:
    """The first container of a Deployment (itself, to break it in place)."""
    container: Document = document["spec"]["template"]["spec"]["containers"][0]
    return container


CAPTURE = "Deployment/lakefold-capture-orders"
DRIVER = "Deployment/lakefold-driver"
CONSOLE = "Deployment/lakefold-console"


def test_kustomization_lists_every_manifest_and_the_image(manifests):
    listed = _kustomization()["resources"]
    on_disk = sorted(p.name for p in MANIFESTS.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk
    kinds = {d["kind"] for d in manifests}
    assert {"Namespace", "Secret", "ConfigMap", "PersistentVolumeClaim", "Deployment",
            "Service"} <= kinds
    assert image_problems(manifests) == []
    broken, driver = _broken(manifests, DRIVER)
    _container(driver)["image"] = "lakefold-typo"
    assert image_problems(broken) == [f"{DRIVER} container driver: image 'lakefold-typo' is "
                                      "not set by kustomization.yaml"]


def test_every_document_is_valid_for_the_pinned_kubernetes(manifests):
    assert schema_problems(manifests) == []
    broken, capture = _broken(manifests, CAPTURE)
    capture["spec"]["replica"] = capture["spec"].pop("replicas")  # a typo: unknown field
    _container(capture)["ports"] = [{"containerPort": "http"}]  # not an integer
    problems = schema_problems(broken)
    assert len(problems) == 1 and problems[0].startswith(CAPTURE), problems


def test_every_variable_is_a_lakefold_setting(manifests):
    assert variable_problems(manifests) == []
    broken, driver = _broken(manifests, DRIVER)
    env = _container(driver)["env"]
    env[1]["name"] = "LAKEFOLD_SPARK_MASTR"
    env.append({"name": "SPARK_MASTER", "value": "local[2]"})
    env.insert(0, {"name": "LAKEFOLD_SPARK_CONF", "value": '{"a": "$(POD_IPX)"}'})
    config = next(d for d in broken if d["kind"] == "ConfigMap")
    config["data"]["LAKEFOLD_LOGLEVEL"] = "INFO"
    problems = variable_problems(broken)
    assert any("LAKEFOLD_SPARK_MASTR is not a lakefold setting" in p for p in problems)
    assert any("SPARK_MASTER is neither" in p for p in problems)
    assert any("$(POD_IPX), not defined before" in p for p in problems)
    assert any("LAKEFOLD_LOGLEVEL is not a lakefold setting" in p for p in problems)


def test_every_written_setting_is_a_value_lakefold_accepts(manifests, monkeypatch):
    assert setting_value_problems(manifests, monkeypatch) == []
    broken, driver = _broken(manifests, DRIVER)
    conf = next(e for e in _container(driver)["env"] if e["name"] == "LAKEFOLD_SPARK_CONF")
    conf["value"] = "spark.driver.host=$(POD_IP)"  # not JSON: the setting is a mapping
    config = next(d for d in broken if d["kind"] == "ConfigMap")
    config["data"]["LAKEFOLD_LOG_LEVEL"] = "VERBOSE"
    problems = setting_value_problems(broken, monkeypatch)
    assert [p.split(":", 1)[0] for p in problems] == [
        "ConfigMap/lakefold-settings", f"{DRIVER} container driver"], problems


def test_every_secret_and_config_reference_is_defined(manifests):
    assert reference_problems(manifests) == []
    broken, capture = _broken(manifests, CAPTURE)
    dsn = _container(capture)["env"][0]["valueFrom"]["secretKeyRef"]
    dsn["key"] = "order"
    _container(capture)["envFrom"][1]["secretRef"]["name"] = "lakefold-stor"
    _container(capture)["volumeMounts"].append({"name": "cache", "mountPath": "/cache"})
    assert reference_problems(broken) == [
        f"{CAPTURE} container capture: LAKEFOLD_DSN reads key 'order' of 'lakefold-sources', "
        "which the manifests do not define",
        f"{CAPTURE} container capture: envFrom 'lakefold-stor' is not defined",
        f"{CAPTURE}: mounts 'cache', not a volume of the pod"]
    broken, driver = _broken(manifests, DRIVER)
    driver["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] = "x"
    assert reference_problems(broken) == [f"{DRIVER}: volume state claims 'x', not defined"]


def test_every_service_selects_pods_and_targets_their_port(manifests):
    assert service_problems(manifests) == []
    broken, service = _broken(manifests, "Service/lakefold-console")
    service["spec"]["ports"][0]["targetPort"] = "web"
    assert service_problems(broken) == [
        f"Service/lakefold-console: targetPort 'web' is no containerPort of {CONSOLE}"]
    broken, service = _broken(manifests, "Service/lakefold-spark-master")
    service["spec"]["selector"]["app.kubernetes.io/component"] = "spark"
    problems = service_problems(broken)
    assert len(problems) == 1 and "matches no Deployment's pods" in problems[0]
    broken, console = _broken(manifests, CONSOLE)
    console["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] = "ui"
    assert f"{CONSOLE}: its selector does not match its pods' labels" in service_problems(broken)


def test_every_command_is_a_lakefold_command_that_parses(manifests):
    assert command_problems(manifests) == []
    commands = {where: [*c["command"], *c.get("args", [])]
                for where, c in _containers(manifests)}
    assert [*commands[f"{CAPTURE} container capture"][:3]] == ["lakefold", "capture", "run"]
    assert commands[f"{DRIVER} container driver"] == ["lakefold", "run"]
    assert commands[f"{CONSOLE} container console"][:2] == ["lakefold", "console"]
    broken, capture = _broken(manifests, CAPTURE)
    _container(capture)["command"] = ["lakefold", "capture", "start"]
    broken_too, console = _broken(manifests, CONSOLE)
    _container(console)["args"][0] = "--bind=0.0.0.0"
    broken_three, master = _broken(manifests, "Deployment/lakefold-spark-master")
    _container(master)["command"] = ["spark-class", "org.apache.spark.deploy.Client"]
    assert command_problems(broken) == [
        f"{CAPTURE} container capture: `lakefold capture` has no command 'start'"]
    problems = command_problems(broken_too)
    assert len(problems) == 1 and "No such option: --bind" in problems[0], problems
    assert command_problems(broken_three) == [
        "Deployment/lakefold-spark-master container master: spark-class runs "
        "['org.apache.spark.deploy.Client'], not a Spark master or worker"]


def test_no_secret_is_written_outside_a_secret(manifests):
    assert secret_literal_problems(manifests) == []
    broken, driver = _broken(manifests, DRIVER)
    _container(driver)["env"].append(
        {"name": "LAKEFOLD_S3_SECRET_ACCESS_KEY", "value": "wJalrXUtnFEMI"})
    _container(driver)["args"] = ["--store-dsn=postgresql://u:p@db/x"]
    config = next(d for d in broken if d["kind"] == "ConfigMap")
    config["data"]["LAKEFOLD_STORE_DSN"] = "postgresql://u:p@db/x"
    store = next(d for d in broken if _name(d) == "Secret/lakefold-store")
    store["stringData"]["LAKEFOLD_STORE_DSN"] = "postgresql://lakefold:hunter2@db/lakefold"
    assert secret_literal_problems(broken) == [
        "ConfigMap/lakefold-settings: LAKEFOLD_STORE_DSN is a secret; put it in a Secret",
        f"{DRIVER} container driver: LAKEFOLD_S3_SECRET_ACCESS_KEY has a literal value; read "
        "it from a Secret",
        f"{DRIVER} container driver: '--store-dsn=postgresql://u:p@db/x' puts a secret on the "
        "command line",
        f"Secret/lakefold-store: LAKEFOLD_STORE_DSN is not a {PLACEHOLDER} placeholder"]


def test_captures_and_the_driver_run_one_pod_at_a_time(manifests):
    assert single_pod_problems(manifests) == []
    captures = [d for d in manifests if d["kind"] == "Deployment"
                and d["metadata"]["labels"]["app.kubernetes.io/component"] == "capture"]
    assert len(captures) >= 2  # one per source: the pattern is shown with two
    broken, capture = _broken(manifests, CAPTURE)
    capture["spec"]["replicas"] = 2
    capture["spec"]["strategy"] = {"type": "RollingUpdate"}
    assert single_pod_problems(broken) == [f"{CAPTURE}: replicas 2, not 1",
                                           f"{CAPTURE}: strategy is not Recreate"]


def test_every_pod_is_hardened_and_sized(manifests):
    assert hardening_problems(manifests) == []
    broken, console = _broken(manifests, CONSOLE)
    console["spec"]["template"]["spec"]["securityContext"].pop("runAsNonRoot")
    _container(console)["securityContext"]["readOnlyRootFilesystem"] = False
    _container(console)["resources"]["limits"].pop("memory")
    assert hardening_problems(broken) == [
        f"{CONSOLE}: runAsNonRoot is not true",
        f"{CONSOLE} container console: the root file system is writable",
        f"{CONSOLE} container console: no limits of memory"]


def readme_problems(readme: str) -> list[str]:
    """LAKEFOLD_* names the README gives that lakefold does not read (a family written with a
    star, ``LAKEFOLD_S3_*``, aside), and manifests it does not mention."""
    named = set(re.findall(r"\bLAKEFOLD_[A-Z0-9_]+\b(?!\*)", readme))
    problems = [f"README names {name}, not a lakefold setting"
                for name in sorted(named - known_variables())]
    return problems + [f"README does not mention `{name}`"
                       for name in _kustomization()["resources"] if f"`{name}`" not in readme]


def test_the_readme_names_only_real_settings_and_every_manifest():
    readme = (MANIFESTS / "README.md").read_text()
    assert readme_problems(readme) == []
    assert "LAKEFOLD_STORE_DSN" in readme and "kubectl -n lakefold port-forward" in readme
    broken = readme.replace("`spark.yaml`", "the Spark file") + "\nSet LAKEFOLD_S3_KEY.\n"
    assert readme_problems(broken) == ["README names LAKEFOLD_S3_KEY, not a lakefold setting",
                                       "README does not mention `spark.yaml`"]
