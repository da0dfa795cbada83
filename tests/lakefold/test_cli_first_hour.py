"""The command line in a newcomer's first hour: every mistake is one line that says what was
wrong and what to do; reads write nothing; help reads as one style; names are never cut; a
log gets no progress bars; the console says where it reads, never the password."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

from lakefold.capture import ChangelogStore, slot_name_for
from lakefold.cli import command
from lakefold.cli._capture import resolve_slot
from lakefold.core.dsn import dsn_fields
from lakefold.local import free_port
from lakefold.projections import DeadLetters
from lakefold.projections.operations import Catalog, SinkRoots
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(300)

LAKEFOLD = str(Path(sys.executable).parent / "lakefold")
REPO = Path(__file__).resolve().parents[2]
PROJECTIONS = REPO / "tests" / "console" / "console_projections.py"


def _run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
         ) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    return subprocess.run([LAKEFOLD, *args], capture_output=True, text=True, timeout=240,
                          env=clean | (env or {}), cwd=cwd, check=False)


def _one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and out.stdout == "", out.stdout + out.stderr
    lines = [line for line in out.stderr.splitlines() if not line.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    return lines[0]


def _uri(dsn: str, password: str) -> str:
    fields = dsn_fields(dsn)
    return (f"postgresql://{fields['user']}:{password}@{fields['host']}:{fields['port']}/"
            f"{fields['dbname']}")


@pytest.mark.parametrize("command", [
    ["status"], ["capture", "status"], ["capture", "run", "--schema", "public"], ["console"],
    ["events", "status"], ["dlq", "list"],
], ids=" ".join)
def test_a_malformed_dsn_is_one_line_that_quotes_none_of_it(tmp_path: Path,
                                                            command: list[str]) -> None:
    line = _one_error_line(_run(*command, env={"LAKEFOLD_DSN": "host=db password=se cret"},
                                cwd=tmp_path))
    assert "LAKEFOLD_DSN is not a valid PostgreSQL DSN" in line and "cret" not in line


def test_a_dsn_option_is_checked_the_same_way(tmp_path: Path) -> None:
    line = _one_error_line(_run("capture", "status", "--dsn", "host=db password=se cret",
                                cwd=tmp_path))
    assert "--dsn is not a valid PostgreSQL DSN" in line and "cret" not in line
    line = _one_error_line(_run("capture", "streams", "--store-dsn",
                                "postgresql://app:p@Zss@db/x", cwd=tmp_path))
    assert "--store-dsn is not a valid PostgreSQL DSN" in line and "Zss" not in line
    assert "percent-encode" in line


def test_a_uri_password_with_a_question_mark_is_never_shown(tmp_path: Path) -> None:
    dsn = f"postgresql://postgres:My?Secret@127.0.0.1:{free_port()}/db?connect_timeout=2"
    for args in (["status"], ["capture", "status"], ["events", "status"]):
        line = _one_error_line(_run(*args, env={"LAKEFOLD_DSN": dsn}, cwd=tmp_path))
        assert "Secret" not in line and "Connection refused" in line, line
        assert "host=127.0.0.1" in line and "password=***" in line


def test_a_wrong_database_or_role_is_not_called_unreachable(pg: TestDatabase,
                                                           tmp_path: Path) -> None:
    fields = dsn_fields(pg.dsn)
    wrong_db = psycopg.conninfo.make_conninfo(**{**fields, "dbname": "no_such_db"})
    wrong_role = psycopg.conninfo.make_conninfo(**{**fields, "user": "no_such_role"})
    for dsn, cause in ((wrong_db, 'database "no_such_db" does not exist'),
                       (wrong_role, 'role "no_such_role" does not exist')):
        for args in (["status"], ["capture", "status"], ["run", "-p", str(PROJECTIONS)]):
            line = _one_error_line(_run(*args, env={"LAKEFOLD_DSN": dsn}, cwd=tmp_path))
            assert cause in line, (args, line)
            assert "check that PostgreSQL is running" not in line, (args, line)
        assert "refused this login: check the DSN's dbname, user and password" in line


def test_a_syntax_error_in_the_projections_file_names_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "shop_projections.py"
    bad.write_text("from lakefold.projections import projection\n\n\ndef broken(:\n    pass\n")
    line = _one_error_line(_run("run", "-p", str(bad), cwd=tmp_path))
    assert f"{bad}, line 4" in line and "invalid syntax" in line, line
    bad.write_text("import os\n\nVALUE = undefined_name + 1\n")
    line = _one_error_line(_run("rebuild", "x", "-p", str(bad), cwd=tmp_path))
    assert f"{bad}, line 3" in line and "NameError" in line, line


def test_unknown_names_are_answered_before_spark_starts(pg: TestDatabase,
                                                       tmp_path: Path) -> None:
    env = {"LAKEFOLD_DSN": pg.dsn, "LAKEFOLD_HOME": str(tmp_path / "home")}
    for args in (["run", "--only", "nope"], ["rebuild", "nope"]):
        line = _one_error_line(_run(*args, "-p", str(PROJECTIONS), env=env, cwd=tmp_path))
        assert "no projection or view named 'nope'" in line, line
        for name in ("customer_cache", "revenue", "customer_cities", "city_counts"):
            assert name in line  # the views too
    assert not (tmp_path / "home" / "logs" / "spark-driver.log").exists()  # no Spark


def _schema_exists(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT to_regnamespace('lakefold') IS NOT NULL").fetchone()
    return bool(row and row[0])


def test_reads_on_a_fresh_database_write_nothing(pg: TestDatabase, tmp_path: Path) -> None:
    env = {"LAKEFOLD_DSN": pg.dsn}
    for args in (["status"], ["status", "--json"], ["dlq", "list"]):
        out = _run(*args, env=env, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
    assert not _schema_exists(pg.dsn)


def test_capture_status_of_a_slot_that_is_not_there(pg: TestDatabase, tmp_path: Path) -> None:
    out = _run("capture", "status", "--slot", "nope", env={"LAKEFOLD_DSN": pg.dsn},
               cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "None" not in out.stdout and "slot nope: missing" in out.stdout, out.stdout
    assert "no slot 'nope': the capture has not been set up" in out.stdout


def test_capture_status_shows_only_this_databases_slot(pg: TestDatabase,
                                                       store_db: TestDatabase,
                                                       tmp_path: Path) -> None:
    """Slot names are per server: another database's slot ``lakefold`` is not this one's."""
    with psycopg.connect(store_db.dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('lakefold', 'pgoutput')")
    out = _run("capture", "status", "--slot", "lakefold", "--json",
               env={"LAKEFOLD_DSN": pg.dsn}, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert '"status": "missing"' in out.stdout and '"active": false' in out.stdout
    assert f"belongs to database '{store_db.name}'" in out.stdout
    default = _run("capture", "status", env={"LAKEFOLD_DSN": pg.dsn}, cwd=tmp_path)
    assert f"slot {slot_name_for(pg.name)}: missing" in default.stdout, default.stdout


def test_a_store_that_records_the_old_slot_name_keeps_it(pg: TestDatabase) -> None:
    assert resolve_slot(None, pg.dsn, None) == slot_name_for(pg.name)
    assert resolve_slot("mine", pg.dsn, None) == "mine"
    with ChangelogStore(pg.dsn) as store:
        store.install()
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO lakefold.capture_slots (slot_name, publication, "
                     "source_system_id, source_database) VALUES ('lakefold', 'lakefold', "
                     "'x', %s)", (pg.name,))
    assert resolve_slot(None, pg.dsn, None) == "lakefold"


def test_default_slot_names_do_not_collide() -> None:
    assert slot_name_for("shop") == "lakefold_shop"
    names = {slot_name_for(n) for n in ("Shop", "shop", "sh-op", "sh_op", "é" * 80, "e" * 80)}
    assert len(names) == 6
    assert all(len(n) <= 63 and n.replace("_", "").isalnum() and n.islower() for n in names)


def test_help_reads_as_one_style_and_there_is_a_version() -> None:
    root = command()
    runner = CliRunner()

    def walk(cmd: object, path: list[str]) -> list[list[str]]:
        found = [path]
        for name, sub in getattr(cmd, "commands", {}).items():
            found += walk(sub, [*path, name])
        return found

    paths = walk(root, [])
    assert len(paths) > 30
    for path in paths:
        result = runner.invoke(root, [*path, "--help"], prog_name="lakefold")
        assert result.exit_code == 0, (path, result.output)
        text = result.output
        for wrong in ("<bool>", "<list[", "<str>", "<int", "``"):
            assert wrong not in text, (path, wrong, text)
        arguments = text.splitlines()[0].split("[OPTIONS]", 1)[-1]
        assert arguments == arguments.upper(), (path, arguments)  # STREAM TYPE, not {stream}
    version = runner.invoke(root, ["--version"], prog_name="lakefold")
    assert version.exit_code == 0 and version.output.startswith("lakefold ")


def test_names_are_never_cut(pg: TestDatabase, tmp_path: Path) -> None:
    long = "lakefold_view_of_the_customers_with_their_orders_and_cities_as_of_commit_" \
           "version_two"
    with Catalog(pg.dsn, SinkRoots.under(tmp_path)) as catalog:
        catalog.install()  # as `lakefold run` does
        DeadLetters(catalog).install()
        for suffix in ("a", "b"):
            catalog.ensure(f"{long}_{suffix}", target_kind="delta", fingerprint="f",
                           keep_generations=1, definition={})
    out = _run("status", env={"LAKEFOLD_DSN": pg.dsn}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"{long}_a" in out.stdout and f"{long}_b" in out.stdout, out.stdout


def test_a_redirected_log_gets_one_line_per_table_not_bars(pg: TestDatabase,
                                                           tmp_path: Path) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        for table in ("customers", "orders"):
            conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(
                sql.Identifier(table)))
            conn.execute(sql.SQL("INSERT INTO {} SELECT i, 'v' FROM generate_series(1, 500) i"
                                 ).format(sql.Identifier(table)))
    out = _run("capture", "run", "--table", "public.customers", "--table", "public.orders",
               "--until-current", env={"LAKEFOLD_DSN": pg.dsn}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "━" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("snapshot of ")]
    assert sorted(line.split(":")[0] for line in lines) == [
        "snapshot of public.customers", "snapshot of public.orders"], out.stderr
    assert all(": 500 rows in " in line for line in lines)


def test_the_console_on_a_busy_port_is_one_line(pg: TestDatabase, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _run("console", "--port", str(port), env={"LAKEFOLD_DSN": pg.dsn}, cwd=tmp_path)
    line = _one_error_line(out)
    assert f"port {port} on 127.0.0.1 is taken" in line and "--port" in line


def test_the_console_banner_says_where_never_the_password(pg: TestDatabase,
                                                         tmp_path: Path) -> None:
    password = "My?Secret" + quote("/p@ss", safe="")  # libpq reads 'My?Secret/p@ss'
    dsn = _uri(pg.dsn, password)
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    console = subprocess.Popen(
        [LAKEFOLD, "console", "--port", str(port)], cwd=tmp_path, text=True,
        env=clean | {"LAKEFOLD_DSN": dsn}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert console.stderr is not None
        banner = console.stderr.readline()
    finally:
        console.send_signal(signal.SIGINT)
        rest = console.communicate(timeout=60)
    fields = dsn_fields(pg.dsn)
    assert f"http://localhost:{port}/" in banner, banner + rest[1]
    assert f"host {fields['host']}, port {fields['port']}, database {pg.name}" in banner
    assert "Secret" not in banner + rest[0] + rest[1] and "p@ss" not in banner + rest[1]


def test_the_readme_installs_the_event_store_before_appending() -> None:
    readme = (REPO / "README.md").read_text()
    using = readme.split("## A short tour", 1)[1].split("```", 2)[1]
    assert using.index("lakefold events install") < using.index("lakefold events append")
