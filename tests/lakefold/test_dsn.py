"""What is shown of a DSN is read the way libpq reads it: no password survives, whatever it holds
and whatever the DSN's form; a DSN libpq would split other than meant is refused in one line
that quotes none of it."""

import string
from urllib.parse import quote, unquote

import pytest
from hypothesis import example, given, strategies as st

from lakefold.core.dsn import DsnError, check_dsn, dsn_address, mask_dsn

# A password holds anything printable; a marker at both ends makes a leak of it unmistakable.
PASSWORDS = st.text(alphabet=string.printable.strip() + " äö€", min_size=1, max_size=30) \
    .map(lambda p: f"Zq{p}Zq")


def test_shows_where_never_the_password() -> None:
    assert mask_dsn("host=db user=app password=s3cret dbname=x") == (
        "host=db dbname=x user=app password=***")
    assert mask_dsn("postgresql://app:s3cret@db:5432/x") == (
        "host=db port=5432 dbname=x user=app password=***")
    assert mask_dsn("postgresql://app@db/x") == "host=db dbname=x user=app"
    assert mask_dsn("postgresql://db/x?user=a&password=s3cret&sslmode=off") == (
        "host=db dbname=x user=a password=***")
    assert mask_dsn(r"host=db password='se cr\'et' user=a") == "host=db user=a password=***"
    assert mask_dsn("host=db options='-c search_path=secret'") == "host=db"
    assert mask_dsn("redis://:s3cret@cache:6379/0") == "redis://***@cache:6379/0"
    assert dsn_address("postgresql://app:s3cret@db:5432/x") == "host db, port 5432, database x"


@pytest.mark.parametrize("dsn", [
    "postgresql://postgres:My?Secret@localhost:5432/db",   # libpq: password 'My?Secret'
    "postgresql://postgres:p@Zss@localhost/db",             # libpq: password 'p', host 'Zss@...'
    "postgresql://postgres:My/Secret@localhost/db",         # libpq: host 'postgres', port 'My'
    "postgresql://postgres:My#Secret@localhost/db",
])
def test_the_issues_uri_passwords_are_never_shown(dsn: str) -> None:
    secret = dsn.split("postgres:", 1)[1].rsplit("@", 1)[0]  # what its author meant
    pieces = {secret, *secret.replace("?", "@").replace("/", "@").replace("#", "@").split("@")}
    shown = mask_dsn(dsn) + dsn_address(dsn)
    assert not [p for p in pieces if len(p) > 1 and p in shown], shown
    try:
        check_dsn(dsn, what="LAKEFOLD_DSN")
    except DsnError as e:
        assert "LAKEFOLD_DSN is not a valid PostgreSQL DSN" in str(e)
        assert "percent-encode" in str(e)
        assert not [p for p in pieces if len(p) > 1 and p in str(e)], str(e)


def test_a_malformed_dsn_is_one_line_quoting_none_of_it() -> None:
    with pytest.raises(DsnError) as info:
        check_dsn("host=db password=se cret", what="LAKEFOLD_DSN")
    text = str(info.value)
    assert "\n" not in text and "cret" not in text
    assert text.startswith("LAKEFOLD_DSN is not a valid PostgreSQL DSN: it cannot be parsed")
    assert mask_dsn("host=db password=se cret") == "(a DSN that cannot be parsed)"


@given(PASSWORDS)
def test_no_password_survives_in_either_form(password: str) -> None:
    quoted = password.replace("\\", "\\\\").replace("'", "\\'")
    for dsn in (f"host=db user=app password='{quoted}' dbname=x",
                f"postgresql://app:{quote(password, safe='')}@db:5432/x",
                f"postgresql://db/x?password={quote(password, safe='')}"):
        assert check_dsn(dsn)["password"] == password
        assert password not in mask_dsn(dsn) and password not in dsn_address(dsn)


@given(PASSWORDS)
@example("Zq%01Zq")  # a %XX in it: libpq decodes it (found by hypothesis)
@example("Zq%80Zq")  # one that decodes to no UTF-8 text: psycopg raised (found by hypothesis)
def test_an_unencoded_uri_password_is_refused_or_kept_out(password: str) -> None:
    dsn = f"postgresql://app:{password}@db:5432/x"
    shown = mask_dsn(dsn) + " " + dsn_address(dsn)
    assert password not in shown
    try:
        fields = check_dsn(dsn)
    except DsnError as e:
        assert password not in str(e)
    else:  # accepted: libpq reads the whole password (decoding any %XX in it, as URIs do),
        # and the rest where it was written
        assert fields["password"] in (password, unquote(password)) and fields["host"] == "db"
