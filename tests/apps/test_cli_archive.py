"""``glyd compress | decompress | test`` (:mod:`glyd.apps.cli_archive`): arguments checked while parsing."""

from __future__ import annotations

import pytest

from glyd.cli import main


@pytest.mark.parametrize("command", [["compress", "x", "-o", "x.glyd"], ["decompress", "x.glyd"], ["test", "x.glyd"]])
@pytest.mark.parametrize("jobs", ["0", "-3", "two"])
def test_jobs_below_one_is_an_argument_error(command, jobs, capsys):
    # -j 0 silently meant "all cores" and -j -3 one thread
    with pytest.raises(SystemExit) as info:
        main([*command, "-j", jobs])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"glyd {command[0]}: error: argument --jobs/-j:") and repr(jobs) in err
