"""The package-dir mapping works for both the editable install and a built wheel."""

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
    subprocess.run([str(uv), "build", "--wheel", "--quiet", "--out-dir", str(tmp_path / "dist"),
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
