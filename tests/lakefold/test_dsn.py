"""Passwords never survive mask_dsn, whatever the DSN's form."""

import string

from hypothesis import given
from hypothesis import strategies as st

from lakefold.core.dsn import mask_dsn


def test_masks_keyword_and_uri_forms() -> None:
    assert mask_dsn("host=db user=app password=s3cret dbname=x") == (
        "host=db user=app password=*** dbname=x"
    )
    assert mask_dsn("postgresql://app:s3cret@db:5432/x") == "postgresql://app:***@db:5432/x"
    assert mask_dsn("postgresql://app@db/x") == "postgresql://app@db/x"
    assert mask_dsn("postgresql://db/x?user=a&password=s3cret&sslmode=off") == (
        "postgresql://db/x?user=a&password=***&sslmode=off"
    )
    assert mask_dsn(r"host=db password='se cr\'et' user=a") == "host=db password=*** user=a"
    assert mask_dsn("host=db user=app") == "host=db user=app"


@given(st.text(alphabet=string.ascii_letters + string.digits + "!#%^*()-_", min_size=4))
def test_no_password_survives(password: str) -> None:
    for dsn in (f"host=db user=app password='{password}'", f"postgresql://app:{password}@db/x"):
        assert password not in mask_dsn(dsn)
