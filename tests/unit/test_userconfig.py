"""The user's config file (scheduler/cli/userconfig.py): what ``gsched login`` writes is read back
without tomllib, and whatever that shortcut takes it reads as tomllib would; anything else goes to
tomllib, and a key or value the CLI cannot use is named."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.cli import userconfig
from scheduler.cli.userconfig import UserConfig, UserConfigError, plain_strings


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return tmp_path / "gsched" / "config.toml"


def test_what_login_writes_reads_back_without_tomllib(home: Path) -> None:
    userconfig.save(UserConfig(server="https://a.example:8470,https://b.example:8470", token="gsu_abc",
                               ca="/etc/gsched/ca é.pem"))
    assert plain_strings(home.read_text()) is not None
    back = userconfig.load()
    assert (back.server, back.read_token(), back.ca) == ("https://a.example:8470,https://b.example:8470", "gsu_abc",
                                                         "/etc/gsched/ca é.pem")


@pytest.mark.parametrize("text", [
    'server = "x\\ty"\n',                # an escape
    'server = "x"\nserver = "y"\n',      # a key twice: TOML refuses it
    'server = "x" # the lab\'s\n',       # a trailing comment
    "server = 'x'\n",                    # a literal string
    '"server" = "x"\n',                  # a quoted key
])
def test_anything_else_goes_to_tomllib(text: str) -> None:
    assert plain_strings(text) is None


def test_a_file_that_is_not_plain_is_still_read_or_named(home: Path) -> None:
    home.parent.mkdir(parents=True)
    home.write_text("server = 'http://x:1' # a literal string\n")
    assert userconfig.load().server == "http://x:1"
    home.write_text('server = "x"\nserver = "y"\n')
    with pytest.raises(UserConfigError, match="not valid TOML"):
        userconfig.load()
    home.write_text('sevrer = "x"\n')
    with pytest.raises(UserConfigError, match="unknown key 'sevrer'"):
        userconfig.load()


@given(st.lists(st.tuples(st.sampled_from(["server", "token", "ca", "x-y_1"]),
                          st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)),
                max_size=4),
       st.sampled_from(["", "# comment\n", "\n"]))
def test_the_shortcut_reads_as_tomllib_does(pairs: list[tuple[str, str]], prefix: str) -> None:
    text = prefix + "".join(f'{k} = "{v}"\n' for k, v in pairs)
    doc = plain_strings(text)
    if doc is not None:
        assert doc == tomllib.loads(text)
