"""The package-dir mapping works for both the editable install and a built wheel."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import lakefold

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ["capture", "eventstore", "projections", "spark", "schemas"]
_IMPORT_ALL = (
    "import importlib, json, lakefold\n"
    f"mods = {{n: importlib.import_module('lakefold.' + n) for n in {PACKAGES!r}}}\n"
    "print(json.dumps({n: m.__file__ for n, m in mods.items()} | {'lakefold': lakefold.__file__}))"
)


def test_editable_install_maps_top_level_folders() -> None:
    out = subprocess.run([sys.executable, "-c", _IMPORT_ALL], capture_output=True, text=True,
                         check=True, cwd="/")
    files = __import__("json").loads(out.stdout)
    for name in PACKAGES:
        assert Path(files[name]) == REPO / name / "__init__.py"
    assert Path(files["lakefold"]) == REPO / "lakefold" / "__init__.py"
    assert set(lakefold.__all__) == set(lakefold._EXPORTS)
    for name in lakefold.__all__:
        assert getattr(lakefold, name) is not None


@pytest.mark.timeout(240)
def test_wheel_installs_every_package_with_py_typed(tmp_path: Path) -> None:
    uv = Path(sys.executable).parent / "uv"
    subprocess.run([str(uv), "build", "--quiet", "--out-dir", str(tmp_path / "dist"),
                    str(REPO)], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("lakefold-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(uv), "pip", "install", "--quiet", "--no-deps", "--python", str(python),
                    str(wheel)], check=True, capture_output=True)
    # Dependencies come from the development environment; lakefold itself only from the wheel.
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    out = subprocess.run([str(python), "-c", _IMPORT_ALL], capture_output=True, text=True,
                         check=True, cwd="/")
    files = __import__("json").loads(out.stdout)
    for name in [*PACKAGES, "lakefold"]:
        installed = Path(files[name])
        assert installed.is_relative_to(site), f"{name} imported from {installed}"
        assert (installed.parent / "py.typed").exists()
    # the console's page ships inside the package (it is served offline, from the wheel)
    for page in ("index.html", "console.js", "charts.js", "console.css", "login.html"):
        assert (site / "lakefold" / "console" / "static" / page).exists(), page


def test_top_level_import_stays_cheap_and_exports_resolve_lazily() -> None:
    probe = (
        "import sys, lakefold\n"
        "before = {'pyspark', 'psycopg', 'pyarrow'} & set(sys.modules)\n"
        "store = lakefold.EventStore\n"
        "print(sorted(before), store.__module__, 'pyspark' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd="/")
    assert out.stdout.split() == ["[]", "lakefold.eventstore._store", "False"]


# Every module of the installed wheel (the benchmarks excepted: they need the dev extra).
_IMPORT_EVERY_MODULE = (
    "import importlib, pkgutil, lakefold\n"
    "names = sorted(m.name for m in pkgutil.walk_packages(lakefold.__path__, 'lakefold.')\n"
    "               if not m.name.startswith('lakefold._bench'))\n"
    "for name in names:\n"
    "    importlib.import_module(name)\n"
    "print(len(names))"
)


@pytest.mark.timeout(600)
def test_wheel_declared_dependencies_suffice_in_a_clean_venv(tmp_path: Path) -> None:
    """The built wheel, installed with only the dependencies it declares (pinned to the lock's
    versions) into an empty venv, imports every one of its modules and runs ``lakefold
    --help``: nothing may arrive only through the dev extra."""
    uv = Path(sys.executable).parent / "uv"
    subprocess.run([str(uv), "build", "--quiet", "--out-dir", str(tmp_path / "dist"),
                    str(REPO)], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("lakefold-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([str(uv), "venv", "--quiet", "--python", sys.executable, str(venv)],
                   check=True, capture_output=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(uv), "pip", "install", "--quiet", "--python", str(python),
         "--constraint", str(REPO / "requirements.lock"), str(wheel)],
        capture_output=True, text=True, timeout=540)
    assert install.returncode == 0, install.stderr
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LAKEFOLD_", "PYTHONPATH"))}
    out = subprocess.run([str(python), "-c", _IMPORT_EVERY_MODULE], capture_output=True,
                         text=True, cwd="/", env=env)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 100  # the packages' modules really were walked
    listed = subprocess.run([str(python), "-c", "import json, importlib.metadata as m; "
                             "print(json.dumps(m.distribution('lakefold').requires))"],
                            capture_output=True, text=True, check=True, cwd="/", env=env)
    assert any(r.startswith("psycopg-pool") for r in json.loads(listed.stdout))
    cli = subprocess.run([str(venv / "bin" / "lakefold"), "--help"], capture_output=True,
                         text=True, cwd=str(tmp_path), env=env)
    assert cli.returncode == 0, cli.stderr
    assert "demo" in cli.stdout and cli.stderr == ""
