"""The CLI answers --help, and bad settings give one line saying what to fix, not a traceback."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lakefold.local import free_port
from tests.fixtures.postgres import TestDatabase

LAKEFOLD = str(Path(sys.executable).parent / "lakefold")


def _run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
         ) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    return subprocess.run([LAKEFOLD, *args], capture_output=True, text=True, timeout=120,
                          env=clean | (env or {}), cwd=cwd)


def test_help_lists_the_commands() -> None:
    out = _run("--help")
    assert out.returncode == 0
    for command in ("demo", "bench"):
        assert command in out.stdout


def test_misspelt_setting_warns_with_the_closest_name_and_does_not_fail(tmp_path: Path) -> None:
    out = _run("status", env={"LAKEFOLD_DNS": "host=x"}, cwd=tmp_path)
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[0].startswith("warning: ignored unknown setting LAKEFOLD_DNS: did you mean "
                               "LAKEFOLD_DSN?"), out.stderr
    # The command itself went on, and stopped at the first real problem: no store to talk to.
    assert out.returncode == 1
    assert lines[1].startswith("error: no store DSN: set LAKEFOLD_STORE_DSN"), out.stderr


def test_documented_and_unrelated_variables_never_stop_a_command(tmp_path: Path) -> None:
    env = {"LAKEFOLD_CLASS_ARCHIVE": "off", "LAKEFOLD_TEST_DSN": "host=nowhere",
           "LAKEFOLD_SOMETHING_ELSE": "1"}
    out = _run("run", "--help", env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    out = _run("status", env=env, cwd=tmp_path)
    assert "unknown setting LAKEFOLD_CLASS_ARCHIVE" not in out.stderr
    assert "unknown setting LAKEFOLD_TEST_DSN" not in out.stderr
    assert "warning: ignored unknown setting LAKEFOLD_SOMETHING_ELSE" in out.stderr
    assert "error: no store DSN" in out.stderr and out.returncode == 1


def test_unreachable_dsn_is_one_line_and_masks_the_password(tmp_path: Path) -> None:
    dsn = f"host=127.0.0.1 port={free_port()} user=app password=hunter2 connect_timeout=2"
    out = _run("demo", env={"LAKEFOLD_DSN": dsn}, cwd=tmp_path)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert "hunter2" not in out.stderr + out.stdout
    assert "cannot connect to PostgreSQL" in out.stderr
    assert "LAKEFOLD_DSN" in out.stderr


@pytest.mark.parametrize("command", [
    ["status"], ["dlq", "list"], ["capture", "run", "--schema", "public"],
    ["capture", "streams"], ["capture", "status"], ["capture", "read", "public.t"],
    ["events", "status"], ["demo"],
], ids=" ".join)
def test_unreachable_server_error_keeps_the_cause_on_one_line(tmp_path: Path,
                                                              command: list[str]) -> None:
    """Whatever the command, an unreachable server is one ``error:`` line that names the
    driver's cause (``Connection refused``), with the password masked, and nothing before it
    claims the command started."""
    dsn = f"host=127.0.0.1 port={free_port()} user=app password=hunter2 connect_timeout=2"
    out = _run(*command, env={"LAKEFOLD_DSN": dsn}, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert out.stdout == "", out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert "Connection refused" in lines[0]
    assert "hunter2" not in out.stderr


def test_capture_setup_error_is_not_preceded_by_a_running_message(pg: TestDatabase,
                                                                 tmp_path: Path) -> None:
    """A capture that cannot start (here: a table that does not exist) prints its error alone,
    not after a line that says it is capturing."""
    out = _run("capture", "run", "--table", "public.nowhere", "--until-current",
               env={"LAKEFOLD_DSN": pg.dsn}, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "capturing through slot" not in out.stdout
    assert out.stderr.startswith("error: ") and "nowhere" in out.stderr, out.stderr


def test_capture_run_again_captures_what_its_publication_covers(pg: TestDatabase,
                                                                tmp_path: Path) -> None:
    """A capture started again, as after a restart or a crash, needs no --table: it captures
    what its publication covers. A first start without --table or --schema is one line
    saying to pass one."""
    import psycopg

    env = {"LAKEFOLD_DSN": pg.dsn}
    first = _run("capture", "run", "--until-current", env=env, cwd=tmp_path)
    assert first.returncode == 1, first.stdout + first.stderr
    assert first.stderr.strip().splitlines() == [
        "error: say what to capture: publication 'lakefold' does not exist yet; pass --table "
        "schema.table (repeat for more) or --schema NAME"], first.stderr
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("CREATE TABLE other (id int PRIMARY KEY)")
        conn.execute("INSERT INTO items VALUES (1, 'a')")
    started = _run("capture", "run", "--table", "public.items", "--until-current", "--json",
                   env=env, cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO items VALUES (2, 'b')")
        conn.execute("INSERT INTO other VALUES (1)")
    again = _run("capture", "run", "--until-current", "--json", env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    with psycopg.connect(pg.dsn) as conn:
        stored = conn.execute(
            "SELECT s.name, c.op, c.after FROM lakefold.changelog c "
            "JOIN lakefold.changelog_streams s USING (stream_id) ORDER BY c.position").fetchall()
    # the insert after the first run's snapshot; nothing of the table outside the publication
    assert stored == [("public.items", "i", ["2", "b"])], stored
    assert json.loads(again.stdout)["records"] == 1


def _readme_default(variable: str) -> str:
    """The default column of ``variable``'s row in the settings table (docs/configuration.md,
    which README links to)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    (row,) = [line for line in page.splitlines() if line.startswith(f"| `{variable}` |")]
    return row.strip("| ").split(" | ")[-1]


def test_readme_defaults_say_only_the_demo_starts_local_servers(tmp_path: Path) -> None:
    """Without LAKEFOLD_DSN the commands other than the demo stop and name the variable to set;
    the settings table (docs/configuration.md) says so, and that the throwaway servers are the
    demo's."""
    for variable in ("LAKEFOLD_DSN", "LAKEFOLD_REDIS_URL"):
        default = _readme_default(variable)
        assert "required" in default and "`lakefold demo`" in default, default
    for command in (["status"], ["capture", "streams"], ["capture", "run", "--schema", "x"],
                    ["events", "status"]):
        out = _run(*command, cwd=tmp_path)
        assert out.returncode == 1
        assert out.stderr.startswith("error: no ") and "LAKEFOLD_DSN" in out.stderr, out.stderr
        assert not (tmp_path / ".lakefold").exists()  # no local server was started


def test_demo_help_describes_the_demo_it_runs() -> None:
    """``demo --help`` names each view the demo runs (every projection of
    lakefold/demo/projections.py), its rebuild and its check against the source."""
    from lakefold.projections import load_projections

    out = _run("demo", "--help", env={"COLUMNS": "300"})
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    names = [p.name for p in load_projections("lakefold.demo.projections")]
    assert len(names) == 4
    for name in names:
        assert name in text, (name, text)
    assert "rebuilds customer_cache" in text and "checks every view" in text
    _, first_line = _run("--help", env={"COLUMNS": "300"}).stdout.split("demo", 1)
    assert "four views" in first_line.splitlines()[0]
